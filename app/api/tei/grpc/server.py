"""Text-embeddings-inference's gRPC API beside HTTP: ``ENCODER_GRPC_PORT``, the default model, as TEI serves one.

Every method is its TEI HTTP twin (app/api/tei/routes.py) over the same services: the same queue, admission and
deadline (``Responder.run``), the same API keys (metadata ``authorization: Bearer <key>``), the same checks. Errors
are gRPC status codes (``CODES``): INVALID_ARGUMENT for bad input, FAILED_PRECONDITION for a model that lacks the
method's task, RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE before the model is ready, DEADLINE_EXCEEDED
past the request timeout, UNAUTHENTICATED without a valid key. Beside them, gRPC's health-checking protocol
(``Health``).

A stream's messages are computed as they arrive, up to STREAM_IN_FLIGHT at once, so that they share passes as the
texts of one request do, and answered in their order; the first that fails ends the stream with its status. Unary
calls of one text (Embed, Predict, PredictPair) that arrive while another of their method computes are gathered into
one request (``Gathering``).
RerankStream's messages are one reranking (raw_scores, return_text, truncate and truncation_direction read from the
first, as TEI reads the first two).

With ENCODER_WORKERS > 1 every front end serves it on the same port (SO_REUSEPORT: the kernel spreads the
connections), from its own event loop, as it serves HTTP. Unlike HTTP's shared socket, a front end that dies takes
its gRPC connections with it; gRPC clients reconnect to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError
from starlette.datastructures import State

from app import __version__, tracing
from app.api.tei.grpc import tei_pb2 as pb
from app.api.tei.grpc import tei_pb2_grpc as pb_grpc
from app.api.tei.translate import (
    TEI_REFUSALS,
    Empty,
    backend_error,
    can_embed,
    can_embed_all,
    check_id_rows,
    kind,
    simple_tokens,
    strings,
    tei_info,
)
from app.engine.messages import REQUEST_TIMING, Timing
from app.errors import ApiError, CannotDo, InvalidRequest
from app.schemas import ClassifyRequest, EncodeRequest, RerankRequest, SparseEncodeRequest, blank
from app.services.embeddings import Embeddings
from app.serving.registry import ServedModel
from app.serving.tokenization import Reading
from app.settings import Settings
from app.web.dependencies import check_api_key, registry_of

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

logger = logging.getLogger(__name__)
access = logging.getLogger("app.access")

Request = TypeVar("Request")
Answer = TypeVar("Answer")
T = TypeVar("T")

STREAM_IN_FLIGHT = 64  # a stream's messages computed at once: enough to fill passes, bounded for the queue's sake
RUNS_AT_ONCE = 2  # a stream's runs of grouped messages computing at once: while they do, the next run gathers
GROUPS_AT_ONCE = 1  # groups of one method's unary calls computing at once: while one does, the next gathers
# errors that are the service's state, not a message's: a group's answer for every call in it, not retried alone (a
# full queue is not among them: it may refuse a group where it would admit the group's calls one after the other)
SHARED_ERRORS = frozenset({"timeout", "not_ready"})
# set in a gathered run's task: the first call's timing, its calls admitted each (``Gathering``, ``TeiServicer._run``)
GATHERED: contextvars.ContextVar[Timing | None] = contextvars.ContextVar("gathered", default=None)

# our error types → gRPC status codes (TEI's own mapping, and the codes its clients expect)
CODES: dict[str, grpc.StatusCode] = {
    "validation_error": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "empty": grpc.StatusCode.INVALID_ARGUMENT,
    "payload_too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "wrong_model_kind": grpc.StatusCode.FAILED_PRECONDITION,
    "model_not_found": grpc.StatusCode.NOT_FOUND,
    "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "not_ready": grpc.StatusCode.UNAVAILABLE,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "inference_failed": grpc.StatusCode.INTERNAL,
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
}


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message an error is answered with."""
    if isinstance(error, CannotDo):  # the services' refusal of a task the model cannot do: TEI's Backend
        refusal = TEI_REFUSALS.get(error.task)
        if refusal is None:
            return grpc.StatusCode.FAILED_PRECONDITION, backend_error(error.message)
        # Rerank checks the model's kind in TEI's gRPC server itself, in its own words; the rest, TEI's backend
        return grpc.StatusCode.FAILED_PRECONDITION, refusal if error.task == "rerank" else backend_error(refusal)
    if isinstance(error, ApiError):
        message = backend_error(error.message) if error.type == "wrong_model_kind" else error.message
        return CODES.get(error.type, grpc.StatusCode.INVALID_ARGUMENT), message
    if isinstance(error, ValidationError):  # a native request the message translated to, refused
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "request"
        return grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {first.get('msg', 'invalid')}"
    logger.error("a gRPC call failed", exc_info=error)
    return grpc.StatusCode.INTERNAL, "the service failed to answer this request"


