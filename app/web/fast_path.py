"""The hot routes' short way in: POST /encode, /v1/embeddings, /tei/embed and /v2/embed (app/api/hot.py) without
FastAPI's layers, answering the same.

Under many small requests the framework costs more than the work: its middleware chain, routing, dependency
solving and body parsing took about a quarter of the service's CPU on two cores, as much as the pass and
tokenisation together (docs/benchmarks/host-path.md, "The hot routes' short way in, request lines in batches, one task a
request (CPU)"). An ordinary request to a hot route (a JSON body of declared length within the limit, where no CORS is
configured) is taken here instead: the body is read and validated by the route's own schema, and the route's own
function is called with its dependencies, under the same request log and metrics (``RequestLog``). Every other request,
and one whose body does not validate, goes the framework's way untouched (its body replayed), so that each error keeps
its one wording: this path adds no behaviour, only a shorter way to the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ErrorShape, is_json, native_errors, route_error_response
from app.web.dependencies import get_registry, require_api_key
from app.web.middleware import RequestLog, replay


@dataclass(frozen=True)
class HotRoute:
    """A route taken the short way: its path, schema and function (whose dependencies are resolved here), and the
    shape of its API's errors. It is the request's ``scope["route"]`` as the framework's route would be: what the
    metrics and timings label by is its ``path``."""

    path: str
    schema: type[BaseModel]
    endpoint: Callable[..., Awaitable[Any]]
    error_shape: ErrorShape = native_errors


class FastPath:
    """The ASGI layer in front of the framework's own stack (inside OneWriteResponses); ``routes``, the hot routes
    by path (app/api/hot.py's ``HOT_ROUTES``)."""

    def __init__(self, app: ASGIApp, service: FastAPI, routes: Mapping[str, HotRoute]) -> None:
        self.app = app
        self.service = service
        self.routes = routes
        settings, metrics = getattr(service.state, "settings", None), getattr(service.state, "metrics", None)
        self.logged: ASGIApp = self._answer
        self.counted: dict[str, Any] = {}  # each hot route's count in the metrics
        if settings is None or metrics is None:  # not the service's application (a test's bare one): nothing is hot
            self.routes = {}
        else:
            self.logged = RequestLog(self._answer, metrics)
            self.counted = {path: metrics.short_way.labels(path) for path in self.routes}
        self.max_body_bytes = settings.max_body_bytes if settings is not None else 0
        self.cors = bool(settings is not None and settings.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if hot is None or self.cors:  # CORS answers every request's origin (and varies by it): the framework's
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if (
            not declared.isdigit()
            or int(declared) > self.max_body_bytes
            or not is_json(headers.get(b"content-type", b"").decode("latin-1"))
        ):
            await self.app(scope, receive, send)  # the framework's way: 413, CORS, a body not declared JSON
            return
        body = await read_body(receive)
        if body is None:
            return  # the client went away
        try:
            parsed = hot.schema.model_validate(orjson.loads(body))  # as FastAPI validates a body: Python mode
        except (orjson.JSONDecodeError, ValidationError):
            await self.app(scope, replay(body, receive), send)  # the framework words the 422
            return
        scope["app"] = self.service
        scope["route"] = hot
        scope["fast_path"] = (hot, parsed)
        self.counted[hot.path].inc()
        await self.logged(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Inside the request log: the route's function with its dependencies, or its ApiError's envelope."""
        hot, body = scope.pop("fast_path")
        request = Request(scope, receive)
        state = self.service.state
        try:
            await require_api_key(request)
            registry = await get_registry(request)
            response = await hot.endpoint(
                body=body, request=request, registry=registry, embeddings=state.embeddings, responder=state.responder
            )
        except Exception as error:  # as the framework's handlers answer it (install_error_handlers)
            response = route_error_response(error, hot.error_shape, scope["method"], scope["path"])
        await response(scope, receive, send)


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnects first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
