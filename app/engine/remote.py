"""The engine: one process that owns the models, their queues, batching and passes, and the front ends' way to it.

Front-end processes (HTTP, validation, tokenisation, serialisation; no weights) send it tasks (app/engine/messages.py)
over a Unix socket and await the answers; the engine runs each through the served model's queue exactly as a
single process does. Each message is one frame of app/engine/wire.py: a pickle whose arrays travel beside it, a large
answer read straight into its own memory. A Unix stream costs half the CPU a round trip of the best zmq variant
measured (docs/benchmarks/host-path.md, "How a task crosses between processes: four transports (CPU)").

Messages, front end to engine: ``("task", id, model, task, seconds its request has left[, span])``, the span (trace
id, span id, flags) where the request is traced (app/tracing.py), ``("cancel", id)``
(its client left or its deadline passed: the engine drops its texts unseen), ``("describe", id)`` (each model's
facts). Engine to front end: ``(id, "ok", result, (queue s, inference s))`` or ``(id, "error", error)``, the
EngineError itself (app/engine/errors.py).

When the engine process dies, every front end sees its connection end: whatever it was waiting for is
answered 503 ``not_ready`` at once, and /health says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app import tracing
from app.engine.admission import Admission
from app.engine.errors import ComputeFailed, DeadlinePassed, EngineError, EngineStopped
from app.engine.interface import Models
from app.engine.messages import REQUEST_TIMING, ModelFacts, Task, TaskKind, Timing
from app.engine.wire import FrameReader
from app.metrics import Metrics
from model import EmbeddedTexts, PackedTokens, ScoredTexts, TokenIds

logger = logging.getLogger(__name__)


# A task of fewer texts, or an answer of fewer rows, crosses as a list: packing costs more than it saves
PACK_AT = 4


def wire_task(task: Task) -> Task:
    """The task with its texts as bare token ids (tokenizers' Encoding objects carry offsets and strings the engine
    does not need), packed in three arrays where there are several: a list costs a pickled object a text."""
    if len(task.texts) >= PACK_AT:
        return Task(task.kind, PackedTokens.of(task.texts), task.options)
    return Task(task.kind, [TokenIds(list(text.ids), list(text.type_ids)) for text in task.texts], task.options)


# An array smaller than this crosses as bytes inside the pickle: numpy's own reduction, which sends the array beside
# the pickle without a copy, costs about 9 µs an array, more than copying a few KiB
SMALL_ARRAY_BYTES = 1 << 16


def _array(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _reduced(array: np.ndarray) -> Any:
    """An array as pickle should carry it: as bytes where it is small, else as itself (beside the pickle)."""
    if array.nbytes >= SMALL_ARRAY_BYTES:
        return array
    return _Small(array.tobytes(), array.dtype.str, array.shape)


@dataclass(frozen=True, slots=True)
class _Small:
    data: bytes
    dtype: str
    shape: tuple[int, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return _Small, (self.data, self.dtype, self.shape)  # not a slotted dataclass's state, field by field


def _restored(value: Any) -> np.ndarray:
    return _array(value.data, value.dtype, value.shape) if isinstance(value, _Small) else value


@dataclass(frozen=True, slots=True)
class EmbeddedRows:
    """An embed task's answer as it crosses back, where no text asked for its token vectors: the sentence vectors
    in one array (n, D'), where a list of TextEmbedding costs a pickled object and an array per text."""

    sentences: np.ndarray

    def __reduce__(self) -> tuple[Any, ...]:
        return _embedded_rows, (_reduced(self.sentences),)


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """A classify task's answer as it crosses back: each text's logits and probabilities, (n, labels) each."""

    logits: np.ndarray
    probabilities: np.ndarray

    def __reduce__(self) -> tuple[Any, ...]:
        return _scored_rows, (_reduced(self.logits), _reduced(self.probabilities))


def _embedded_rows(sentences: Any) -> EmbeddedRows:
    return EmbeddedRows(_restored(sentences))


def _scored_rows(logits: Any, probabilities: Any) -> ScoredRows:
    return ScoredRows(_restored(logits), _restored(probabilities))


def packed(kind: TaskKind, results: Sequence[Any]) -> Any:
    """A task's results as they cross back: the batched kinds of fixed width in arrays, the rest as they are. A
    pass's answer in arrays already crosses as them however few its rows: a lone text's vector in an EmbeddedRows
    costs about half the pickling of the EmbeddedTexts around it (numpy's own reduction of its array)."""
    if kind == "embed" and isinstance(results, EmbeddedTexts) and results.token_vectors is None:
        return EmbeddedRows(results.sentences)
    if kind == "classify" and isinstance(results, ScoredTexts):
        return ScoredRows(results.logits, results.probabilities)
    if len(results) < PACK_AT:
        return results
    if kind == "embed" and all(result.tokens is None for result in results):
        return EmbeddedRows(np.stack([result.sentence for result in results]))
    if kind == "classify":
        return ScoredRows(
            np.stack([result.logits for result in results]), np.stack([result.probabilities for result in results])
        )
    return results


def unpacked(results: Any) -> Sequence[Any]:
    """What ``packed`` sent, as the services take it: one result for each text (embeddings as their arrays)."""
    if isinstance(results, EmbeddedRows):
        return EmbeddedTexts(results.sentences)
    if isinstance(results, ScoredRows):
        return ScoredTexts(results.logits, results.probabilities)
    return results


# ---- the engine's side ----


class Connection:
    """One front end's connection to the engine: its tasks running, by id."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.running: dict[int, asyncio.Future[Sequence[Any]]] = {}  # each task's results, by the request's id
        self.wire = FrameReader(self.received, self.lost)
        engine.connections.add(self)

    def received(self, message: tuple[Any, ...]) -> None:
        try:
            self.dispatch(message)
        except Exception:  # a fault in one message costs its answer, not the front end's connection
            logger.exception("the engine could not take a %r message", message[0])
            self.reply((message[1], "error", ComputeFailed("the engine failed to take this request")))

    def dispatch(self, message: tuple[Any, ...]) -> None:
        kind, request_id = message[0], message[1]
        if kind == "task":
            self.engine.start(self, *message[1:])
        elif kind == "cancel":
            cancelled = self.running.pop(request_id, None)
            if cancelled is not None:
                cancelled.cancel()
        elif kind == "describe":
            self.reply((request_id, "ok", self.engine.describe(), (0.0, 0.0)))
        elif kind == "metrics":
            self.reply((request_id, "ok", self.engine.metrics.exposition(http=False), (0.0, 0.0)))

    def reply(self, message: tuple[Any, ...]) -> None:
        try:
            self.wire.send(message)
        except ConnectionError:
            pass  # the front end has gone: nobody waits for it

    def lost(self, _: Exception | None) -> None:
        for work in list(self.running.values()):
            work.cancel()
        self.engine.connections.discard(self)
        if not self.engine.connections:
            self.engine.idle.set()


class Engine:
    """Serves the registry's models to front ends: each task through its model's queue, within the one admission
    bound of the whole service (ENCODER_MAX_QUEUE_TEXTS: 429 past it, whichever front end the request came to)."""

    def __init__(self, registry: Models, admission: Admission, metrics: Metrics) -> None:
        self.registry = registry
        self.admission = admission
        self.metrics = metrics  # the models', their queues' and passes' (the front ends count HTTP)
        self.connections: set[Connection] = set()
        self.idle = asyncio.Event()  # set whenever the last front end's connection has closed

    async def serve(self, path: str) -> asyncio.AbstractServer:
        return await asyncio.get_running_loop().create_unix_server(self.connected, path)

    def connected(self) -> FrameReader:
        self.idle.clear()
        return Connection(self).wire

    async def front_ends_gone(self, timeout_s: float) -> None:
        """Until every front end's connection has closed (they close theirs once they have answered what they
        held), or ``timeout_s`` passes."""
        if self.connections:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.idle.wait()
            except TimeoutError:
                logger.warning(
                    "%d front ends still connected after %g s: the engine stops", len(self.connections), timeout_s
                )

    def describe(self) -> dict[str, ModelFacts]:
        return {served.name: served.facts for served in self.registry}

    def start(
        self,
        connection: Connection,
        request_id: int,
        model: str,
        task: Task,
        left_s: float,
        sent: tracing.Carried | None = None,  # the front end's span, where the request is traced
    ) -> None:
        """Queue a front end's task within the admission bound and its request's time left, and reply once its future
        is done (``Answer``): a future and a timer a request, no task of the event loop, whose creation and steps cost
        the engine's loop a tenth to a sixth of its CPU a request (docs/benchmarks/host-path.md, "The engine answers
        from callbacks, not a task a request (CPU)")."""
        traced = tracing.continued(sent) if sent is not None and tracing.TRACER is not None else None
        timing = Timing()
        n_texts = len(task.texts) if task.batched else 1
        try:
            queue = self.registry.get(model).queue
            self.admission.enter(n_texts)
            try:
                future = queue.submit(task, timing)  # its spans go under the front end's, where traced
            except BaseException:
                self.admission.leave(n_texts)
                raise
        except EngineError as error:  # the admission's refusal, a queue closed by the stop
            connection.reply((request_id, "error", error))
            return
        except Exception:
            logger.exception("a %s task failed in the engine", task.kind)
            connection.reply((request_id, "error", ComputeFailed("the model failed to compute this request")))
            return
        finally:
            if traced is not None:
                tracing.left(traced)
        connection.running[request_id] = future
        Answer(self.admission, connection, request_id, task.kind, n_texts, timing, future, left_s)