def reading(direction: int, plain: bool = False) -> Reading:
    return Reading(left=direction == pb.TRUNCATION_DIRECTION_LEFT, plain=plain)


def metadata(chars: int, tokens: int, started: float, timing: Timing) -> pb.Metadata:
    """TEI's per-answer metadata: what was computed and where the time went."""
    return pb.Metadata(
        compute_chars=chars,
        compute_tokens=tokens,
        total_time_ns=int((time.perf_counter() - started) * 1e9),
        tokenization_time_ns=int(timing.tokenization_s * 1e9),
        queue_time_ns=int(timing.queue_s * 1e9),
        inference_time_ns=int(timing.inference_s * 1e9),
    )


def embed_options(request: pb.EmbedRequest) -> tuple[object, ...]:
    """What an Embed message asks besides its text: messages of equal options can be one request."""
    return (
        request.truncate,
        request.normalize if request.HasField("normalize") else None,
        request.dimensions if request.HasField("dimensions") else None,
        request.prompt_name if request.HasField("prompt_name") else None,
        request.truncation_direction,
    )


def predict_options(request: pb.PredictRequest | pb.PredictPairRequest) -> tuple[object, ...]:
    """What a Predict or PredictPair message asks besides its texts (and how many it sends: one, or a pair)."""
    texts = 1 if isinstance(request, pb.PredictRequest) else len(request.inputs)
    return texts, request.truncate, request.raw_scores, request.truncation_direction


class WithMetadata(Protocol):
    """An answer that carries TEI's metadata (pb.Metadata)."""

    @property
    def metadata(self) -> pb.Metadata: ...


Answered = TypeVar("Answered", bound=WithMetadata)
Unary = Callable[["TeiServicer", Request, ServedModel], Awaitable[Answer]]
InRuns = Callable[["TeiServicer", list[Request], ServedModel], Awaitable[list[Answer]]]


def unary(method: str, answer: Unary[Request, Answer]) -> Callable[..., Awaitable[Answer]]:
    """The servicer's method ``method`` (``Service/Method``) of one message and one answer: ``answer``, run as every
    call runs (``TeiServicer._unary``: the key, the model, the status, the count)."""

    async def call(self: TeiServicer, request: Request, context: grpc.aio.ServicerContext) -> Answer:
        return await self._unary(method, context, lambda served: answer(self, request, served))

    return call


def streamed(
    method: str, answer: InRuns[Request, Answer], key: Callable[[Request], object] | None = None
) -> Callable[..., AsyncIterator[Answer]]:
    """The servicer's streaming method ``method``: runs of messages (of equal ``key``, where given) answered by
    ``answer``, in order (``TeiServicer._stream``)."""

    async def call(
        self: TeiServicer, requests: AsyncIterator[Request], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Answer]:
        async for result in self._stream(method, requests, context, lambda run, served: answer(self, run, served), key):
            yield result

    return call


def alone(answer: Unary[Request, Answer]) -> InRuns[Request, Answer]:
    """A method's answer to one message, as the answer to a run of one."""

    async def run(self: TeiServicer, requests: list[Request], served: ServedModel) -> list[Answer]:
        return [await answer(self, request, served) for request in requests]

    return run


def gathered(answer: InRuns[Request, Answered], key: Callable[[Request], object]) -> Unary[Request, Answered]:
    """A method's answer to a run of messages, as the answer to one call: the calls of equal ``key`` that arrive
    while a group of them computes are answered as one run (``Gathering``)."""

    async def one(self: TeiServicer, request: Request, served: ServedModel) -> Answered:
        gathering = self._gatherings.get(answer)
        if gathering is None:
            run = lambda requests, served: answer(self, requests, served)  # noqa: E731
            gathering = self._gatherings[answer] = Gathering(run, key, self.settings.max_batch_texts)
        # each call admitted (a full queue refuses it at once) and awaited within its deadline, as it would be alone
        joined, _ = await self.state.responder.run(lambda: gathering.join(request, served))
        return joined

    return one


