"""JSON through orjson, numpy arrays serialised natively (no Python lists of floats in between)."""

from __future__ import annotations

import base64
import functools
import zipfile
from collections.abc import Iterator
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


class _Parts:
    """A file that keeps what is written to it, as it was given (bytes, or views of arrays' memory)."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []

    def write(self, data: bytes | memoryview) -> int:
        self.parts.append(data)
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def npz_parts(arrays: dict[str, Any]) -> list[bytes | memoryview]:
    """Arrays as an uncompressed NumPy .npz archive (``numpy.load`` reads it, allow_pickle not needed), in the
    parts it is sent in: the archive's and each array's headers as bytes, each array's data as a view of the
    array's own memory. ``numpy.savez`` into a buffer took 80 MiB more than the arrays for a 72 MiB archive (the
    data copied a 16 MiB chunk at a time into a buffer grown by reallocation); these parts take 2 MiB."""
    sink = _Parts()
    with zipfile.ZipFile(sink, mode="w", compression=zipfile.ZIP_STORED) as archive:  # sink cannot seek: sizes after
        for name, value in arrays.items():
            array = np.asarray(value)
            if not array.flags.c_contiguous:
                array = array.copy(order="C")  # (ascontiguousarray would make a 0-d array 1-d)
            if array.dtype.hasobject:
                raise TypeError(f"{name}: an array of Python objects has no .npy form without pickle")
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:  # as numpy.savez writes them
                header = np.lib.format.header_data_from_array_1_0(array)
                try:
                    np.lib.format.write_array_header_1_0(member, header)
                except ValueError:  # a header over 64 KiB
                    np.lib.format.write_array_header_2_0(member, header)
                member.write(array.reshape(-1).view(np.uint8).data)
    return sink.parts


SENT_PART_BYTES = 1 << 20  # a large answer is handed to the transport this much at a time


def sent_in_parts(parts: list[bytes | memoryview]) -> Iterator[bytes]:
    """The parts as the transport takes them: at most SENT_PART_BYTES each, copied only as each is sent. uvicorn
    waits for a slow client to drain its buffer between them, so that a large answer is not copied whole into the
    transport's buffer."""
    for part in parts:
        if isinstance(part, bytes) and len(part) <= SENT_PART_BYTES:
            yield part
            continue
        view = memoryview(part)
        for start in range(0, view.nbytes, SENT_PART_BYTES):
            yield bytes(view[start : start + SENT_PART_BYTES])


def parts_length(parts: list[bytes | memoryview]) -> int:
    return sum(memoryview(part).nbytes for part in parts)


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
