"""JSON through orjson, numpy arrays serialised natively (no Python lists of floats in between)."""

from __future__ import annotations

import base64
import functools
import io
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel
from starlette.responses import Response

ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@functools.cache
def _always_written(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a response model written even when not set: those whose default is not None."""
    return frozenset(name for name, info in model.model_fields.items() if info.default is not None)


def _fields(value: Any) -> dict[str, Any] | np.ndarray:
    """A response model's fields in declaration order; optional ones (default None) only when set.

    Responses are built with ``model_construct``, which keeps numpy arrays as they are; orjson then
    writes them natively, with no Python lists of floats in between.
    """
    if isinstance(value, BaseModel):
        written = value.model_fields_set | _always_written(type(value))
        return {name: field for name, field in value.__dict__.items() if name in written}
    if isinstance(value, np.ndarray):  # one orjson cannot write as it is (float16, not contiguous)
        return np.ascontiguousarray(value, dtype=np.float32)
    raise TypeError(f"cannot serialise {type(value).__name__}")


M = TypeVar("M", bound=BaseModel)


def construct(schema: type[M], /, **fields: Any) -> M:
    """A response model built without validation, so that numpy arrays stay arrays where the schema says
    lists (orjson writes them natively); fields left out are left out of the JSON too."""
    return schema.model_construct(**fields)


def dumps(content: Any) -> bytes:
    return orjson.dumps(content, default=_fields, option=ORJSON_OPTIONS)


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return ORJSONResponse(content, status_code=status_code, headers=headers)


NPZ_MEDIA_TYPE = "application/x-npz"


def npz(arrays: dict[str, Any]) -> bytes:
    """Arrays as an uncompressed NumPy .npz archive (``numpy.load`` reads it, allow_pickle not needed)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def accepts_npz(accept: str | None) -> bool:
    """Whether an Accept header asks for application/x-npz (with a q-value above 0)."""
    for media_range in (accept or "").split(","):
        media_type, *parameters = (part.strip() for part in media_range.split(";"))
        if media_type.lower() != NPZ_MEDIA_TYPE:
            continue
        q = next((p.partition("=")[2] for p in parameters if p.replace(" ", "").lower().startswith("q=")), "1")
        try:
            return float(q) > 0
        except ValueError:
            return True
    return False


def base64_float32(vector: np.ndarray) -> str:
    """A vector as the base64 of its little-endian float32 bytes (OpenAI's encoding_format=base64)."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def packed_signs(vectors: np.ndarray, signed: bool) -> np.ndarray:
    """Each row's signs (x > 0 is 1) packed 8 to a byte, the last byte padded with zeros: uint8, or with ``signed``
    int8 (byte - 128): sentence-transformers' quantize_embeddings at precision ubinary and binary."""
    packed = np.packbits(vectors > 0, axis=-1)
    return (packed.astype(np.int16) - 128).astype(np.int8) if signed else packed


def vectors_as(encoding_format: str, vectors: np.ndarray) -> list[Any]:
    """Each row of ``vectors`` (n, d) in an encoding_format of the API: float (the row itself, written as
    numbers), base64 of its float32 bytes, or its packed signs (binary, ubinary)."""
    if encoding_format == "base64":
        return [base64_float32(v) for v in vectors]
    if encoding_format in ("binary", "ubinary"):
        return list(packed_signs(vectors, signed=encoding_format == "binary"))
    return list(vectors)
