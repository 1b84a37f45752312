"""JSON through orjson, numpy arrays serialised natively (no Python lists of floats in between)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(content: Any) -> bytes:
    return orjson.dumps(content, option=ORJSON_OPTIONS)


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return ORJSONResponse(content, status_code=status_code, headers=headers)


def base64_float32(vector: np.ndarray) -> str:
    """A vector as the base64 of its little-endian float32 bytes (OpenAI's encoding_format=base64)."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
