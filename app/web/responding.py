"""How a route's work becomes an answer: admission, the deadline, a client that leaves, serialisation.

A native route is ``Responder.serve(request, registry, body, work)``: the model the body names, the texts it
brings admitted, and ``work(model, body)``, most often ``rendered(service.method, writer)``: the service's data
written in the route's API's shape, a ``Reply``. Another API's routes (TEI's, Cohere's) hand ``answer_value`` a
coroutine function that returns their JSON. The request's ``Timing`` is set for its work (``REQUEST_TIMING``):
the tokenisation stage and the queue add their times to it, and the answer's headers report them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from app import tracing
from app.engine.admission import Admission
from app.engine.errors import ComputeFailed, DeadlinePassed, EngineError, QueueFull
from app.engine.messages import REQUEST_TIMING, Timing
from app.errors import ApiError, InferenceFailed, NotReady, Overloaded, Timeout
from app.metrics import Metrics
from app.schemas import Reply
from app.schemas import Request as Body
from app.serialization import NPZ_MEDIA_TYPE, SENT_PART_BYTES, dumps, npz_parts, parts_length, sent_in_parts
from app.serving.registry import ModelRegistry, ServedModel
from app.web.in_flight import InFlight

logger = logging.getLogger(__name__)

B = TypeVar("B", bound=Body)
R = TypeVar("R")


def rendered(
    compute: Callable[[ServedModel, B], Awaitable[R]], render: Callable[[B, R], Reply]
) -> Callable[[ServedModel, B], Awaitable[Reply]]:
    """A service's computation (its domain result) written as the route's API writes it: the work of
    ``Responder.serve``."""

    async def work(served: ServedModel, body: B) -> Reply:
        return render(body, await compute(served, body))

    return work


def client_error(error: EngineError) -> ApiError:
    """The engine's error (app/engine/errors.py) as the client's: API.md's type, status and Retry-After."""
    headers = None if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}
    if isinstance(error, QueueFull):
        return Overloaded(error.message, headers=headers)
    if isinstance(error, ComputeFailed):
        return InferenceFailed(error.message, headers=headers)
    if isinstance(error, DeadlinePassed):
        return Timeout(error.message, headers=headers)
    return NotReady(error.message, headers=headers)  # EngineStopped: shutting down, or the engine gone


