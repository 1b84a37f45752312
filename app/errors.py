"""Every error as the JSON envelope of API.md: ``{"error": {"type", "message", "param"}}``."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match, compile_path
from starlette.types import Scope

from app.serialization import json_response

logger = logging.getLogger(__name__)

# HTTP status → error type, for errors raised by the framework rather than by us.
STATUS_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "validation_error",
    429: "overloaded",
    503: "not_ready",
}


# What FastAPI raises (as a 400) when it cannot read a body as JSON at all; API.md makes that a 422.
FASTAPI_BODY_ERROR = "There was an error parsing the body"


class ApiError(Exception):
    """An error the client should see, with its status, type and the request field it concerns."""

    status_code = 400
    type = "bad_request"
    code: str | None = None  # a stable code beside the type, for clients that read one (OpenAI's)

    def __init__(self, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers


class ModelNotFound(ApiError):
    status_code = 404
    type = "model_not_found"
    code = "model_not_found"

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"model: no model named {name!r} is served (served: {', '.join(available)})", "model")


class InvalidRequest(ApiError):
    status_code = 422
    type = "validation_error"

    def __init__(self, param: str | None, problem: str) -> None:
        super().__init__(f"{param}: {problem}" if param else problem, param)


class CannotDo(InvalidRequest):
    """The model a request names cannot do what the request asks: a 422 on ``model`` that names the model. ``task``
    is what it cannot do (``classify``, ``rerank``, ``sparse``, …): the services refuse it once, and an API whose
    contract words the refusal its own way (TEI's 424) writes it from that."""

    def __init__(self, message: str, task: str) -> None:
        super().__init__("model", message)
        self.task = task


class ModelLacks(CannotDo):
    """The model has not what the request needs (a head, an output): the message names what it lacks, and where a
    model has it."""

    def __init__(self, name: str, lacks: str, task: str) -> None:
        super().__init__(f"model {name!r} has no {lacks}", task)


class Unauthorized(ApiError):
    status_code = 401
    type = "unauthorized"


class Overloaded(ApiError):
    status_code = 429
    type = "overloaded"


class Timeout(ApiError):
    """The request waited past its deadline and was dropped before it was computed."""

    status_code = 503
    type = "timeout"


class InferenceFailed(ApiError):
    """The model raised while computing this request (alone, after its pass was retried request by request)."""

    status_code = 503
    type = "inference_failed"


class NotReady(ApiError):
    status_code = 503
    type = "not_ready"


def error_body(type_: str, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type_, "message": message, "param": param}
    if code is not None:
        body["code"] = code
    return {"error": body}


@dataclass(frozen=True)
class Failure:
    """An error to write: its status, our error type, the message, the request field at fault, headers, a code, and
    where the model cannot do what the request asks, the task it cannot do (CannotDo)."""

    status: int
    type: str
    message: str
    param: str | None = None
    headers: dict | None = None
    code: str | None = None
    refused_task: str | None = None


ErrorShape = Callable[[Failure], Response]  # how an API writes its errors


def native_errors(failure: Failure) -> Response:
    """Ours: the envelope of API.md."""
    body = error_body(failure.type, failure.message, failure.param, failure.code)
    return json_response(body, status_code=failure.status, headers=failure.headers)


def errors_in(shape: ErrorShape) -> type[APIRoute]:
    """The route class of a router whose routes answer their errors in ``shape`` (``APIRouter(route_class=…)``);
    including the router elsewhere keeps it."""
    return type(f"Route_{getattr(shape, '__name__', 'shaped')}", (APIRoute,), {"error_shape": staticmethod(shape)})


def shape_of(router: APIRouter) -> ErrorShape:
    """The shape the router's routes write their errors in (``errors_in``; ours by default)."""
    shape: ErrorShape = getattr(router.route_class, "error_shape", native_errors)
    return shape


class ErrorShapes:
    """Which shape a request's error takes: that of the route it reached (its router's, ``errors_in``), else ours.
    A request that reached no route (a path nothing serves) takes the shape of the API whose prefix it is under,
    as the app includes the API's router there (``claim``)."""

    def __init__(self) -> None:
        self._prefixes: list[tuple[re.Pattern[str], ErrorShape]] = []

    def claim(self, prefix: str, shape: ErrorShape) -> None:
        """Paths under ``prefix`` (a route path, parameters allowed) that no route takes answer in ``shape``."""
        for path in (prefix, prefix.rstrip("/") + "/{rest:path}"):
            # DOTALL: a path the routes could not take for a line break in a model's name is still under the prefix
            claimed = (re.compile(compile_path(path)[0].pattern, re.DOTALL), shape)
            if claimed not in self._prefixes:  # several routers of one API under one prefix (TEI's two)
                self._prefixes.append(claimed)

    def of(self, scope: Scope) -> ErrorShape:
        shape = getattr(scope.get("route"), "error_shape", None)
        if shape is not None:
            return shape
        path = scope.get("path", "")
        return next((shape for pattern, shape in self._prefixes if pattern.match(path)), native_errors)


def api_error_response(error: ApiError, shape: ErrorShape = native_errors) -> Response:
    """An ApiError's envelope in ``shape``, logged (the status the shape answers with, the type and message; never the
    body)."""
    refused_task = error.task if isinstance(error, CannotDo) else None
    response = shape(
        Failure(error.status_code, error.type, error.message, error.param, error.headers, error.code, refused_task)
    )
    logger.info("%d %s: %s", response.status_code, error.type, error.message)
    return response


def internal_error_response(method: str, path: str, shape: ErrorShape = native_errors) -> Response:
    """The 500 envelope of an error nobody expected, in ``shape``; its traceback is logged (call it in the except
    block)."""
    logger.exception("unhandled error on %s %s", method, path)
    return shape(Failure(500, "internal_error", "internal error: the service logged the details"))


UNION_MEMBER_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "tuple"})


