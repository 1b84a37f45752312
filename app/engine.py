"""The inference engine: concurrent requests merged into batches, computed on one dedicated thread.

An /encode request arrives as an ``EncodeJob`` of raw texts. Each turn, the inference thread tokenises
every job that arrived since the last turn in one batch call, turning each text into an ``EncodeItem``
that carries its job (the request's future); it then takes pending items in arrival order until the
batch would pass the padded-token budget (rows × longest row) or the batch size, drops items whose
client has gone, runs one forward pass, and hands every job exactly its own rows. Other model work
(/attention, the warm-up) is a ``CallItem`` that runs alone, in its turn.

The encoder's fast path skips padding in everything but the attention core, so mixed lengths in one
pass cost little, and one pass per turn beats cutting a turn's texts into passes of similar lengths.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tokenizers import Encoding

from model import TextEncoder, TooManyTokensError
from model.pooling import Pooling, pool

logger = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), which hands freed heap memory back to the system; None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


MALLOC_TRIM = _malloc_trim()
TRIM_INTERVAL_S = 2.0  # at most this often, and only when the queue has just emptied


@dataclass
class Timing:
    """Where one request's time went: waiting for the inference thread, then computing."""

    queue_s: float = 0.0
    inference_s: float = 0.0


class Job:
    """One request's share of the work: its future, resolved on the event loop once every item is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n_items: int, timing: Timing | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.results: list[Any] = [None] * n_items
        self.remaining = n_items
        self.encodings: list[Encoding] = []  # an encode job's texts, tokenised on the inference thread
        self.timing = timing
        self.submitted = time.perf_counter()
        self.started: float | None = None  # when its first text began computing

    def start(self, now: float) -> None:
        """Called on the inference thread when work of this job begins."""
        if self.started is None:
            self.started = now

    def gone(self) -> bool:
        """The request was cancelled (its client disconnected) or already failed."""
        return self.future.done()

    def set(self, index: int, value: Any) -> None:
        """Called on the inference thread."""
        self.results[index] = value
        self.remaining -= 1
        if self.remaining == 0:
            if self.timing is not None and self.started is not None:
                self.timing.queue_s = self.started - self.submitted
                self.timing.inference_s = time.perf_counter() - self.started
            self.loop.call_soon_threadsafe(_resolve, self.future, self.results)

    def fail(self, error: BaseException) -> None:
        """Called on the inference thread."""
        self.loop.call_soon_threadsafe(_reject, self.future, error)


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _reject(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


@dataclass(frozen=True)
class EncodeOptions:
    n_layers: int  # hidden state to pool: 0 = embeddings, N = last layer
    pooling: Pooling
    normalize: bool
    token_vectors: bool  # also return the per-token vectors


@dataclass(eq=False)
class EncodeItem:
    job: Job
    index: int  # position of the text in its request
    encoding: Encoding
    length: int
    options: EncodeOptions


@dataclass(eq=False)
class EncodeJob:
    job: Job
    texts: Sequence[str]
    truncate: bool
    options: EncodeOptions


@dataclass(eq=False)
class CallItem:
    job: Job
    function: Callable[[], Any]


@dataclass
class EngineStats:
    batches: int = 0  # forward passes of /encode work
    batched_texts: int = 0  # texts computed in them
    padded_tokens: int = 0  # rows × longest row, summed over batches
    real_tokens: int = 0
    dropped_texts: int = 0  # texts dropped because their client had gone
    largest_batch: int = 0
    largest_padded_tokens: int = 0
    compute_seconds: float = 0.0  # time spent in forward passes of /encode work
    batch_sizes: list[int] = field(default_factory=list)  # the most recent batch sizes (for tests and metrics)


@dataclass
class EncodeResult:
    embedding: np.ndarray  # (D,) float32
    token_vectors: np.ndarray | None  # (T, D) float32, real tokens only


class Engine:
    """A queue of model work and the one thread that does it."""

    def __init__(
        self,
        model: TextEncoder,
        max_batch_tokens: int = 16384,
        max_batch_size: int = 256,
        max_wait: float = 0.0,
        on_batch: Callable[[int, int, float], None] | None = None,  # (texts, real tokens, seconds) per pass
        on_drop: Callable[[int], None] | None = None,  # (texts) dropped because their request was gone
    ) -> None:
        self.model = model
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.stats = EngineStats()
        self._arrived: list[EncodeJob] = []  # encode jobs not tokenised yet
        self._pending: deque[EncodeItem | CallItem] = deque()
        self._condition = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="inference", daemon=True)
        self._thread.start()

    # ---- the event loop's side ----

    async def encode(
        self, texts: Sequence[str], options: EncodeOptions, truncate: bool = True, timing: Timing | None = None
    ) -> tuple[list[Encoding], list[EncodeResult]]:
        """Tokens and sentence (optionally token) vectors for a request's texts, in the request's order.

        Raises TooManyTokensError for a text that is too long when ``truncate`` is false.
        """
        job = Job(asyncio.get_running_loop(), len(texts), timing)
        with self._condition:
            if self._stopping:
                raise RuntimeError("the engine is stopped")
            self._arrived.append(EncodeJob(job, texts, truncate, options))
            self._condition.notify()
        results = await job.future
        return job.encodings, results

    async def call(self, function: Callable[[], Any], timing: Timing | None = None) -> Any:
        """Run ``function()`` on the inference thread, alone, in its turn."""
        job = Job(asyncio.get_running_loop(), 1, timing)
        self._submit([CallItem(job, function)])
        return (await job.future)[0]

    def _submit(self, items: Sequence[EncodeItem | CallItem]) -> None:
        with self._condition:
            if self._stopping:
                raise RuntimeError("the engine is stopped")
            self._pending.extend(items)
            self._condition.notify()

    def pending(self) -> int:
        """Texts and calls waiting for the inference thread."""
        return len(self._pending) + sum(len(j.texts) for j in self._arrived)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish what is queued, then end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)
        stats = self.stats
        if stats.batches:
            logger.info(
                "engine stopped: %d texts in %d forward passes (%.1f a pass), %.0f%% of computed tokens were "
                "padding, %d texts dropped for clients gone",
                stats.batched_texts, stats.batches, stats.batched_texts / stats.batches,
                100 * (1 - stats.real_tokens / max(stats.padded_tokens, 1)), stats.dropped_texts,
            )

    # ---- the inference thread's side ----

    def _work(self) -> None:
        torch.set_grad_enabled(False)
        worked, last_trim = False, 0.0  # work done since memory was last handed back, and when that was
        while True:
            trim = False
            with self._condition:
                while not self._pending and not self._arrived and not self._stopping:
                    if worked and MALLOC_TRIM is not None:
                        left = last_trim + TRIM_INTERVAL_S - time.monotonic()
                        if left <= 0:
                            trim = True
                            break
                        self._condition.wait(left)
                    else:
                        self._condition.wait()
                if not trim:
                    if not self._pending and not self._arrived:
                        return  # stopping, and nothing is left
                    if self.max_wait > 0:
                        self._linger()
                    arrived, self._arrived = self._arrived, []
            if trim:
                # The queue has emptied: hand the memory its batches took back to the system, so that
                # resident memory returns towards its baseline after load instead of staying at the peak.
                MALLOC_TRIM()
                worked, last_trim = False, time.monotonic()
                continue
            worked = True
            if arrived:
                try:
                    items = self._tokenize(arrived)
                except BaseException as error:  # the thread must outlive any one request
                    logger.exception("tokenising %d requests failed", len(arrived))
                    for job in arrived:
                        job.job.fail(error)
                    items = []
                with self._condition:
                    self._pending.extend(items)
            with self._condition:
                work = self._take() if self._pending else []
            if not work:
                continue
            if isinstance(work[0], CallItem):
                self._run_call(work[0])
            else:
                self._run_encode(work)  # type: ignore[arg-type]

    def _linger(self) -> None:
        """Wait up to ``max_wait`` for more texts while the batch has room (condition held)."""
        deadline = time.monotonic() + self.max_wait
        while self.pending() < self.max_batch_size and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0 or (self._pending and isinstance(self._pending[0], CallItem)):
                return
            self._condition.wait(left)

    def _tokenize(self, jobs: list[EncodeJob]) -> list[EncodeItem]:
        """Every newly arrived text in one batch call per truncation mode; items in arrival order."""
        tokenizer = self.model.tokenizer
        live = [j for j in jobs if not j.job.gone()]
        self._dropped(sum(len(j.texts) for j in jobs if j.job.gone()))
        items: list[EncodeItem] = []
        for truncate in (True, False):
            group = [j for j in live if j.truncate is truncate]
            if not group:
                continue
            texts = [text for j in group for text in j.texts]
            try:
                encodings = tokenizer.encode(texts, truncate=truncate)
            except TooManyTokensError:
                encodings = None  # find which job it was: each one alone
            start = 0
            for j in group:
                if encodings is not None:
                    j.job.encodings = encodings[start:start + len(j.texts)]
                    start += len(j.texts)
                else:
                    try:
                        j.job.encodings = tokenizer.encode(j.texts, truncate=truncate)
                    except TooManyTokensError as error:
                        j.job.fail(error)
                        continue
                items.extend(
                    EncodeItem(j.job, i, e, len(e.ids), j.options) for i, e in enumerate(j.job.encodings)
                )
        # arrival order across jobs, as the jobs came
        order = {id(j.job): n for n, j in enumerate(jobs)}
        items.sort(key=lambda item: order[id(item.job)])
        return items

    def _take(self) -> list[EncodeItem | CallItem]:
        """The next unit of work (condition held): one call, or encode items up to the batch limits."""
        if isinstance(self._pending[0], CallItem):
            return [self._pending.popleft()]
        batch: list[EncodeItem | CallItem] = []
        longest = 0
        while self._pending and len(batch) < self.max_batch_size:
            item = self._pending[0]
            if isinstance(item, CallItem):
                break
            if item.job.gone():
                self._pending.popleft()
                self._dropped(1)
                continue
            longest_with = max(longest, item.length)
            if batch and longest_with * (len(batch) + 1) > self.max_batch_tokens:
                break
            batch.append(self._pending.popleft())
            longest = longest_with
        return batch

    def _dropped(self, n: int) -> None:
        if n:
            self.stats.dropped_texts += n
            if self.on_drop is not None:
                self.on_drop(n)

    def _run_call(self, item: CallItem) -> None:
        if item.job.gone():
            return
        item.job.start(time.perf_counter())
        try:
            item.job.set(0, item.function())
        except BaseException as error:  # handed to the request that asked
            item.job.fail(error)

    def _run_encode(self, items: list[EncodeItem]) -> None:
        started = time.perf_counter()
        for item in items:
            item.job.start(started)
        try:
            results = self._compute(items)
        except BaseException as error:
            logger.exception("a batch of %d texts failed", len(items))
            for job in {id(item.job): item.job for item in items}.values():
                job.fail(error)
            return
        seconds = time.perf_counter() - started
        self.stats.compute_seconds += seconds
        if self.on_batch is not None:
            self.on_batch(len(items), sum(item.length for item in items), seconds)
        for item, result in zip(items, results):
            item.job.set(item.index, result)

    def _compute(self, items: list[EncodeItem]) -> list[EncodeResult]:
        model = self.model
        batch = model.tokenizer.pad([item.encoding for item in items])
        self._count(batch.input_ids.shape, batch.n_tokens)
        input_ids, attention_mask, token_type_ids = model.to_tensors(batch)
        depth = max(item.options.n_layers for item in items)
        mixed_depths = any(item.options.n_layers != depth for item in items)
        with torch.inference_mode():
            output = model.encoder(
                input_ids, attention_mask, token_type_ids, return_hidden_states=mixed_depths, n_layers=depth
            )
            # One pooling per distinct (depth, pooling) in the batch, applied to every row at once.
            pooled: dict[tuple[int, str], np.ndarray] = {}
            hidden_np: dict[int, np.ndarray] = {}
            for n_layers, pooling in {(i.options.n_layers, i.options.pooling) for i in items}:
                hidden = (output.hidden_states[n_layers] if mixed_depths else output.last_hidden_state).float()
                pooled[n_layers, pooling] = pool(hidden, attention_mask, pooling).cpu().numpy()
            for n_layers in {i.options.n_layers for i in items if i.options.token_vectors}:
                hidden = output.hidden_states[n_layers] if mixed_depths else output.last_hidden_state
                hidden_np[n_layers] = hidden.float().cpu().numpy()

        results = []
        for row, item in enumerate(items):
            options = item.options
            vector = pooled[options.n_layers, options.pooling][row]
            if options.normalize:
                vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            tokens = hidden_np[options.n_layers][row, : item.length] if options.token_vectors else None
            results.append(EncodeResult(vector, tokens))
        return results

    def _count(self, shape: tuple[int, ...], real_tokens: int) -> None:
        rows, longest = shape
        stats = self.stats
        stats.batches += 1
        stats.batched_texts += rows
        stats.padded_tokens += rows * longest
        stats.real_tokens += real_tokens
        stats.largest_batch = max(stats.largest_batch, rows)
        stats.largest_padded_tokens = max(stats.largest_padded_tokens, rows * longest)
        stats.batch_sizes.append(rows)
        del stats.batch_sizes[:-1000]