class Answer:
    """One task's way back to its front end: its reply once its future is done, ``DeadlinePassed`` if its request's
    time runs out first (the future is then cancelled, its texts not yet taken dropped), none if its front end
    cancelled it; its texts counted out of the admission either way."""

    __slots__ = ("admission", "connection", "request_id", "kind", "n_texts", "timing", "future", "timer", "expired")

    def __init__(
        self,
        admission: Admission,
        connection: Connection,
        request_id: int,
        kind: TaskKind,
        n_texts: int,
        timing: Timing,
        future: asyncio.Future[Sequence[Any]],
        left_s: float,
    ) -> None:
        self.admission, self.connection, self.request_id = admission, connection, request_id
        self.kind, self.n_texts, self.timing, self.future = kind, n_texts, timing, future
        self.expired = False
        self.timer = asyncio.get_running_loop().call_later(left_s, self.expire)
        future.add_done_callback(self.done)

    def expire(self) -> None:
        if not self.future.done():
            self.expired = True
            self.future.cancel()

    def done(self, future: asyncio.Future[Sequence[Any]]) -> None:
        self.timer.cancel()
        self.admission.leave(self.n_texts)
        self.connection.running.pop(self.request_id, None)
        if future.cancelled():
            if self.expired:  # its own deadline, reached here first: its front end words and counts it
                passed = DeadlinePassed("the request was not answered in time")
                self.connection.reply((self.request_id, "error", passed))
            return  # else cancelled by its front end, or its connection lost: nobody waits for an answer
        error = future.exception()
        reply: tuple[Any, ...]
        if isinstance(error, EngineError):  # a failed pass's, or the queue's at the stop
            reply = (self.request_id, "error", error)
        elif error is not None:
            logger.error("a %s task failed in the engine", self.kind, exc_info=error)
            reply = (self.request_id, "error", ComputeFailed("the model failed to compute this request"))
        else:
            try:
                times = (self.timing.queue_s, self.timing.inference_s)
                reply = (self.request_id, "ok", packed(self.kind, future.result()), times)
            except Exception:
                logger.exception("a %s task's answer could not be packed", self.kind)
                reply = (self.request_id, "error", ComputeFailed("the model failed to compute this request"))
        self.connection.reply(reply)


