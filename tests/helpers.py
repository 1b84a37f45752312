"""Helpers shared by the tests: tiny models, the app in-process, the service as a process, assertions."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from app.engine.admission import Admission
from app.engine.messages import Task
from app.engine.work_queue import WorkQueue
from app.engine.worker import Computing, Worker
from app.main import create_app
from app.serving.registry import ServedModel
from app.settings import Settings
from model import PositionQuery, TextEncoder, tasks
from model.runtime.loader import cpu_bfloat16

# bfloat16 on a CPU needs AVX512-BF16 or AMX: elsewhere the service refuses it at start (tests/model/test_openvino.py
# tests the refusal on every CPU), so the tests that compute in it there run only where the CPU has it.
needs_cpu_bfloat16 = pytest.mark.skipif(not cpu_bfloat16(), reason="this CPU has neither AVX512-BF16 nor AMX")

# ---- tiny random-weight models ----

TINY_WORDS = (
    "the quick brown fox jumps over lazy dog a cat sat on mat hello world attention is all you need "
    "what does this head look at token embedding layer norm model"
).split()
TINY_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
}


def tiny_tokenizer() -> Tokenizer:
    """A BERT-style WordPiece tokenizer over a few dozen words, letters and suffix pieces."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = TINY_SPECIALS + TINY_WORDS + letters + [f"##{c}" for c in letters] + list(".,!?")
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


class RecordingPass:
    """A pass backend that records the batches it is given and answers each token with its own id, (B, T, 4):
    for the backends that reshape a batch around another (model/runtime/backends.py)."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        self.seen.append((input_ids, attention_mask, token_type_ids))
        return input_ids.float().unsqueeze(-1).expand(-1, -1, 4)  # (B, T, 4)


def write_tiny_model(directory: Path, seed: int = 0, head: str | None = None, **config_overrides: object) -> Path:
    """A random-weight BERT in Hugging Face layout: config.json, model.safetensors, tokenizer.json.

    With ``head="sequence-classification"`` a BertForSequenceClassification (``num_labels`` labels).
    """
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    config: dict[str, Any] = {**TINY_CONFIG, "vocab_size": tokenizer.get_vocab_size(), **config_overrides}
    torch.manual_seed(seed)
    bert: torch.nn.Module
    if head == "sequence-classification":
        n = int(config.pop("num_labels", 2))
        config |= {
            "architectures": ["BertForSequenceClassification"],
            "id2label": {str(i): f"LABEL_{i}" for i in range(n)},
            "label2id": {f"LABEL_{i}": i for i in range(n)},
        }
        bert = BertForSequenceClassification(BertConfig(**config))
    else:
        bert = BertModel(BertConfig(**config), add_pooling_layer=True)
    with torch.no_grad():
        for parameter in bert.parameters():  # not the initialiser's ones and zeros: every weight matters
            parameter.normal_(0.0, 0.5)
    bert.save_pretrained(directory, safe_serialization=True)
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer.save(str(directory / "tokenizer.json"))
    if head is not None:  # so that transformers' AutoTokenizer (and CrossEncoder) can load it too
        specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 64,
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],  # segments, as BERT takes them
            **specials,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory


def hf_forward(bert, batch, **outputs: bool):
    """transformers' BertModel on one of our padded batches (numpy arrays), without gradients."""
    with torch.inference_mode():
        return bert(
            input_ids=torch.from_numpy(batch.input_ids),
            attention_mask=torch.from_numpy(batch.attention_mask),
            token_type_ids=torch.from_numpy(batch.token_type_ids),
            **outputs,
        )


# ---- the app in-process, over httpx.ASGITransport ----


@dataclass
class Service:
    """A running app and a client talking to it; its parts through the app's public state."""

    app: FastAPI
    client: httpx.AsyncClient

    @property
    def model(self) -> ServedModel:
        """The default served model: its queue, worker and tokenisation."""
        return self.app.state.registry.default

    @property
    def admission(self) -> Admission:
        return self.app.state.responder.admission


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``condition()`` until true; fail (never hang) after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the condition"
        await asyncio.sleep(0.005)


