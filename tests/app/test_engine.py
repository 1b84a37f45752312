"""The batching engine: merged results equal sequential ones; cancellation, limits, a free event loop."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest

from app.engine import EncodeOptions, Engine
from app.settings import Settings
from model import TextEncoder
from tests.app.conftest import serve

MIXED_REQUESTS = [
    # Mixed lengths and every option that changes the computation, all merged into one batch.
    {"texts": ["short one", "a somewhat longer text with a few more words in it"]},
    {"texts": "only " * 60, "pooling": "max"},
    {"texts": ["the cls token", "x"], "pooling": "cls", "normalize": False},
    {"texts": ["hidden state of layer two"], "layer": 2, "return_token_embeddings": True},
    {"texts": ["embeddings layer"], "layer": 0},
    {"texts": ["a" * 10, "b " * 100, "c"], "layer": -3, "pooling": "mean", "return_tokens": True},
    {"texts": ["word " * 300], "return_tokens": True},  # truncated to 256 tokens
    {"texts": ["base64 too"], "encoding_format": "base64", "return_token_embeddings": True},
]


async def wait_until(condition, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until true; fail (never hang) after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the engine"
        await asyncio.sleep(0.005)


async def hold(engine) -> tuple[threading.Event, asyncio.Future]:
    """Occupy the inference thread until the returned event is set; returns once it is occupied."""
    running, release = threading.Event(), threading.Event()

    def block() -> None:
        running.set()
        release.wait(30)

    blocker = asyncio.ensure_future(engine.call(block))
    assert await asyncio.to_thread(running.wait, 30), "the inference thread did not take the blocker"
    return release, blocker


@asynccontextmanager
async def held(service) -> AsyncIterator[threading.Event]:
    """Hold the inference thread busy until the block ends, so that requests pile up behind it."""
    release, blocker = await hold(service.engine)
    try:
        yield release
    finally:
        release.set()
        await blocker


def assert_same_response(merged: dict, alone: dict) -> None:
    assert merged.keys() == alone.keys() and merged["usage"] == alone["usage"]
    for a, b in zip(merged["data"], alone["data"], strict=True):
        assert a.keys() == b.keys() and a.get("tokens") == b.get("tokens")
        if isinstance(a["embedding"], str):  # base64: compare the decoded floats
            assert a["embedding"] == b["embedding"] or np.allclose(
                np.frombuffer(base64.b64decode(a["embedding"]), "<f4"),
                np.frombuffer(base64.b64decode(b["embedding"]), "<f4"), atol=1e-5)
        else:
            np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-5)
            if "token_embeddings" in a:
                np.testing.assert_allclose(a["token_embeddings"], b["token_embeddings"], atol=1e-5)


async def test_concurrent_mixed_requests_equal_sequential_ones(client: httpx.AsyncClient) -> None:
    sequential = [(await client.post("/encode", json=r)).json() for r in MIXED_REQUESTS]
    service = client._transport.app.state.service  # type: ignore[attr-defined]
    passes_before = service.engine.stats.batches
    async with held(service):
        tasks = [asyncio.ensure_future(client.post("/encode", json=r)) for r in MIXED_REQUESTS]
        n_texts = sum(len(r["texts"]) if isinstance(r["texts"], list) else 1 for r in MIXED_REQUESTS)
        await wait_until(lambda: service.engine.pending() >= n_texts)
    responses = await asyncio.gather(*tasks)
    assert service.engine.stats.batches == passes_before + 1  # all of them in one forward pass
    for response, alone in zip(responses, sequential, strict=True):
        assert response.status_code == 200
        assert_same_response(response.json(), alone)


async def test_concurrent_attention_and_encode_each_get_their_own_answer(client: httpx.AsyncClient) -> None:
    encode = {"texts": ["encoded while attention waits"]}
    attention = {"text": "attention while encode waits", "layers": [1], "heads": [2]}
    expected_encode = (await client.post("/encode", json=encode)).json()
    expected_attention = (await client.post("/attention", json=attention)).json()
    results = await asyncio.gather(*[
        client.post("/encode", json=encode) if i % 2 else client.post("/attention", json=attention) for i in range(8)
    ])
    for i, response in enumerate(results):
        if i % 2:
            assert_same_response(response.json(), expected_encode)
        else:
            np.testing.assert_allclose(response.json()["attention"], expected_attention["attention"], atol=1e-6)


async def test_a_cancelled_request_is_dropped_without_breaking_its_batch(client: httpx.AsyncClient) -> None:
    requests = [{"texts": ["first of three", "and its second text"]}, {"texts": ["to be cancelled"] * 3},
                {"texts": ["the third request"]}]
    sequential = [(await client.post("/encode", json=r)).json() for r in requests]
    service = client._transport.app.state.service  # type: ignore[attr-defined]
    dropped_before = service.engine.stats.dropped_texts
    async with held(service):
        tasks = [asyncio.ensure_future(client.post("/encode", json=r)) for r in requests]
        await wait_until(lambda: service.engine.pending() >= 6)
        tasks[1].cancel()  # the client goes away while its texts wait in the queue
        await asyncio.sleep(0.05)
    first, third = await tasks[0], await tasks[2]
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert_same_response(first.json(), sequential[0])
    assert_same_response(third.json(), sequential[2])
    assert service.engine.stats.dropped_texts == dropped_before + 3  # never computed


async def test_event_loop_answers_health_while_a_long_batch_computes(client: httpx.AsyncClient) -> None:
    long_batch = asyncio.ensure_future(client.post("/encode", json={"texts": [f"{i} " + "word " * 250 for i in range(64)]}))
    service = client._transport.app.state.service  # type: ignore[attr-defined]
    texts_before = service.engine.stats.batched_texts
    # until the inference thread has taken the batch
    await wait_until(lambda: service.engine.pending() == 0 and service.engine.stats.batched_texts > texts_before)
    health = await client.get("/health")
    assert health.status_code == 200
    assert not long_batch.done(), "the batch should still be computing while /health answers"
    assert (await long_batch).status_code == 200


@pytest.mark.parametrize(("max_batch_size", "max_batch_tokens"), [(4, 10_000), (64, 60), (3, 40)])
async def test_batches_keep_to_their_size_and_token_limits(
    tiny_model: TextEncoder, max_batch_size: int, max_batch_tokens: int
) -> None:
    engine = Engine(tiny_model, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size)
    release = threading.Event()
    try:
        release, blocker = await hold(engine)
        texts = [" ".join(["the quick brown fox"] * n) for n in (1, 5, 2, 8, 1, 3, 3, 1, 6, 2, 4, 1)]
        options = EncodeOptions(n_layers=2, pooling="mean", normalize=True, token_vectors=False)
        jobs = [asyncio.ensure_future(engine.encode([t], options)) for t in texts]
        await asyncio.sleep(0.05)
        release.set()
        await blocker
        results = await asyncio.gather(*jobs)
        lengths = [len(e.ids) for e in tiny_model.tokenizer.encode(texts)]
        assert engine.stats.batched_texts == len(texts)
        assert max(engine.stats.batch_sizes) <= max_batch_size
        assert engine.stats.largest_padded_tokens <= max(max_batch_tokens, max(lengths))
        for text, (encodings, vectors) in zip(texts, results, strict=True):
            alone = tiny_model.embed([text]).numpy()[0]
            np.testing.assert_allclose(vectors[0].embedding, alone, atol=1e-5)
    finally:
        release.set()
        engine.stop()


async def test_a_text_too_long_fails_only_its_own_request(client: httpx.AsyncClient) -> None:
    service = client._transport.app.state.service  # type: ignore[attr-defined]
    async with held(service):
        good = asyncio.ensure_future(client.post("/encode", json={"texts": ["fine"], "truncate": False}))
        bad = asyncio.ensure_future(client.post("/encode", json={"texts": ["ok", "word " * 300], "truncate": False}))
        await wait_until(lambda: service.engine.pending() >= 3)
    assert (await good).status_code == 200
    body = (await bad).json()
    assert (await bad).status_code == 422 and body["error"]["param"] == "texts[1]"


async def test_engine_finishes_queued_work_when_stopped(tiny_model: TextEncoder) -> None:
    engine = Engine(tiny_model)
    options = EncodeOptions(n_layers=2, pooling="mean", normalize=True, token_vectors=False)
    jobs = [asyncio.ensure_future(engine.encode(["the quick brown fox"] * 3, options)) for _ in range(5)]
    await asyncio.sleep(0)
    await asyncio.to_thread(engine.stop)
    results = await asyncio.gather(*jobs)
    assert all(len(vectors) == 3 for _, vectors in results)
    with pytest.raises(RuntimeError, match="stopped"):
        await engine.encode(["late"], options)