# ---- the front end's side ----


class EngineClient:
    """A front end's connection to the engine: requests with their own futures over one stream."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connected = False
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._wire = FrameReader(self._received, self._lost)

    async def start(self) -> None:
        await asyncio.get_running_loop().create_unix_connection(lambda: self._wire, self.path)
        self.connected = True

    async def close(self) -> None:
        self.connected = False  # closed here: not the engine's going
        self._wire.close()

    def _received(self, message: tuple[Any, ...]) -> None:
        request_id, status, *payload = message
        future = self._waiting.pop(request_id, None)
        if future is None or future.done():
            return
        if status == "ok":
            future.set_result(payload)
        else:
            future.set_exception(payload[0])  # an EngineError, pickled whole

    def _lost(self, _: Exception | None) -> None:
        if self.connected:
            logger.error("the engine has gone: every request waiting for it is answered 503")
        self.connected = False
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(EngineStopped("the engine stopped; the service is restarting"))
        self._waiting.clear()

    async def request(self, *message: Any) -> list[Any]:
        """Send ``(kind, id, *message)`` and await its answer's payload; cancelled, it tells the engine."""
        if not self.connected:
            raise EngineStopped("the engine is not running; the service is restarting")
        request_id = self._next
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            self._wire.send((message[0], request_id, *message[1:]))
        except (RuntimeError, ConnectionError):  # the socket closed before the engine's going was seen
            self._waiting.pop(request_id, None)
            raise EngineStopped("the engine is not running; the service is restarting") from None
        try:
            return await future
        except asyncio.CancelledError:
            if self.connected:
                try:
                    self._wire.send(("cancel", request_id))
                except ConnectionError:
                    pass
            raise
        finally:
            self._waiting.pop(request_id, None)

    async def describe(self) -> dict[str, ModelFacts]:
        (facts, _) = await self.request("describe")
        return facts

    async def metrics(self) -> bytes:
        """The engine's metrics, in Prometheus' text format."""
        (body, _) = await self.request("metrics")
        return body


