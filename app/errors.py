"""Every error as the JSON envelope of API.md: ``{"error": {"type", "message", "param"}}``."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class and attributes, whatever its constructor takes: the engine sends the error itself
        to the front end (app/engine/remote.py), which raises it as it is."""
        return (_unpickled, (type(self), self.message), self.__dict__)


def _unpickled(cls: type[ApiError], message: str) -> ApiError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error  # its attributes are set from the pickled state


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


class PayloadTooLarge(ApiError):
    status_code = 413
    type = "payload_too_large"


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


def error_response(
    status: int,
    type_: str,
    message: str,
    param: str | None = None,
    headers: dict | None = None,
    code: str | None = None,
) -> Response:
    return json_response(error_body(type_, message, param, code), status_code=status, headers=headers)


def api_error_response(error: ApiError, path: str = "") -> Response:
    """An ApiError's envelope, logged (its status, type and message; never the body)."""
    logger.info("%d %s: %s", error.status_code, error.type, error.message)
    return shaped_error_response(
        path, error.status_code, error.type, error.message, error.param, error.headers, error.code
    )


def shaped_error_response(
    path: str,
    status: int,
    type_: str,
    message: str,
    param: str | None = None,
    headers: dict | None = None,
    code: str | None = None,
) -> Response:
    """An error in the shape of the API the path belongs to: TEI's under /tei, Cohere's under /v2, else ours."""
    if tei_path(path):
        return tei_error_response(status, type_, message, headers)
    if COHERE_PATH.match(path):
        return json_response({"message": message}, status_code=status, headers=headers)
    return error_response(status, type_, message, param, headers, code)


# Text-embeddings-inference's routes (app/api/tei.py) answer errors in its shape: {"error", "error_type"}.
TEI_PATH = re.compile(r"^(/models/[^/]*)?/tei(/|$)")  # a name of control characters reads as empty
# our error type → TEI's error_type and status
TEI_ERRORS: dict[str, tuple[str, int]] = {
    "validation_error": ("Validation", 422),
    "payload_too_large": ("Validation", 413),
    "empty": ("Empty", 400),
    "wrong_model_kind": ("Backend", 424),
    "inference_failed": ("Backend", 424),
    "overloaded": ("Overloaded", 429),
    "not_ready": ("Unhealthy", 503),
    "timeout": ("Overloaded", 503),
}


def tei_path(path: str) -> bool:
    return bool(TEI_PATH.match(path))


# Cohere's routes (app/api/cohere.py) answer errors in its shape: {"message"}.
COHERE_PATH = re.compile(r"^/v2/")


def tei_error_response(status: int, type_: str, message: str, headers: dict | None = None) -> Response:
    """An error in TEI's shape: its error_type and status where TEI has one for it, else ours with Validation."""
    error_type, tei_status = TEI_ERRORS.get(type_, ("Validation", status))
    return json_response({"error": message, "error_type": error_type}, status_code=tei_status, headers=headers)


def internal_error_response(method: str, path: str) -> Response:
    """The 500 envelope of an error nobody expected; its traceback is logged (call it in the except block)."""
    logger.exception("unhandled error on %s %s", method, path)
    return error_response(500, "internal_error", "internal error: the service logged the details")


UNION_MEMBER_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "tuple"})


class EntryError(ValueError):
    """A validator's complaint about one entry of a list field, or of a list inside one: ``path`` indexes it
    (``(1, 0)``: the first item of the second entry), and the error's param names it (``input[1][0]``)."""

    def __init__(self, path: tuple[int, ...], problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def param_path(loc: Sequence[str | int]) -> str | None:
    """('body', 'texts', 3) → 'texts[3]'; ('query', 'length') → 'length'.

    pydantic puts the member of a union that failed into the location ('function-after[…]', 'list[int]',
    'str'): those are its names, not the client's, and are left out.
    """
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    parts = [p for p in parts if isinstance(p, int) or (p.isidentifier() and p not in UNION_MEMBER_TAGS)]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    """A pydantic/FastAPI error as (message, param), worded for a client."""
    if error.get("type") == "json_invalid":
        reason = error.get("ctx", {}).get("error", "invalid JSON")
        return f"malformed JSON body: {reason}", "body"
    param = param_path(error.get("loc", ()))
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


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header declares JSON (application/json, or any type ending in +json)."""
    if not content_type:
        return False
    subtype = content_type.split(";", 1)[0].strip().lower().rpartition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return api_error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, exc: RequestValidationError) -> Response:
        error = exc.errors()[0]
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
        return shaped_error_response(request.url.path, 422, "validation_error", message, param)

    @app.exception_handler(ValidationError)
    async def translated_request_error(request: Request, exc: ValidationError) -> Response:
        """A request in another API's shape (TEI's) whose translation into the native one was refused: the client's
        values, so a 422 as the native route gives."""
        message, param = validation_message(exc.errors()[0])  # type: ignore[arg-type]
        refused = InvalidRequest(None, message)  # the message names the field already
        refused.param = param
        return api_error_response(refused, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:  # the body could not be read as JSON
            if isinstance(exc.__cause__, RecursionError):  # json.loads gives up on arrays or objects nested deeply
                message = "malformed JSON body: it is nested too deeply to parse"
            elif isinstance(exc.__cause__, UnicodeDecodeError):
                message = "malformed JSON body: it could not be decoded as UTF-8 JSON"
            else:
                message = "malformed JSON body: it could not be parsed"
            return shaped_error_response(request.url.path, 422, "validation_error", message, "body")
        type_ = STATUS_TYPES.get(exc.status_code, "http_error")
        if exc.status_code == 404:
            message = f"no route {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return shaped_error_response(
            request.url.path, exc.status_code, type_, message, None, getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        return internal_error_response(request.method, request.url.path)