# Responses with more numbers than this are serialised in a worker thread, not on the event loop.
RENDER_IN_THREAD_VALUES = 100_000


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Responder:
    def __init__(self, admission: Admission, metrics: Metrics, request_timeout_s: float) -> None:
        self.admission = admission
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.in_flight = InFlight()

    async def serve(
        self,
        request: Request,
        registry: ModelRegistry,
        body: B,
        work: Callable[[ServedModel, B], Awaitable[Reply]],
    ) -> Response:
        """A native route's whole way: the model the body names (404 if none), admitted for the texts the body
        brings (``admitted_texts``), ``work(model, body)`` answered."""
        served = registry.get(getattr(body, "model", None))
        return await self.answer(request, lambda: work(served, body), body.admitted_texts)

    async def run(
        self, work: Callable[[], Awaitable[R]], n_texts: int = 1, request: Request | None = None
    ) -> tuple[R, Timing]:
        """Admit ``n_texts`` (429 overloaded past the limit) and await ``work()`` within the deadline (503 timeout
        past it), the request's ``Timing`` set for it (``REQUEST_TIMING``): its value, and where its time went. What
        every transport's answer is made of (HTTP here, gRPC in app/api/tei/grpc). With ``request``, its client's
        leaving cancels the work (ClientGone)."""
        now = asyncio.get_running_loop().time()
        deadline = now + self.request_timeout_s
        timing = Timing(deadline=deadline)
        current = REQUEST_TIMING.set(timing)  # the tokenisation stage and the queue add their times to it
        try:
            with self.admission.admit(n_texts):
                flight = self.in_flight.enter(now, deadline, request)
                try:
                    return await work(), timing
                except asyncio.CancelledError:
                    if flight.reason is None or flight.task.uncancel() > 0:  # not InFlight's alone (a shutdown's)
                        raise
                    if flight.reason == "gone":
                        raise ClientGone from None
                    raise self.timed_out() from None
                except (TimeoutError, DeadlinePassed):  # the deadline where the engine runs apart
                    raise self.timed_out() from None
                finally:
                    self.in_flight.leave(flight)
        except EngineError as error:  # admission's refusal, the engine's failure or its stop: the client's words
            raise client_error(error) from None
        finally:
            REQUEST_TIMING.reset(current)

    async def run_admitted(self, work: Callable[[], Awaitable[R]], timing: Timing) -> tuple[R, Timing]:
        """``work()`` for requests that ``run`` admitted already, each awaiting it within its own deadline (gRPC's
        gathered calls, computed as one under the first one's ``timing``); the engine's errors worded as ``run``
        words them."""
        current = REQUEST_TIMING.set(timing)
        try:
            return await work(), timing
        except DeadlinePassed:
            raise self.timed_out() from None
        except EngineError as error:
            raise client_error(error) from None
        finally:
            REQUEST_TIMING.reset(current)

    def timed_out(self) -> Timeout:
        self.metrics.timeouts.inc()
        return Timeout(
            f"the request was not answered within {self.request_timeout_s:g} s and was dropped; the service is "
            "overloaded: retry later or send fewer texts",
            headers={"Retry-After": str(self.admission.retry_after())},
        )

    def observe(self, route: str, timing: Timing, serialization_s: float) -> None:
        """A request's time in the latency histogram, by phase."""
        self.metrics.observe_phases(route, timing.tokenization_s, timing.queue_s, timing.inference_s, serialization_s)

    async def answer(self, request: Request, work: Callable[[], Awaitable[Reply]], n_texts: int = 1) -> Response:
        """Admit the request (429 past the limit), await its work within the deadline, serialise it.

        The response carries the time spent queued, computing and serialising, in milliseconds.
        """

        def timed() -> Awaitable[Reply]:
            request.state.timing = REQUEST_TIMING.get()  # the request log reads it
            return work()

        try:
            reply, timing = await self.run(timed, n_texts, request)
        except ClientGone:
            logger.info("client gone: %s %s dropped", request.method, request.url.path)
            return Response(status_code=499)
        started = time.perf_counter()
        media_type = "application/json"
        if reply.archive is not None:
            parts, media_type = await asyncio.to_thread(npz_parts, reply.archive), NPZ_MEDIA_TYPE
        elif reply.n_values > RENDER_IN_THREAD_VALUES:
            parts = [await asyncio.to_thread(dumps, reply.body)]
        else:
            parts = [dumps(reply.body)]
        serialization_s = time.perf_counter() - started
        self.observe(request.scope["route"].path, timing, serialization_s)
        headers = {
            "X-Tokenization-Time": f"{timing.tokenization_s * 1000:.2f}",
            "X-Queue-Time": f"{timing.queue_s * 1000:.2f}",
            "X-Inference-Time": f"{timing.inference_s * 1000:.2f}",
            "X-Serialization-Time": f"{serialization_s * 1000:.2f}",
        }
        length = parts_length(parts)
        parent = tracing.current()
        if parent is not None:
            ended = tracing.epoch_ns(started + serialization_s)
            tracing.record("serialize", parent, tracing.epoch_ns(started), ended, {"encoder.bytes": length})
        if length <= SENT_PART_BYTES:
            return Response(b"".join(parts), media_type=media_type, headers=headers)
        # A large answer goes out a part at a time, each as the client has taken the one before.
        headers["Content-Length"] = str(length)
        return StreamingResponse(sent(parts), media_type=media_type, headers=headers)


async def sent(parts: list[bytes | memoryview]) -> AsyncIterator[bytes]:
    for part in sent_in_parts(parts):
        yield part


async def answer_value(
    request: Request,
    responder: Responder,
    work: Callable[[], Awaitable[Any]],
    n_texts: int = 1,
) -> Response:
    """As Responder.answer, for work that returns a JSON value in another API's shape (TEI's, Cohere's): the same
    admission, deadline and timing."""

    async def reply() -> Reply:
        return Reply(await work())

    return await responder.answer(request, reply, n_texts)