async def wait_until_ready(client: httpx.AsyncClient, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await client.get("/health")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline, "the service did not become ready"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def serving(
    settings: Settings | None = None, model: TextEncoder | None = None, ready: bool = True, **app_options: object
) -> AsyncIterator[Service]:
    """A fresh app with its lifespan started (and, with ``ready``, its model loaded) and a client."""
    models = None if model is None else {model.card.name: model}
    app = create_app(settings or Settings(), models, **app_options)  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            if ready:
                await wait_until_ready(client)
            yield Service(app, client)


@asynccontextmanager
async def serve(
    settings: Settings | None = None, model: TextEncoder | None = None, ready: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    """As ``serving``, for tests that only need the client."""
    async with serving(settings, model, ready) as service:
        yield service.client


def metric(text: str, name: str, default: float | None = None, /, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (``default`` when it is absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == want:
            return float(match.group(2))
    if default is not None:
        return default
    raise AssertionError(f"no sample {name}{{{want}}}")


@dataclass(frozen=True)
class Passes:
    """The forward passes a service has counted (/metrics' encoder_batch_texts): how many, their texts, and how
    many had at most ``n`` texts (``at_most[n]``, for n of the histogram's buckets)."""

    count: float
    texts: float
    at_most: dict[int, float]

    def __sub__(self, before: Passes) -> Passes:
        return Passes(
            self.count - before.count,
            self.texts - before.texts,
            {n: v - before.at_most.get(n, 0) for n, v in self.at_most.items()},
        )

    def all_of(self, size: int) -> bool:
        """Every pass had ``size`` texts (size one of the buckets: 1, 2, 4, 8, 16, ...)."""
        below = max((n for n in self.at_most if n < size), default=None)
        return (
            self.texts == self.count * size
            and self.at_most[size] == self.count
            and (below is None or self.at_most[below] == 0)
        )


async def passes(client: httpx.AsyncClient) -> Passes:
    """What /metrics says of the forward passes so far."""
    text = (await client.get("/metrics")).text
    at_most = {
        int(float(m.group(1))): float(m.group(2))
        for m in re.finditer(r'^encoder_batch_texts_bucket\{le="([0-9.]+)"\} (\S+)$', text, re.M)
    }
    return Passes(metric(text, "encoder_batch_texts_count"), metric(text, "encoder_batch_texts_sum"), at_most)


async def until_metric(
    client: httpx.AsyncClient, name: str, condition: Callable[[float], bool], timeout: float = 30.0, **labels: str
) -> None:
    """Poll /metrics until ``condition`` holds for one sample; fail (never hang) after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition(metric((await client.get("/metrics")).text, name, 0, **labels)):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {name}"
        await asyncio.sleep(0.005)


def assert_error(
    response: httpx.Response, status: int, type_: str, param: str | None = None, contains: str = ""
) -> dict:
    """The response is the API.md error envelope with this status, type and param."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param"}, body
    assert body["error"]["type"] == type_, body
    assert body["error"]["param"] == param, body
    assert contains in body["error"]["message"], body
    return body["error"]


# ---- the service as its own process, on 127.0.0.1 ----

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    env: dict[str, str] | None = None, timeout: float = 120.0, port: int | None = None, supervised: bool = False
) -> tuple[subprocess.Popen, str]:
    """Start the service with extra environment variables; return it and its URL once /health is 200.

    On a free port unless ``port`` is given (a replica started again where a load balancer expects it).
    Its output goes to a file (``server_log(process)``), never a pipe: a pipe nobody reads fills up and
    blocks the server at its next log line. It runs on the CPU in float32 unless ``env`` says otherwise, also where
    a GPU or AMX is present: these tests check float32's numbers and a CPU's timing (the GPU's own:
    tests/app/test_gpu.py). ``supervised``: as ``python -m app.serve`` (ENCODER_WORKERS front ends and an engine).
    """
    port = port or free_port()
    log = tempfile.NamedTemporaryFile(prefix="encoder-service-", suffix=".log", delete=False)
    server = ["app.serve"] if supervised else ["uvicorn", "--factory", "app.main:create_app"]
    process = subprocess.Popen(
        [sys.executable, "-m", *server, "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu", "ENCODER_DTYPE": "float32", **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process.log_path = Path(log.name)  # type: ignore[attr-defined]
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the service exited during start-up: {server_log(process)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("uvicorn did not become ready")
        time.sleep(0.1)


def server_log(process: subprocess.Popen) -> str:
    return process.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def rss_mib(process: subprocess.Popen) -> float:
    """Resident memory of a process, in MiB."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextmanager
def running_server(env: dict[str, str] | None = None, timeout: float = 120.0) -> Iterator[str]:
    """The service in its own process for the duration of the block; yields its base URL."""
    process, url = start_server(env, timeout)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def local_queue(served: ServedModel) -> WorkQueue:
    """The queue of a model computed in this process (not a front end's way to an engine)."""
    assert isinstance(served.queue, Computing), "the model is computed in another process"
    return served.queue.queue


@asynccontextmanager
async def busy(served: ServedModel) -> AsyncIterator[None]:
    """Every inference thread of a model computed in this process busy with another task until the block ends, as
    behind long passes under load: what is sent meanwhile waits in the queue, then is computed as it would be. The
    other tasks are position tables (no texts, no pass in the metrics), one an inference thread, held inside their
    pass (model/runtime/tasks.py) until the block ends."""
    queue = local_queue(served)
    release = threading.Event()
    started: list[None] = []

    def held(loaded: object, query: object) -> None:
        started.append(None)
        release.wait(60)

    tables = [Task("positions", [], PositionQuery("sinusoidal", 1, 2)) for _ in range(queue.lanes)]
    computed = tasks.position_encoding
    others: list[asyncio.Future[Any]] = []
    try:
        tasks.position_encoding = held  # type: ignore[assignment]  # every model's, while the block lasts
        others = [asyncio.ensure_future(queue.run(table)) for table in tables]
        # each inference thread took one and cannot take anything else until it is done (held here, or waiting for
        # a compute lane that one holds)
        await wait_until(lambda: bool(started) and queue.pending() == 0)
        yield
    finally:
        release.set()
        try:
            await asyncio.gather(*others)  # one may still be waiting for a lane: it too runs the held pass
        finally:
            tasks.position_encoding = computed


def standing_in(stand_in: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pass of model/runtime/tasks.py that ``stand_in`` has a method of the same name for computed by that method
    (given the loaded model and the pass's arguments) until the test ends: passes that fail, wait or record, for the
    engine's tests."""
    for name, value in vars(type(stand_in)).items():
        function = getattr(tasks, name, None)
        if callable(value) and callable(function) and getattr(function, "__module__", None) == tasks.__name__:
            monkeypatch.setattr(tasks, name, getattr(stand_in, name))


def local_worker(served: ServedModel) -> Worker:
    """The inference threads of a model computed in this process."""
    assert isinstance(served.queue, Computing), "the model is computed in another process"
    return served.queue.worker


def local_model(served: ServedModel) -> TextEncoder:
    """The loaded model, where this process computes it."""
    assert isinstance(served.queue, Computing), "the model is computed in another process"
    return served.queue.model


def conforms(operations: list[Any], mode: Any, base_url: str, checks: list[Any], examples: int) -> None:
    """schemathesis' generated requests (valid, or with ``mode`` NEGATIVE invalid) to each OpenAPI operation at
    ``base_url``, every answer held to ``checks``; an operation with no input has nothing to make invalid."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not (len(operation.body) or len(operation.query)):
            continue  # /info, /health: no input to make invalid

        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case: Any) -> None:
            response = case.call(base_url=base_url, timeout=60)
            case.validate_response(response, checks=checks)

        check()


def with_triton(script: str, *args: str, interpret: bool) -> tuple[Any, str]:
    """Run ``script`` in a process of its own that imports Triton from the folder make install-dev puts it in
    (TRITON_SITE; not the suite's own environment, where transformers would import it in every test), with
    Triton's interpreter on for CPU tensors where ``interpret``: what it prints last, as JSON, and its stderr."""
    site = Path(os.environ.get("TRITON_SITE") or Path(sys.prefix) / "triton-site").resolve()
    assert (site / "triton").is_dir(), f"no Triton in {site}: make install-dev installs it there"
    path = os.pathsep.join(filter(None, [str(ROOT), str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, **({"TRITON_INTERPRET": "1"} if interpret else {})}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
