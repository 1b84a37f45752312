"""The hot routes' short way in (app/web/fast_path.py) answers exactly as the framework's way does.

An ordinary request (JSON, Content-Length) goes the short way; the same body sent chunked (no Content-Length)
goes the framework's way. Each pair must agree in status, body and headers, for good requests and bad.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, serving

VARYING_HEADERS = {
    "x-request-id",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "x-serialization-time",
    "content-length",
}


def chunked(body: bytes) -> AsyncIterator[bytes]:
    """The body as a stream of two chunks: sent without Content-Length."""

    async def parts() -> AsyncIterator[bytes]:
        yield body[: len(body) // 2]
        yield body[len(body) // 2 :]

    return parts()


async def both_ways(
    client: httpx.AsyncClient, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, httpx.Response]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    short = await client.post(path, content=body, headers=headers)
    framework = await client.post(path, content=chunked(body), headers=headers)
    return short, framework


def assert_same(short: httpx.Response, framework: httpx.Response, request_ids: bool = True) -> Any:
    assert short.status_code == framework.status_code, (short.text, framework.text)
    assert {k: v for k, v in short.headers.items() if k not in VARYING_HEADERS} == {
        k: v for k, v in framework.headers.items() if k not in VARYING_HEADERS
    }
    assert set(short.headers) - {"x-request-id"} == set(framework.headers) - {"x-request-id"}
    assert "x-request-id" in short.headers and ("x-request-id" in framework.headers) is request_ids
    one, other = short.json(), framework.json()
    if short.status_code == 200:
        vectors = [np.array(item["embedding"]) for item in one["data"] if isinstance(item["embedding"], list)]
        again = [np.array(item["embedding"]) for item in other["data"] if isinstance(item["embedding"], list)]
        for a, b in zip(vectors, again, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
        for item in (*one["data"], *other["data"]):
            item.pop("embedding")
    assert one == other
    return one


async def short_way(client: httpx.AsyncClient) -> Counter[str]:
    """The requests each hot route answered the short way, as /metrics counts them."""
    found: Counter[str] = Counter()
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        if family.name == "encoder_short_way_requests":
            found.update({s.labels["route"]: int(s.value) for s in family.samples if s.name.endswith("_total")})
    return +found  # the routes none took left out


GOOD = [
    ("/encode", {"texts": "one sentence"}),
    ("/encode", {"texts": ["one", "two more words"], "return_tokens": True, "dimensions": 8}),
    ("/encode", {"texts": ["é ü"], "encoding_format": "base64", "normalize": False, "pooling": "cls"}),
    ("/encode", {"texts": "tokens too", "return_token_embeddings": True}),
    ("/v1/embeddings", {"input": "a string"}),
    ("/v1/embeddings", {"input": ["a", "list"], "model": "all-MiniLM-L6-v2", "dimensions": 4}),
    ("/v1/embeddings", {"input": [101, 7592, 102], "encoding_format": "base64"}),
    ("/encode", {"texts": "x", "truncate": False}),
]

# (path, body, status, type, param, whether the short way answers it: what fails the schema, or is no JSON, the
# framework words)
BAD = [
    ("/encode", b'{"texts": 3}', 422, "validation_error", "texts", False),
    ("/encode", b'{"texts": "x", "colour": 1}', 422, "validation_error", "colour", False),
    ("/encode", b'{"texts": "x", "dimensions": 0}', 422, "validation_error", "dimensions", False),
    ("/encode", b'{"texts": [', 422, "validation_error", "body", False),
    ("/encode", b"[1, 2]", 422, "validation_error", "body", False),
    ("/encode", b"\xff\xfe", 422, "validation_error", "body", False),
    ("/v1/embeddings", b'{"input": []}', 422, "validation_error", "input", False),
    ("/encode", b'{"texts": "x", "layer": 99}', 422, "validation_error", "layer", True),
    ("/encode", b'{"texts": "x", "model": "nobody"}', 404, "model_not_found", "model", True),
    ("/encode", b'{"texts": "x", "dimensions": 100000}', 422, "validation_error", "dimensions", True),
    ("/encode", b'{"texts": "x", "prompt_name": "query"}', 422, "validation_error", "prompt_name", True),
    ("/v1/embeddings", b'{"input": [99999999]}', 422, "validation_error", "input[0]", True),
]


async def test_good_requests_go_the_short_way_and_answer_as_the_framework_does(bundled_model: TextEncoder) -> None:
    async with serving(Settings(), bundled_model) as service:
        for path, body in GOOD:
            short, framework = await both_ways(service.client, path, orjson.dumps(body))
            assert short.status_code == 200, short.text
            assert_same(short, framework)
        assert await short_way(service.client) == Counter(
            [path for path, _ in GOOD]
        )  # the chunked ones went the framework's way


async def test_bad_requests_get_the_same_envelope_either_way(bundled_model: TextEncoder) -> None:
    async with serving(Settings(), bundled_model) as service:
        for path, body, status, type_, param, _ in BAD:
            short, framework = await both_ways(service.client, path, body)
            error = assert_same(short, framework)["error"]
            assert (short.status_code, error["type"], error["param"]) == (status, type_, param)
        assert await short_way(service.client) == Counter([path for path, *_, taken in BAD if taken])


async def test_keys_and_content_types(bundled_model: TextEncoder) -> None:
    async with serving(Settings(api_keys="secret"), bundled_model) as service:
        body = b'{"texts": "x"}'
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic secret"}):
            short, framework = await both_ways(service.client, "/encode", body, headers)
            assert_same(short, framework)
            assert_error(short, 401, "unauthorized")
            assert short.headers["www-authenticate"] == "Bearer"
        key = {"Authorization": "Bearer secret"}
        short, framework = await both_ways(service.client, "/encode", body, key)
        assert_same(short, framework)
        assert await short_way(service.client) == Counter(["/encode"] * 4)
        plain = await service.client.post("/encode", content=body, headers={"Content-Type": "text/plain", **key})
        assert_error(plain, 422, "validation_error", "body", "Content-Type")
        assert await short_way(service.client) == Counter(["/encode"] * 4)


async def test_with_cors_every_request_goes_the_framework_way(bundled_model: TextEncoder) -> None:
    """CORS answers (and varies by) every request's origin: those are the framework's."""
    async with serving(Settings(cors_origins="https://notebook.example"), bundled_model) as service:
        origin = {"Origin": "https://notebook.example"}
        response = await service.client.post("/encode", json={"texts": "x"}, headers=origin)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://notebook.example"
        assert (await service.client.post("/encode", json={"texts": "x"})).headers["vary"] == "Origin"
        assert await short_way(service.client) == Counter([])


async def test_an_unexpected_failure_is_the_500_envelope_and_the_service_goes_on(
    bundled_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(Settings(), bundled_model) as service:
        embeddings = service.app.state.embeddings
        transport = httpx.ASGITransport(app=service.app, raise_app_exceptions=False)  # as a server answers
        client = httpx.AsyncClient(transport=transport, base_url="http://testserver")

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug")

        with monkeypatch.context() as patched:
            patched.setattr(embeddings, "encode", broken)
            short, framework = await both_ways(client, "/encode", b'{"texts": "x"}')
            assert_same(short, framework, request_ids=False)  # the framework's 500 comes from outside the log's layer
            assert_error(short, 500, "internal_error")
            tei_short, tei_framework = await both_ways(client, "/tei/embed", b'{"inputs": "x"}')
            assert_same(tei_short, tei_framework, request_ids=False)  # in TEI's shape, as its routes answer
            assert tei_short.json() == {
                "error": "Backend error: internal error: the service logged the details",
                "error_type": "Backend",
            }
        assert (await service.client.post("/encode", json={"texts": "x"})).status_code == 200
        assert await short_way(service.client) == Counter(["/encode", "/encode", "/tei/embed"])


# TEI's and Cohere's embedding routes go the short way too, each answering in its own shape
OTHER_SHAPES = [
    ("/tei/embed", b'{"inputs": ["one", "two more words"]}', 200),
    ("/tei/embed", b'{"inputs": "x", "dimensions": 8, "normalize": false, "unknown": 1}', 200),
    ("/v2/embed", b'{"model": "all-MiniLM-L6-v2", "texts": ["a"], "input_type": "search_query"}', 200),
    ("/tei/embed", b'{"inputs": []}', 400),
    ("/tei/embed", b'{"inputs": ["fine", "broken \\ud800 text"]}', 422),
    ("/tei/embed", b'{"inputs": "x", "truncation_direction": "Left"}', 200),
    ("/v2/embed", b'{"model": "nobody", "texts": ["a"], "input_type": "search_query"}', 404),
    (
        "/v2/embed",
        b'{"model": "all-MiniLM-L6-v2", "texts": ["a"], "input_type": "search_query", "truncate": "START"}',
        422,
    ),
]


async def test_tei_and_cohere_embeddings_answer_the_same_either_way(bundled_model: TextEncoder) -> None:
    async with serving(Settings(), bundled_model) as service:
        for path, body, status in OTHER_SHAPES:
            short, framework = await both_ways(service.client, path, body)
            assert (short.status_code, framework.status_code) == (status, status), (short.text, framework.text)
            one, other = short.json(), framework.json()
            if status != 200:
                assert one == other and ("error_type" in one if path.startswith("/tei") else set(one) == {"message"})
            elif path == "/tei/embed":
                np.testing.assert_allclose(one, other, atol=1e-6)
            else:
                np.testing.assert_allclose(one["embeddings"]["float"], other["embeddings"]["float"], atol=1e-6)
                assert one["texts"] == other["texts"] and one["meta"] == other["meta"]
        # the short way took each but the lone surrogate, which orjson refuses to read (the framework words it)
        assert await short_way(service.client) == Counter(
            [path for path, body, _ in OTHER_SHAPES if b"ud800" not in body]
        )
