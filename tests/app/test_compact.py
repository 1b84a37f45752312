"""Compact embeddings: encoding_format binary and ubinary on /encode and /v1/embeddings, equal to
sentence-transformers' quantize_embeddings."""

from __future__ import annotations

import base64
from typing import Literal

import httpx
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from tests.helpers import assert_error

Precision = Literal["binary", "ubinary"]


def quantized(vectors: np.ndarray, precision: Precision) -> np.ndarray:
    """The reference: sentence-transformers' packed signs, as int64 for comparing with JSON numbers."""
    return np.asarray(quantize_embeddings(vectors, precision=precision)).astype(np.int64)


TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
async def test_encode_packs_signs_as_quantize_embeddings_does(
    client: httpx.AsyncClient, sentence_transformer, precision: Precision
) -> None:
    theirs = quantized(sentence_transformer.encode(TEXTS, normalize_embeddings=True), precision)
    response = await client.post("/encode", json={"texts": TEXTS, "encoding_format": precision})
    assert response.status_code == 200, response.text
    body = response.json()
    ours = np.array([item["embedding"] for item in body["data"]])
    assert ours.shape == (3, 384 // 8) and body["dim"] == 384
    assert all(isinstance(value, int) for value in body["data"][0]["embedding"])
    np.testing.assert_array_equal(ours, theirs)
    low, high = (-128, 127) if precision == "binary" else (0, 255)
    assert ours.min() >= low and ours.max() <= high


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
async def test_openai_route_and_truncated_dimensions(
    client: httpx.AsyncClient, sentence_transformer, precision: Precision
) -> None:
    full = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    theirs = quantized(full[:, :64], precision)  # Matryoshka: the first 64, then signs
    response = await client.post(
        "/v1/embeddings", json={"input": TEXTS, "encoding_format": precision, "dimensions": 64}
    )
    assert response.status_code == 200, response.text
    ours = np.array([item["embedding"] for item in response.json()["data"]])
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == (3, 8)


async def test_token_vectors_follow_the_format(client: httpx.AsyncClient) -> None:
    body = {"texts": ["Attention is all you need."], "return_token_embeddings": True}
    floats = (await client.post("/encode", json=body)).json()["data"][0]
    packed = (await client.post("/encode", json=body | {"encoding_format": "ubinary"})).json()["data"][0]
    expected = quantized(np.array(floats["token_embeddings"], dtype=np.float32), "ubinary")
    np.testing.assert_array_equal(np.array(packed["token_embeddings"]), expected)


async def test_base64_still_decodes_to_the_floats(client: httpx.AsyncClient) -> None:
    floats = (await client.post("/encode", json={"texts": TEXTS})).json()["data"]
    coded = (await client.post("/encode", json={"texts": TEXTS, "encoding_format": "base64"})).json()["data"]
    for a, b in zip(floats, coded, strict=True):
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(b["embedding"]), "<f4"), a["embedding"], atol=1e-7)


@pytest.mark.parametrize("path", ["/encode", "/v1/embeddings"])
async def test_dimensions_must_be_a_multiple_of_8_for_packed_formats(client: httpx.AsyncClient, path: str) -> None:
    field = "texts" if path == "/encode" else "input"
    for precision in ("binary", "ubinary"):
        response = await client.post(path, json={field: TEXTS, "encoding_format": precision, "dimensions": 60})
        assert_error(response, 422, "validation_error", "dimensions", "multiple of 8")
    ok = await client.post(path, json={field: TEXTS, "encoding_format": "float", "dimensions": 60})
    assert ok.status_code == 200
    unknown = await client.post(path, json={field: TEXTS, "encoding_format": "int8"})
    assert_error(unknown, 422, "validation_error", "encoding_format")


@pytest.mark.parametrize("width", [1, 7, 20, 33])
def test_a_width_that_is_not_a_multiple_of_8_is_padded_as_quantize_embeddings_pads(width: int) -> None:
    from app.serialization import packed_signs

    vectors = np.random.default_rng(width).standard_normal((4, width)).astype(np.float32)
    for precision in ("binary", "ubinary"):
        packed = packed_signs(vectors, signed=precision == "binary")
        assert packed.dtype == (np.int8 if precision == "binary" else np.uint8)
        np.testing.assert_array_equal(packed, quantized(vectors, precision))
