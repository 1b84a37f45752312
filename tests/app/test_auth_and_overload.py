"""401 unauthorized with API keys configured; 429 overloaded when the work queue is full."""

from __future__ import annotations

import asyncio
import functools
import operator

import httpx
import pytest

from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, busy, serve, serving, until_metric

KEYS = "first-key, second-key"


@pytest.fixture(scope="module")
async def guarded(bundled_model: TextEncoder):
    async with serve(Settings(api_keys=KEYS), bundled_model) as client:
        yield client


def test_keys_are_read_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENCODER_API_KEYS", KEYS)
    keys = [key.get_secret_value() for key in Settings().api_keys]
    assert keys == ["first-key", "second-key"]
    assert "first-key" not in repr(Settings())  # never shown in logs or reprs


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({}, "API key is required"),  # no key
        ({"authorization": "Bearer wrong-key"}, "not valid"),  # a wrong key
        ({"authorization": "Bearer first-ke"}, "not valid"),  # a prefix of a right key
        ({"authorization": "Basic first-key"}, "API key is required"),  # the wrong scheme
        ({"authorization": "Bearer "}, "API key is required"),  # an empty key
    ],
)
async def test_requests_without_a_right_key_are_401(guarded: httpx.AsyncClient, headers: dict, words: str) -> None:
    for method, path, body in [
        ("POST", "/encode", {"texts": "x"}),
        ("POST", "/attention", {"text": "x"}),
        ("GET", "/info", None),
        ("GET", "/positional-encoding", None),
    ]:
        response = await guarded.request(method, path, json=body, headers=headers)
        assert_error(response, 401, "unauthorized", None, words)
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("key", ["first-key", "second-key"])
async def test_each_configured_key_is_accepted(guarded: httpx.AsyncClient, key: str) -> None:
    response = await guarded.post("/encode", json={"texts": "x"}, headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert (await guarded.get("/info", headers={"authorization": f"Bearer {key}"})).json()["auth"] is True


async def test_health_and_docs_stay_open(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.get("/health")).json() == {"status": "ok"}
    assert (await guarded.get("/openapi.json")).status_code == 200


async def test_full_queue_answers_429_with_retry_after_then_recovers(bundled_model: TextEncoder) -> None:
    async with serving(Settings(max_queue_texts=2), bundled_model) as service:
        client = service.client
        async with busy(service.model):
            blockers = [asyncio.ensure_future(client.post("/encode", json={"texts": t})) for t in "ab"]  # fill it
            await until_metric(client, "encoder_admitted_texts", lambda admitted: admitted == 2)
            response = await client.post("/encode", json={"texts": "x"})
            assert_error(response, 429, "overloaded", None, "queue is full")
            assert int(response.headers["retry-after"]) >= 1
            assert (await client.get("/health")).status_code == 200  # the loop still answers
        assert [r.status_code for r in await asyncio.gather(*blockers)] == [200, 200]
        assert (await client.post("/encode", json={"texts": "x"})).status_code == 200


async def test_every_api_counts_a_request_as_the_texts_of_its_native_request(bundled_model: TextEncoder) -> None:
    """Admission counts what a request brings to the queue, whichever API's shape it came in: the texts (or inputs,
    or documents) and, for a similarity, its source too."""
    sent = [
        ("/encode", {"texts": ["a", "b", "c"]}, 3),
        ("/v1/embeddings", {"input": ["a", "b"]}, 2),
        ("/v1/embeddings", {"input": [101, 102]}, 1),  # one text's token ids
        ("/tei/embed", {"inputs": ["a", "b", "c", "d"]}, 4),
        ("/similarity", {"source": "a", "texts": ["b"]}, 2),
        ("/tei/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}, 3),
        ("/tei/embed", {"inputs": [[101, 102], "a", "b"]}, 3),  # token ids and texts in one batch
        ("/rerank", {"query": "a", "documents": ["b", "c"]}, 2),
        ("/tei/rerank", {"query": "a", "texts": ["b", "c", "d"]}, 3),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}, 1),
        ("/v2/rerank", {"model": bundled_model.card.name, "query": "a", "documents": ["b", "c"]}, 2),
        ("/v2/embed", {"model": bundled_model.card.name, "texts": ["a", "b"], "input_type": "search_query"}, 2),
    ]
    async with serving(Settings(), bundled_model) as service:
        client = service.client
        async with busy(service.model):
            admitted, waiting = 0, []
            for path, body, texts in sent:
                waiting.append(asyncio.ensure_future(client.post(path, json=body)))
                admitted += texts
                await until_metric(
                    client, "encoder_admitted_texts", functools.partial(operator.eq, admitted), timeout=10
                )
        assert [r.status_code for r in await asyncio.gather(*waiting)] == [200] * len(sent)
