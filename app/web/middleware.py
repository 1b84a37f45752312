"""ASGI middleware that must act before FastAPI parses anything."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs, tracing
from app.errors import ErrorShapes, Failure, native_errors
from app.logs import request_id
from app.metrics import Metrics
from app.web.in_flight import InFlight

access = logging.getLogger("app.access")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # an incoming id is echoed only if it is this tame


def early_error(shapes: ErrorShapes | None, scope: Scope, failure: Failure) -> Response:
    """An error answered before any route is reached, in the shape of the API whose prefix the path is under
    (``ErrorShapes``), else ours."""
    return (native_errors if shapes is None else shapes.of(scope))(failure)


class BodySizeLimit:
    """Answer 413 ``payload_too_large`` for a body over ``max_bytes``, before it is parsed.

    A declared Content-Length is checked at once; a body without one (chunked) is read up to the limit
    and then handed on. The errors take the shape of the API the path belongs to (``shapes``).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, shapes: ErrorShapes | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                invalid = Failure(400, "bad_request", "invalid Content-Length header")
                await early_error(self.shapes, scope, invalid)(scope, receive, send)
                return
            if size > self.max_bytes:
                await self._reject(size, scope, receive, send)
                return
            await self.app(scope, receive, send)
            return

        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._reject(None, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _reject(self, size: int | None, scope: Scope, receive: Receive, send: Send) -> None:
        what = f"{size:,} bytes" if size is not None else "more than that"
        message = f"request body is {what}; the limit is {self.max_bytes:,} bytes"
        await early_error(self.shapes, scope, Failure(413, "payload_too_large", message))(scope, receive, send)


class BodyTimeout:
    """Answer 408 ``request_timeout`` and close the connection where a request's body has not all arrived
    ``timeout_s`` after it began (a client that stalls would otherwise hold its connection and a read forever).

    The body is read here, then handed on as it came; one declared larger than ``max_bytes`` is not (BodySizeLimit
    refuses it unread), nor more than ``max_bytes`` of one not declared.

    No timer a request: a read in progress is in flight with its deadline (``InFlight``, whose one sweeping task
    cancels it within a tick past it). A timer a request (``asyncio.timeout``) cost 7.5 µs of the event loop's time a
    request, a watchdog of its own 2.6 (measured in process, 100,000 requests). The 408 takes the shape of the API
    the path belongs to (``shapes``).
    """

    def __init__(self, app: ASGIApp, timeout_s: float, max_bytes: int, shapes: ErrorShapes | None = None) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.shapes = shapes
        self.in_flight = InFlight()  # the bodies being read

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is None and b"transfer-encoding" not in headers:  # no body
            await self.app(scope, receive, send)
            return
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self.app(scope, receive, send)  # refused unread further in
            return
        chunks: list[bytes] = []
        received, more = 0, True
        now = asyncio.get_running_loop().time()
        flight = self.in_flight.enter(now, now + self.timeout_s, None)
        try:
            while more and received <= self.max_bytes:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunks.append(message.get("body", b""))
                received += len(chunks[-1])
                more = message.get("more_body", False)
        except asyncio.CancelledError:
            if flight.reason is None or flight.task.uncancel() > 0:  # not InFlight's alone (a shutdown's)
                raise
            access.info(
                "408 request_timeout: %s %s, %d bytes of its body in %g s",
                scope["method"],
                scope["path"],
                received,
                self.timeout_s,
            )
            message_text = f"the request body did not arrive within {self.timeout_s:g} s"
            late = Failure(408, "request_timeout", message_text, headers={"Connection": "close"})
            await early_error(self.shapes, scope, late)(scope, receive, send)
            return
        finally:
            self.in_flight.leave(flight)
        await self.app(scope, replay(b"".join(chunks), receive, more), send)


def replay(body: bytes, receive: Receive, more_body: bool = False) -> Receive:
    """A receive that hands ``body`` (already read) over first, then the connection's own messages."""
    delivered = False

    async def receive_again() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": more_body}
        return await receive()

    return receive_again


class OneWriteResponses:
    """Write a response's status line and headers together with the first part of its body.

    uvicorn writes the headers to the socket when the application starts a response and the body when
    it comes: two system calls. A process killed between the two (SIGKILL, the OOM killer) leaves its
    peer with headers and no body; a load balancer has already passed the headers on to its client and
    can no longer try another replica. One write is all or nothing: the peer gets the whole response, or
    nothing and retries it elsewhere.

    It reaches the server's transport through the ASGI ``send`` it is given (uvicorn's request-response
    cycle, whose ``transport`` it wraps for this request). Under a server that does not look like that it
    passes everything through unchanged. It must be the outermost layer, outside Starlette's own.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if scope["type"] != "http" or not callable(getattr(transport, "write", None)):
            await self.app(scope, receive, send)
            return
        held = HeldWrites(transport)
        cycle.transport = held  # type: ignore[union-attr]

        async def send_once(message: Message) -> None:
            if message["type"] == "http.response.start":
                held.holding = True  # the headers wait for the body
                await send(message)
            elif message["type"] == "http.response.body":
                held.holding = False
                try:
                    await send(message)  # the body's write carries the headers with it
                finally:
                    held.flush()  # an empty body is not written at all: the headers go alone
            else:
                await send(message)

        try:
            await self.app(scope, receive, send_once)
        finally:
            held.flush()


class HeldWrites:
    """A transport whose writes wait, while ``holding``, to go out joined with the next one."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._pending: list[bytes | bytearray | memoryview] = []
        self.holding = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.holding:
            self._pending.append(bytes(data))
        elif self._pending:
            self._pending.append(data)
            self.flush()
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write what is held, in one system call (a writev: a large body is not copied to join it)."""
        self.holding = False
        if self._pending:
            pending, self._pending = self._pending, []
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)


# Probes and scrapes, asked every few seconds by orchestrators and Prometheus: not traced (they would drown the traces)
UNTRACED = frozenset({"/health", "/ready", "/metrics", "/tei/health"})


class TracedRequest:
    """An HTTP request's span (app/tracing.py): the calling task's current span until ``end``."""

    def __init__(self, scope: Scope, rid: str) -> None:
        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        self.method = scope["method"]
        attributes = {"http.request.method": self.method, "url.path": scope["path"], "encoder.request_id": rid}
        self.span = tracing.server_span(self.method, carrier, attributes)
        self.token = tracing.entered(self.span)

    def end(self, route: str, status: int) -> str:
        """End it, named by its route and with its status (5xx an error, as OpenTelemetry's conventions have for a
        server); its trace id, for the request's log line."""
        from opentelemetry.trace import StatusCode

        tracing.left(self.token)
        span = self.span
        if route != "unmatched":
            span.update_name(f"{self.method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(StatusCode.ERROR)
        span.end()
        return tracing.trace_id(span)


class RequestLog:
    """Per request: an id (X-Request-ID honoured and echoed), one log line, and the request metrics.

    No bodies are logged. The route stores its phase timings in the request state; they are logged
    and observed here.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = incoming if REQUEST_ID.fullmatch(incoming) else f"{random.getrandbits(128):032x}"  # no system call
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500
        span = TracedRequest(scope, rid) if tracing.TRACER is not None and scope["path"] not in UNTRACED else None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"  # never the raw path: bounded label values
            self.metrics.observe_request(label, scope["method"], status, seconds)
            trace_id = None if span is None else span.end(label, status)
            if access.isEnabledFor(logging.INFO):  # the line's fields only where it is written
                self.log(scope, status, seconds, trace_id)
            request_id.reset(token)

    @staticmethod
    def log(scope: Scope, status: int, seconds: float, trace_id: str | None) -> None:
        """The request's access line, its fields beside it where they are written: the JSON format, or anything
        on logging's way."""
        lines = logs.INFO_LINES
        if lines is not None and lines.stands(access):  # the same line, the short way (app/logs.py)
            extra = access_fields(scope, status, seconds, trace_id) if lines.fields else {}
            lines.write(access.name, f"{scope['method']} {scope['path']} {status:d} {seconds * 1000:.1f} ms", extra)
        else:
            extra = access_fields(scope, status, seconds, trace_id)
            access.info("%s %s %d %.1f ms", scope["method"], scope["path"], status, seconds * 1000, extra=extra)


def access_fields(scope: Scope, status: int, seconds: float, trace_id: str | None) -> dict[str, Any]:
    """An access line's fields: the request, its status and time, its phases' times, its trace."""
    timing = scope.get("state", {}).get("timing")
    extra = {"method": scope["method"], "path": scope["path"], "status": status, "ms": round(seconds * 1000, 2)}
    if timing is not None:
        extra |= {
            "tokenization_ms": round(timing.tokenization_s * 1000, 2),
            "queue_ms": round(timing.queue_s * 1000, 2),
            "inference_ms": round(timing.inference_s * 1000, 2),
        }
    if trace_id is not None:
        extra["trace_id"] = trace_id
    return extra