class Runs(Generic[Request, Answer]):
    """A stream's messages computed in runs, their answers in order. ``answer`` takes a run of messages and gives
    their answers; with ``key``, the messages that arrived while RUNS_AT_ONCE runs computed, of equal keys (the same
    options), go as one run, one request of the service, as the texts of one HTTP request do; without, each message
    is a run, computed as it arrives. Up to STREAM_IN_FLIGHT messages are in flight."""

    def __init__(
        self,
        requests: AsyncIterator[Request],
        answer: Callable[[list[Request], ServedModel], Awaitable[list[Answer]]],
        key: Callable[[Request], object] | None,
        served: ServedModel,
    ) -> None:
        self.requests, self.answer, self.key, self.served = requests, answer, key, served
        self.slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        self.computing = asyncio.Semaphore(RUNS_AT_ONCE)  # runs of grouped messages computing at once
        self.arrived: asyncio.Queue[Request | None] = asyncio.Queue()
        self.runs: asyncio.Queue[asyncio.Future[list[Answer | Exception]] | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start reading and computing the messages."""
        self.tasks = [asyncio.create_task(self.read()), asyncio.create_task(self.group())]

    async def answered(self) -> AsyncIterator[Answer]:
        """The answers in the messages' order (once ``start``-ed); raises the first message's error."""
        while (run := await self.runs.get()) is not None:
            for result in await run:
                self.slots.release()
                if isinstance(result, Exception):
                    raise result
                yield result
        await self.tasks[0]  # what ended the requests' stream, if it failed

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        while not self.runs.empty():
            left = self.runs.get_nowait()
            if left is not None:
                left.cancel()

    async def read(self) -> None:
        try:
            async for request in self.requests:
                await self.slots.acquire()
                self.arrived.put_nowait(request)
        finally:
            self.arrived.put_nowait(None)

    async def group(self) -> None:
        held: list[Request] = []  # a message that begins the next run
        ended = False
        try:
            while held or not ended:
                first = held.pop() if held else await self.arrived.get()
                if first is None:
                    break
                run = [first]
                if self.key is not None:
                    await self.computing.acquire()  # the messages that arrive meanwhile make the next run
                    while not self.arrived.empty():
                        following = self.arrived.get_nowait()
                        if following is None:
                            ended = True
                            break
                        if self.key(following) != self.key(first):
                            held.append(following)
                            break
                        run.append(following)
                self.runs.put_nowait(asyncio.ensure_future(self.computed(run)))
        finally:
            self.runs.put_nowait(None)

    async def computed(self, run: list[Request]) -> list[Answer | Exception]:
        """The run's answers; where it fails as one, its messages one by one, each answer or error in its place
        (those before a bad message are still answered)."""
        try:
            return list(await self.answer(run, self.served))
        except Exception:
            if len(run) == 1:
                raise
        finally:
            if self.key is not None:
                self.computing.release()
        out: list[Answer | Exception] = []
        for request in run:
            try:
                out += await self.answer([request], self.served)
            except Exception as error:
                out.append(error)
                break
        return out


@dataclass(eq=False)
class Call(Generic[Request, Answered]):
    """A unary call waiting in a ``Gathering``: its message, its answer to come, and what its group computes under
    when it is the first."""

    request: Request
    answer: asyncio.Future[Answered]
    timing: Timing  # its request's, admitted (``Responder.run``): the one its run computes under when it is the first
    context: contextvars.Context = field(default_factory=contextvars.copy_context)  # its span, where traced
    span: SpanContext | None = field(default_factory=tracing.current)  # where traced and sampled
    arrived: float = field(default_factory=time.perf_counter)
    run: list[Call[Request, Answered]] = field(default_factory=list)  # the calls computed with it, once started
    task: asyncio.Task[None] | None = None  # their run, computing


class Gathering(Generic[Request, Answered]):
    """One method's unary calls, gathered: a call that finds fewer than GROUPS_AT_ONCE groups computing goes at once
    (a lone client waits for no one); the calls that arrive while groups compute wait, and go as one run of messages
    (``answer``: one request of the service, as the texts of one HTTP request or a stream's run) when a group ends.
    Calls gather by ``key`` (equal options) and model, at most ``most`` to a run.

    grpcio hands the event loop its calls one at a time, so calls each sent apart made passes of 1-2 texts under
    load, each paying a pass's fixed cost; HTTP's requests, read several a turn of the loop, make passes of 6 on the
    same load (docs/benchmarks/host-path.md). Each call is admitted before it joins (``gathered``: a full queue
    refuses it at once) and awaits its answer within its own deadline; a run whose callers are all gone is cancelled,
    its texts leaving the queue. A run that fails as one is answered message by message, each its own answer or error,
    unless its error is the service's state (SHARED_ERRORS: every call's answer). A call's wait
    counts in its metadata's queue and total time; where traced, the run computes under the first call's span, and
    each other call's span gets a ``gathered`` span linked to it."""

    def __init__(
        self,
        answer: Callable[[list[Request], ServedModel], Awaitable[list[Answered]]],
        key: Callable[[Request], object],
        most: int,
    ) -> None:
        self.answer, self.key, self.most = answer, key, most
        self.computing = 0
        self.waiting: dict[tuple[int, object], tuple[ServedModel, list[Call[Request, Answered]]]] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # the runs computing (held: the loop keeps weak references)

    async def join(self, request: Request, served: ServedModel) -> Answered:
        """The call's answer, computed in a run of the calls gathered with it; its request admitted already, its
        ``Timing`` the one the responder set (``REQUEST_TIMING``)."""
        timing = REQUEST_TIMING.get()
        assert timing is not None, "a gathered call is admitted by the responder first"
        call: Call[Request, Answered] = Call(request, asyncio.get_running_loop().create_future(), timing)
        self.waiting.setdefault((id(served), self.key(request)), (served, []))[1].append(call)
        self.start()
        try:
            return await call.answer  # cancelled (the client gone, its deadline passed): its future is too
        except asyncio.CancelledError:
            if call.task is not None and all(other.answer.done() for other in call.run):
                call.task.cancel()  # no one waits for the run any more: its texts leave the queue
            raise

    def start(self) -> None:
        """Start the waiting calls' runs, first come first, while fewer than GROUPS_AT_ONCE compute."""
        while self.computing < GROUPS_AT_ONCE and self.waiting:
            group = next(iter(self.waiting))
            served, calls = self.waiting.pop(group)
            calls = [call for call in calls if not call.answer.done()]  # cancelled while waiting
            run, rest = calls[: self.most], calls[self.most :]
            if rest:
                self.waiting[group] = (served, rest)  # behind the other keys' calls
            if not run:
                continue
            self.computing += 1
            task = asyncio.get_running_loop().create_task(self.computed(run, served), context=run[0].context)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            for call in run:
                call.run, call.task = run, task

    async def computed(self, run: list[Call[Request, Answered]], served: ServedModel) -> None:
        started = time.perf_counter()
        timing = run[0].timing
        deadlines = [call.timing.deadline for call in run if call.timing.deadline is not None]
        timing.deadline = max(deadlines, default=None)  # dropped where it computes apart only once every call's passed
        GATHERED.set(timing)  # in this task's context only: its work is admitted already (``_run``)
        try:
            outcomes = await self.outcomes(run, served)
            for call, outcome in zip(run, outcomes, strict=True):
                if call.answer.done():
                    continue
                if isinstance(outcome, Exception):
                    call.answer.set_exception(outcome)
                else:
                    waited = int((started - call.arrived) * 1e9)
                    outcome.metadata.queue_time_ns += waited
                    outcome.metadata.total_time_ns += waited
                    call.answer.set_result(outcome)
                if call is not run[0] and call.span is not None and run[0].span is not None:
                    attributes = {"encoder.gathered.calls": len(run)}
                    start, end = tracing.epoch_ns(call.arrived), time.time_ns()
                    tracing.record("gathered", call.span, start, end, attributes, [run[0].span])
        finally:
            for call in run:  # the run cancelled (its callers gone, or the server stopping): its calls with it
                if not call.answer.done():
                    call.answer.cancel()
            self.computing -= 1
            self.start()

    async def outcomes(self, run: list[Call[Request, Answered]], served: ServedModel) -> list[Answered | Exception]:
        """Each call's answer, or its error."""
        try:
            return list(await self.answer([call.request for call in run], served))
        except Exception as error:
            if len(run) == 1 or (isinstance(error, ApiError) and error.type in SHARED_ERRORS):
                return [error] * len(run)
        out: list[Answered | Exception] = []
        for call in run:  # one message spoilt the run: each alone (but those whose clients are gone)
            if call.answer.done():
                out.append(ConnectionAbortedError("the call ended"))  # not read: its answer is settled
                continue
            try:
                out += await self.answer([call.request], served)
            except Exception as error:
                out.append(error)
        return out


# gRPC's codes that are the server's fault, as OpenTelemetry's conventions for an RPC server have them: an error span
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


class TracedCall:
    """A call's span (app/tracing.py), continuing the ``traceparent`` of its metadata: the calling task's current span
    until ``leave`` (or ``end``)."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        carrier = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        service, name = method.split("/")
        attributes = {"rpc.system": "grpc", "rpc.service": f"tei.v1.{service}", "rpc.method": name}
        self.span = tracing.server_span(f"tei.v1.{method}", carrier, attributes)
        self.token: object | None = tracing.entered(self.span)

    def leave(self) -> None:
        if self.token is not None:
            tracing.left(self.token)
            self.token = None

    def end(self, code: grpc.StatusCode) -> str:
        """End it with the call's status code; its trace id, for the call's log line."""
        from opentelemetry.trace import StatusCode

        self.leave()
        self.span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code in SERVER_ERRORS:
            self.span.set_status(StatusCode.ERROR, code.name)
        self.span.end()
        return tracing.trace_id(self.span)


class TeiServicer:
    """Every method of TEI's five services (Info, Embed, Predict, Rerank, Tokenize), over the app's state: its
    registry, services, responder, settings and metrics."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._gatherings: dict[object, Gathering] = {}  # a method's unary calls gathered (``gathered``)

    # ---- how every call runs ----

    @contextlib.asynccontextmanager
    async def _call(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[TracedCall | None]:
        """A call's span, count and log line; an error raised in it ends the call with its status (``status_of``)."""
        started, code = time.perf_counter(), grpc.StatusCode.OK
        traced = TracedCall(method, context) if tracing.TRACER is not None else None
        try:
            yield traced
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as error:
            code, message = status_of(error)
            await context.abort(code, message)  # raises
        finally:
            self._count(method, code, started, traced)

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, answer: Callable[[ServedModel], Awaitable[T]]
    ) -> T:
        async with self._call(method, context):
            return await answer(self._model(context))
        raise AssertionError("unreachable: the call returned or raised")

    async def _stream(
        self,
        method: str,
        requests: AsyncIterator[Request],
        context: grpc.aio.ServicerContext,
        answer: Callable[[list[Request], ServedModel], Awaitable[list[Answer]]],
        key: Callable[[Request], object] | None = None,
    ) -> AsyncIterator[Answer]:
        """Each message answered in order (``Runs``); the first that fails ends the stream with its status."""
        runs: Runs[Request, Answer] | None = None
        async with self._call(method, context) as traced:
            try:
                runs = Runs(requests, answer, key, self._model(context))
                runs.start()  # its tasks run under the call's span, the current one until this generator yields
                if traced is not None:
                    traced.leave()
                async for result in runs.answered():
                    yield result
            finally:
                if runs is not None:
                    runs.cancel()

    def _model(self, context: grpc.aio.ServicerContext) -> ServedModel:
        """The default model, once the key is checked (UNAUTHENTICATED) and the models are ready (UNAVAILABLE)."""
        sent = dict(context.invocation_metadata() or ())
        check_api_key(self.settings, str(sent.get("authorization", "")))
        return registry_of(self.state).default

    def _count(self, method: str, code: grpc.StatusCode, started: float, traced: TracedCall | None) -> None:
        seconds = time.perf_counter() - started
        route = f"/tei.v1.{method}"
        self.state.metrics.observe_request(route, "GRPC", code.name, seconds)
        extra = {} if traced is None else {"trace_id": traced.end(code)}
        access.info("GRPC %s %s %.1f ms", route, code.name, seconds * 1000, extra=extra)

    async def _run(self, work: Callable[[], Awaitable[T]], n_texts: int) -> tuple[T, Timing]:
        """``work`` admitted for ``n_texts`` and within the deadline; a gathered run's, whose calls were each
        admitted, under its first call's timing."""
        gathered = GATHERED.get()
        if gathered is not None:
            return await self.state.responder.run_admitted(work, gathered)
        return await self.state.responder.run(work, n_texts)

    @property
    def settings(self) -> Settings:
        return self.state.settings

    @property
    def embeddings(self) -> Embeddings:
        return self.state.embeddings

    # ---- Info ----

    async def _info(self, request: pb.InfoRequest, served: ServedModel) -> pb.InfoResponse:
        facts = tei_info(served, self.settings)
        model_type = {
            "embedding": pb.MODEL_TYPE_EMBEDDING,
            "classifier": pb.MODEL_TYPE_CLASSIFIER,
            "reranker": pb.MODEL_TYPE_RERANKER,
        }[kind(served)]
        return pb.InfoResponse(
            version=__version__,
            model_id=facts["model_id"],
            model_dtype=facts["model_dtype"],
            model_type=model_type,
            max_concurrent_requests=facts["max_concurrent_requests"],
            max_input_length=facts["max_input_length"],
            max_batch_tokens=facts["max_batch_tokens"],
            max_client_batch_size=facts["max_client_batch_size"],
            tokenization_workers=facts["tokenization_workers"],
        )

    Info = unary("Info/Info", _info)

    # ---- Embed ----

    async def _embed(self, requests: list[pb.EmbedRequest], served: ServedModel) -> list[pb.EmbedResponse]:
        """Messages of equal options (``embed_options``) as one request of the service."""
        started = time.perf_counter()
        first = requests[0]
        normalize = first.normalize if first.HasField("normalize") else True  # TEI's default: true
        can_embed(served, normalize, first.dimensions if first.HasField("dimensions") else None)
        texts = [strings(request.inputs)[0][0] for request in requests]
        native = EncodeRequest(
            texts=texts,
            normalize=normalize,
            truncate=first.truncate,
            dimensions=first.dimensions if first.HasField("dimensions") else None,
            prompt_name=first.prompt_name if first.HasField("prompt_name") else None,
        )
        served = served.read_as(reading(first.truncation_direction))
        embedded, timing = await self._run(lambda: self.embeddings.encode(served, native), native.admitted_texts)
        return [
            pb.EmbedResponse(
                embeddings=vector,
                metadata=metadata(len(request.inputs), len(encoding.ids), started, timing),
            )
            for request, vector, encoding in zip(requests, embedded.vectors.tolist(), embedded.encodings, strict=True)
        ]

    Embed = unary("Embed/Embed", gathered(_embed, embed_options))
    EmbedStream = streamed("Embed/EmbedStream", _embed, embed_options)

    async def _embed_sparse(self, request: pb.EmbedSparseRequest, served: ServedModel) -> pb.EmbedSparseResponse:
        started = time.perf_counter()
        texts, _ = strings(request.inputs)
        if request.HasField("prompt_name"):  # the prompt's text before it, as TEI puts it
            texts, _ = Embeddings.prompted(served, texts, request.prompt_name)
        native = SparseEncodeRequest(texts=texts, truncate=request.truncate)
        served = served.read_as(reading(request.truncation_direction))
        encoded, timing = await self._run(lambda: self.embeddings.sparse(served, native), native.admitted_texts)
        vector = encoded.vectors[0]
        return pb.EmbedSparseResponse(
            sparse_embeddings=[
                pb.SparseValue(index=int(i), value=float(v)) for i, v in zip(vector.indices, vector.values, strict=True)
            ],
            metadata=metadata(len(request.inputs), encoded.tokens_used, started, timing),
        )

    EmbedSparse = unary("Embed/EmbedSparse", _embed_sparse)
    EmbedSparseStream = streamed("Embed/EmbedSparseStream", alone(_embed_sparse))

    async def _embed_all(self, request: pb.EmbedAllRequest, served: ServedModel) -> pb.EmbedAllResponse:
        started = time.perf_counter()
        can_embed_all(served)
        texts, _ = strings(request.inputs)
        native = EncodeRequest(
            texts=texts,
            normalize=False,
            truncate=request.truncate,
            return_token_embeddings=True,
            prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
        )
        served = served.read_as(reading(request.truncation_direction))
        embedded, timing = await self._run(lambda: self.embeddings.encode(served, native), native.admitted_texts)
        vectors = embedded.token_vectors[0]
        assert vectors is not None, "token vectors were asked for"
        return pb.EmbedAllResponse(
            token_embeddings=[pb.TokenEmbedding(embeddings=row) for row in vectors.tolist()],
            metadata=metadata(len(request.inputs), embedded.tokens_used, started, timing),
        )

    EmbedAll = unary("Embed/EmbedAll", _embed_all)
    EmbedAllStream = streamed("Embed/EmbedAllStream", alone(_embed_all))

    # ---- Predict ----

    async def _predict(
        self, inputs: list[list[str]], truncate: bool, raw_scores: bool, direction: int, served: ServedModel
    ) -> list[pb.PredictResponse]:
        """Texts, or pairs of texts (as many in each), labelled as one request of the service."""
        started = time.perf_counter()
        if not 1 <= len(inputs[0]) <= 2 or any(len(texts) != len(inputs[0]) for texts in inputs):
            raise InvalidRequest("inputs", "one string, or a pair of strings")
        if any(blank(text) for texts in inputs for text in texts):
            raise Empty("Input validation error: `inputs` cannot be empty")
        native = ClassifyRequest(
            texts=[texts[0] for texts in inputs],
            text_pair=[texts[1] for texts in inputs] if len(inputs[0]) == 2 else None,
            truncate=truncate,
            raw_scores=raw_scores,
        )
        served = served.read_as(reading(direction))
        labelled, timing = await self._run(lambda: self.state.tasks.classify(served, native), len(inputs))
        return [
            pb.PredictResponse(
                predictions=[pb.Prediction(score=score, label=label) for label, score in labels],
                metadata=metadata(sum(len(text) for text in texts), tokens, started, timing),
            )
            for texts, labels, tokens in zip(inputs, labelled.labels, labelled.tokens, strict=True)
        ]

    async def _predict_texts(self, requests: list[pb.PredictRequest], served: ServedModel) -> list[pb.PredictResponse]:
        first = requests[0]
        inputs = [[request.inputs] for request in requests]
        return await self._predict(inputs, first.truncate, first.raw_scores, first.truncation_direction, served)

    async def _predict_pairs(
        self, requests: list[pb.PredictPairRequest], served: ServedModel
    ) -> list[pb.PredictResponse]:
        first = requests[0]
        inputs = [list(request.inputs) for request in requests]
        return await self._predict(inputs, first.truncate, first.raw_scores, first.truncation_direction, served)

    Predict = unary("Predict/Predict", gathered(_predict_texts, predict_options))
    PredictPair = unary("Predict/PredictPair", gathered(_predict_pairs, predict_options))
    PredictStream = streamed("Predict/PredictStream", _predict_texts, predict_options)
    PredictPairStream = streamed("Predict/PredictPairStream", _predict_pairs, predict_options)

    # ---- Rerank ----

    async def _rerank(
        self,
        query: str,
        texts: list[str],
        first: pb.RerankRequest | pb.RerankStreamRequest,
        served: ServedModel,
    ) -> pb.RerankResponse:
        started = time.perf_counter()
        if not texts:
            raise Empty("`texts` cannot be empty")
        native = RerankRequest(
            query=query,
            documents=texts,
            raw_scores=first.raw_scores,
            return_documents=first.return_text,
            truncate=first.truncate,
        )
        served = served.read_as(reading(first.truncation_direction))
        ranked, timing = await self._run(lambda: self.state.tasks.rerank(served, native), native.admitted_texts)
        ranks = [
            pb.Rank(index=index, score=float(ranked.scores[index]), text=texts[index] if first.return_text else None)
            for index in ranked.order
        ]
        chars = len(query) * len(texts) + sum(len(text) for text in texts)
        return pb.RerankResponse(ranks=ranks, metadata=metadata(chars, ranked.tokens_used, started, timing))

    async def _rerank_one(self, request: pb.RerankRequest, served: ServedModel) -> pb.RerankResponse:
        return await self._rerank(request.query, list(request.texts), request, served)

    async def _rerank_streamed(
        self, requests: AsyncIterator[pb.RerankStreamRequest], served: ServedModel
    ) -> pb.RerankResponse:
        """A stream's (query, text) messages as one answer: a reranking a query, merged by score."""
        pairs = [request async for request in requests]
        if not pairs:
            raise Empty("`texts` cannot be empty")
        by_query: dict[str, list[int]] = {}  # each query's messages
        for index, pair in enumerate(pairs):
            by_query.setdefault(pair.query, []).append(index)
        answers = await asyncio.gather(
            *(
                self._rerank(query, [pairs[i].text for i in places], pairs[0], served)
                for query, places in by_query.items()
            )
        )
        ranks = [
            pb.Rank(index=places[rank.index], score=rank.score, text=rank.text if rank.HasField("text") else None)
            for places, answered in zip(by_query.values(), answers, strict=True)
            for rank in answered.ranks
        ]
        ranks.sort(key=lambda rank: -rank.score)
        merged = pb.Metadata()
        for answered in answers:
            merged.compute_chars += answered.metadata.compute_chars
            merged.compute_tokens += answered.metadata.compute_tokens
            merged.queue_time_ns += answered.metadata.queue_time_ns
            merged.inference_time_ns += answered.metadata.inference_time_ns
            merged.total_time_ns = max(merged.total_time_ns, answered.metadata.total_time_ns)
        return pb.RerankResponse(ranks=ranks, metadata=merged)

    Rerank = unary("Rerank/Rerank", _rerank_one)
    RerankStream = unary("Rerank/RerankStream", _rerank_streamed)  # many messages in, one answer out

    # ---- Tokenize ----

    async def _tokenize(self, request: pb.EncodeRequest, served: ServedModel) -> pb.EncodeResponse:
        texts, _ = strings(request.inputs)
        prompt = request.prompt_name if request.HasField("prompt_name") else None
        prompted, _ = Embeddings.prompted(served, texts, prompt)  # the model's default prompt too, as /embed
        encodings = await served.tokens.encode(prompted, whole=True, special_tokens=request.add_special_tokens)
        tokens = simple_tokens(prompted[0], encodings[0])
        return pb.EncodeResponse(tokens=[pb.SimpleToken(**token) for token in tokens])

    async def _decode(self, request: pb.DecodeRequest, served: ServedModel) -> pb.DecodeResponse:
        ids = list(request.ids)
        tokenizer = served.card.tokenizer
        check_id_rows(tokenizer, [ids], "ids", "input_ids", bare=True)
        return pb.DecodeResponse(text=tokenizer.decode(ids, skip_special_tokens=request.skip_special_tokens))

    Tokenize = unary("Tokenize/Tokenize", _tokenize)
    TokenizeStream = streamed("Tokenize/TokenizeStream", alone(_tokenize))
    Decode = unary("Tokenize/Decode", _decode)
    DecodeStream = streamed("Tokenize/DecodeStream", alone(_decode))


SERVICES = (
    pb_grpc.add_InfoServicer_to_server,
    pb_grpc.add_EmbedServicer_to_server,
    pb_grpc.add_PredictServicer_to_server,
    pb_grpc.add_RerankServicer_to_server,
    pb_grpc.add_TokenizeServicer_to_server,
)
SERVICE_NAMES = ("", *(f"tei.v1.{name}" for name in ("Info", "Embed", "Predict", "Rerank", "Tokenize")))
HEALTH_INTERVAL_S = 1.0  # how often the health service looks at readiness again


class Health:
    """gRPC's health-checking protocol (``grpc.health.v1``, grpcio's own servicer) beside TEI's services: the server
    (``""``) and each ``tei.v1`` service SERVING while HTTP's /ready would answer 200, NOT_SERVING before the models
    are ready, once an engine or inference thread has stopped and while the server shuts down; looked at again every
    HEALTH_INTERVAL_S (Check answers at once, Watch streams each change)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.servicer = health.aio.HealthServicer()
        self.status: int | None = None
        self.watching: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.look()  # NOT_SERVING from the first call on, where the models are not ready yet
        self.watching = asyncio.create_task(self.watch())

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.look()

    async def look(self) -> None:
        try:
            registry_of(self.state)
            status = health_pb2.HealthCheckResponse.SERVING
        except ApiError:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        if status != self.status:
            for name in SERVICE_NAMES:
                await self.servicer.set(name, status)
            self.status = status

    async def stop(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
        await self.servicer.enter_graceful_shutdown()  # NOT_SERVING, and so it stays


class GrpcServer:
    """The running gRPC server and its health service."""

    def __init__(self, server: grpc.aio.Server, health: Health) -> None:
        self.server, self.health = server, health

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING at once (balancers stop sending), then the calls in flight answered within ``grace_s``."""
        await self.health.stop()
        await self.server.stop(grace_s)


async def start_grpc(state: State, settings: Settings) -> GrpcServer:
    """The gRPC server on ``settings.grpc_host:grpc_port``, serving; RuntimeError if it cannot listen there."""
    assert settings.grpc_port is not None
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),  # every front end on the one port
            ("grpc.max_receive_message_length", settings.max_body_bytes),  # HTTP's body limit
        ]
    )
    servicer = TeiServicer(state)
    for add in SERVICES:
        add(servicer, server)
    checks = Health(state)
    health_pb2_grpc.add_HealthServicer_to_server(checks.servicer, server)
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:
        raise RuntimeError(f"ENCODER_GRPC_PORT: cannot listen on {address}: {error}") from None
    await checks.start()
    await server.start()
    logger.info("gRPC (text-embeddings-inference's tei.v1, and grpc.health.v1) on %s", address)
    return GrpcServer(server, checks)