class EntryError(ValueError):
    """A validator's complaint about one entry of a list field, or of a list inside one: ``path`` indexes it
    (``(1, 0)``: the first item of the second entry), and the error's param names it (``input[1][0]``)."""

    def __init__(self, path: tuple[int, ...], problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def param_path(loc: Sequence[str | int], located: bool = True) -> str | None:
    """('body', 'texts', 3) → 'texts[3]'; ('query', 'length') → 'length'. Without ``located`` (the error of a
    model built from values, not of a request's body, query or path), ('query',) → 'query'.

    pydantic puts the member of a union that failed into the location ('function-after[…]', 'list[int]',
    'str'): those are its names, not the client's, and are left out.
    """
    parts = list(loc[1:] if located and loc and loc[0] in ("body", "query", "path", "header") else loc)
    parts = [p for p in parts if isinstance(p, int) or (p.isidentifier() and p not in UNION_MEMBER_TAGS)]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def telling(errors: Sequence[Any], located: bool = True) -> dict[str, Any]:
    """The error to report of a failed validation: of those of the first field at fault, the one that got furthest
    into the client's value. A union (TEI's ``inputs``: a string, token ids, or a list of both) fails once for each
    of its members, and the first is rarely the one the client meant: ``[[false]]`` fails as a string at ``inputs``
    and as a token id at ``inputs[0][0]``, which is the one to name."""

    def field(error: dict[str, Any]) -> str:
        return re.split(r"[\[.]", param_path(error.get("loc", ()), located) or "", maxsplit=1)[0]

    def reached(error: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
        """How deep into the value the error is, then how far along its lists."""
        path = param_path(error.get("loc", ()), located) or ""
        indices = tuple(int(index) for index in re.findall(r"\[(\d+)\]", path))
        return path.count("[") + path.count("."), indices

    first = field(errors[0])
    return max((error for error in errors if field(error) == first), key=reached)


def validation_message(error: dict[str, Any], located: bool = True) -> tuple[str, str | None]:
    """A pydantic/FastAPI error as (message, param), worded for a client (``located``: as ``param_path``)."""
    if error.get("type") == "json_invalid":
        reason = error.get("ctx", {}).get("error", "invalid JSON")
        return f"malformed JSON body: {reason}", "body"
    param = param_path(error.get("loc", ()), located)
    if error.get("type") == "missing" and param is None:
        return "a JSON request body is required", "body"
    problem = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, EntryError):  # one entry of the field: named as texts[3] is
        param = (param or "") + "".join(f"[{index}]" for index in cause.path)
        problem = cause.problem
    problem = problem[:1].lower() + problem[1:]
    if error.get("type") == "extra_forbidden":
        problem = "unknown field"
    return (f"{param}: {problem}" if param else problem), param


def refusal(error: ValidationError) -> InvalidRequest:
    """A model built from a request's values (another API's request translated into ours, TEI's dispatched body)
    refused them: the 422 of its telling error, worded as a route's own validation error."""
    message, param = validation_message(telling(error.errors(), located=False), located=False)
    refused = InvalidRequest(None, message)  # the message names the field already
    refused.param = param
    return refused


def route_error_response(error: Exception, shape: ErrorShape, method: str, path: str) -> Response:
    """The envelope in ``shape`` of what a route raised: an ApiError's own, a translated request's refusal (a 422),
    anything else the 500 with its traceback logged (call it in the except block)."""
    if isinstance(error, ApiError):
        return api_error_response(error, shape)
    if isinstance(error, ValidationError):
        return api_error_response(refusal(error), shape)
    return internal_error_response(method, path, shape)


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header declares JSON (application/json, or any type ending in +json)."""
    if not content_type:
        return False
    subtype = content_type.split(";", 1)[0].strip().lower().rpartition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """A 405's ``Allow``: every method some route answers on the request's path (the framework names those of the
    first route that has the path, and /health's GET and HEAD are two routes); empty where no route of the app's
    own has the path (a static file's, whose 405 is its own)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in HTTP_METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    )


def install_error_handlers(app: FastAPI, shapes: ErrorShapes) -> None:
    """Every error as an envelope in the shape of the API the request went to (``shapes``)."""

    @app.exception_handler(ApiError)  # and a translated request's refusal (ValidationError), the 500 (Exception)
    async def route_error(request: Request, exc: Exception) -> Response:
        return route_error_response(exc, shapes.of(request.scope), request.method, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, exc: RequestValidationError) -> Response:
        error = telling(exc.errors())
        message, param = validation_message(error)
        if tuple(error.get("loc", ())) == ("body",) and error.get("type") != "missing":  # the body as a whole
            param = "body"
            content_type = request.headers.get("content-type")
            if is_json(content_type):
                message = "the body must be a JSON object"
            else:  # FastAPI reads a body as JSON only when it is declared so; else validation sees bytes
                sent = f"this request's Content-Type is {content_type!r}" if content_type else "this request has none"
                message = f"the body must be JSON, sent with Content-Type: application/json; {sent}"
        logger.info("422 validation_error: %s", message)  # the problem, never the body
        return shapes.of(request.scope)(Failure(422, "validation_error", message, param))

    app.add_exception_handler(ValidationError, route_error)  # TEI's request refused in translation: a 422

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:  # the body could not be read as JSON
            if isinstance(exc.__cause__, RecursionError):  # json.loads gives up on arrays or objects nested deeply
                message = "malformed JSON body: it is nested too deeply to parse"
            elif isinstance(exc.__cause__, UnicodeDecodeError):
                message = "malformed JSON body: it could not be decoded as UTF-8 JSON"
            else:
                message = "malformed JSON body: it could not be parsed"
            return shapes.of(request.scope)(Failure(422, "validation_error", message, "body"))
        type_ = STATUS_TYPES.get(exc.status_code, "http_error")
        if exc.status_code == 404:
            message = f"no route {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405 and (allowed := allowed_methods(request)):
            headers = {**(headers or {}), "Allow": allowed}
        return shapes.of(request.scope)(Failure(exc.status_code, type_, message, None, headers))

    app.add_exception_handler(Exception, route_error)