class EngineQueue:
    """What a front end's served model has for a queue: its tasks go to the engine's queue of that model."""

    def __init__(self, client: EngineClient, model: str, facts: ModelFacts, deadline_s: float) -> None:
        self.client = client
        self.model = model
        self.max_batch_tokens = facts.max_batch_tokens
        self.deadline_s = deadline_s  # a request's whole time, where it brings no deadline of its own

    async def run(self, task: Task, timing: Timing | None = None) -> Sequence[Any]:
        if task.batched and not task.texts:
            return []
        timing = REQUEST_TIMING.get() if timing is None else timing  # by default the calling request's
        # The engine drops what is still queued once the request's time is up: the time left, not the whole timeout
        left_s = timing.left_s(self.deadline_s) if timing is not None else self.deadline_s
        parent = tracing.current()
        if parent is None:
            result, (queue_s, inference_s) = await self.client.request("task", self.model, wire_task(task), left_s)
        else:  # the engine's spans go under this one's, in the same trace
            span = tracing.client_span("engine", parent)
            try:
                sent = tracing.carried(span)
                result, (queue_s, inference_s) = await self.client.request(
                    "task", self.model, wire_task(task), left_s, sent
                )
            finally:
                span.end()
        result = unpacked(result)
        if timing is not None:
            timing.queue_s += queue_s
            timing.inference_s += inference_s
        return result

    def submit(self, task: Task, timing: Timing | None = None) -> asyncio.Future[Sequence[Any]]:
        return asyncio.ensure_future(self.run(task, timing))

    async def run_in_turn(self, tasks: Sequence[Task], timing: Timing | None = None) -> list[Any]:
        results = []
        for task in tasks:
            (result,) = await self.run(task, timing)
            results.append(result)
        return results

    def pending(self) -> int:
        return 0  # the engine's queue: its own process counts it

    def stopped(self) -> str | None:
        return None if self.client.connected else "the engine"

    def computed(self) -> tuple[int, float]:
        return 0, 0.0  # the engine's: its own process counts it

    def close(self) -> None:
        pass  # the connection is the registry's, shared by every model
