"""Batching over HTTP: merged results equal sequential ones; cancellation, limits, isolation, a free event loop."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from typing import Any

import httpx
import numpy as np
import pytest

from app.serving.registry import ServedModel, compute_lanes
from app.settings import Settings
from model import TextEncoder, tasks
from tests.helpers import Service, busy, metric, passes, serving, until_metric

MIXED_REQUESTS: list[dict[str, Any]] = [
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


def assert_same_response(merged: dict, alone: dict) -> None:
    assert merged.keys() == alone.keys() and merged["usage"] == alone["usage"]
    for a, b in zip(merged["data"], alone["data"], strict=True):
        assert a.keys() == b.keys() and a.get("tokens") == b.get("tokens")
        if isinstance(a["embedding"], str):  # base64: compare the decoded floats
            assert a["embedding"] == b["embedding"] or np.allclose(
                np.frombuffer(base64.b64decode(a["embedding"]), "<f4"),
                np.frombuffer(base64.b64decode(b["embedding"]), "<f4"),
                atol=1e-5,
            )
        else:
            np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-5)
            if "token_embeddings" in a:
                np.testing.assert_allclose(a["token_embeddings"], b["token_embeddings"], atol=1e-5)


async def test_concurrent_mixed_requests_equal_sequential_ones(client: httpx.AsyncClient, served: ServedModel) -> None:
    sequential = [(await client.post("/encode", json=r)).json() for r in MIXED_REQUESTS]
    before = await passes(client)
    async with busy(served):
        tasks = [asyncio.ensure_future(client.post("/encode", json=r)) for r in MIXED_REQUESTS]
        n_texts = sum(len(texts) if isinstance(texts := r["texts"], list) else 1 for r in MIXED_REQUESTS)
        await until_metric(client, "encoder_queue_texts", lambda queued: queued >= n_texts)
    responses = await asyncio.gather(*tasks)
    # All of them in as few passes as the compute lanes' fair shares allow (one pass with one lane).
    share = -(-n_texts // compute_lanes(Settings()))  # the shared service's settings
    computed = await passes(client) - before
    assert computed.texts == n_texts and computed.count == -(-n_texts // share)
    for response, alone in zip(responses, sequential, strict=True):
        assert response.status_code == 200
        assert_same_response(response.json(), alone)


async def test_concurrent_attention_and_encode_each_get_their_own_answer(client: httpx.AsyncClient) -> None:
    encode = {"texts": ["encoded while attention waits"]}
    attention = {"text": "attention while encode waits", "layers": [1], "heads": [2]}
    expected_encode = (await client.post("/encode", json=encode)).json()
    expected_attention = (await client.post("/attention", json=attention)).json()
    results = await asyncio.gather(
        *[client.post("/encode", json=encode) if i % 2 else client.post("/attention", json=attention) for i in range(8)]
    )
    for i, response in enumerate(results):
        if i % 2:
            assert_same_response(response.json(), expected_encode)
        else:
            np.testing.assert_allclose(response.json()["attention"], expected_attention["attention"], atol=1e-6)


async def test_a_cancelled_request_is_dropped_without_breaking_its_batch(
    client: httpx.AsyncClient, served: ServedModel
) -> None:
    requests = [
        {"texts": ["first of three", "and its second text"]},
        {"texts": ["to be cancelled"] * 3},
        {"texts": ["the third request"]},
    ]
    sequential = [(await client.post("/encode", json=r)).json() for r in requests]
    dropped_before = metric((await client.get("/metrics")).text, "encoder_dropped_texts_total", 0)
    async with busy(served):
        tasks = [asyncio.ensure_future(client.post("/encode", json=r)) for r in requests]
        await until_metric(client, "encoder_queue_texts", lambda queued: queued >= 6)
        tasks[1].cancel()  # the client goes away while its texts wait in the queue
        await asyncio.wait([tasks[1]])  # its cancellation through the route, before the threads take a batch
    first, third = await tasks[0], await tasks[2]
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert_same_response(first.json(), sequential[0])
    assert_same_response(third.json(), sequential[2])
    await until_metric(client, "encoder_dropped_texts_total", lambda dropped: dropped == dropped_before + 3)


async def test_event_loop_answers_health_while_a_long_batch_computes(bundled_model: TextEncoder) -> None:
    # A budget of 2,048 padded tokens cuts 64 texts of 253 tokens into 8 passes of 8.
    async with serving(Settings(max_batch_tokens=2048), bundled_model) as service:
        texts = [f"{i} " + "word " * 250 for i in range(64)]
        before = await passes(service.client)
        long_batch = asyncio.ensure_future(service.client.post("/encode", json={"texts": texts}))
        await until_metric(service.client, "encoder_batch_texts_count", lambda n: n > before.count)  # one pass done
        health = await service.client.get("/health")
        assert health.status_code == 200
        assert not long_batch.done(), "the batch should still be computing while /health answers"
        assert (await long_batch).status_code == 200
        computed = await passes(service.client) - before
        assert computed.count == 8 and computed.all_of(8)


async def long_texts_all_queued(service: Service) -> Any:
    """The passes that 64 texts of 253 tokens took, in one /encode request queued whole before the first pass is
    cut."""
    texts = [f"{i} " + "word " * 250 for i in range(64)]
    before = await passes(service.client)
    async with busy(service.model):
        request = asyncio.ensure_future(service.client.post("/encode", json={"texts": texts}))
        await until_metric(service.client, "encoder_queue_texts", lambda queued: queued == 64)
    assert (await request).status_code == 200
    return await passes(service.client) - before


async def test_cpu_passes_are_cut_where_their_largest_activation_stays_small(bundled_model: TextEncoder) -> None:
    """Unset, the budget on a CPU keeps a pass's widest activation (the feed-forward's 1,536 floats a token for
    all-MiniLM-L6-v2) within 24 MiB: 24 MiB / (4 bytes × 1,536) = 4,096 padded tokens, so 64 texts of 253
    tokens take four passes of 16, and /info reports the budget in force."""
    async with serving(Settings(compute_lanes=1), bundled_model) as service:
        assert (await service.client.get("/info")).json()["limits"]["max_batch_tokens"] == 4096
        computed = await long_texts_all_queued(service)
        assert computed.count == 4 and computed.all_of(16)
    async with serving(Settings(max_batch_tokens=1000), bundled_model) as service:  # a setting wins
        assert (await service.client.get("/info")).json()["limits"]["max_batch_tokens"] == 1000


@pytest.mark.parametrize(("lanes", "tokens"), [(2, 4096), (3, 2730), (4, 2048)])
async def test_the_lanes_passes_share_one_budget(bundled_model: TextEncoder, lanes: int, tokens: int) -> None:
    """Passes computing at once on the lanes hold at most 48 MiB of widest activations together (each at most 24):
    48 MiB / (lanes × 4 bytes × 1,536) padded tokens a pass. With three lanes, 2,730: 64 texts of 253 tokens go in
    passes of at most 10 (11 × 253 = 2,783)."""
    async with serving(Settings(compute_lanes=lanes), bundled_model) as service:
        assert (await service.client.get("/info")).json()["limits"]["max_batch_tokens"] == tokens
        if lanes != 3:
            return
        computed = await long_texts_all_queued(service)
        assert computed.texts == 64 and computed.count >= 7  # ⌈64 / 10⌉ (four of 16 under 4,096 tokens)
        assert computed.at_most[16] == computed.count


@pytest.mark.parametrize(("side_by_side", "words"), [(None, "3 at once)"), (2, "3 at once, 2 of them side by side)")])
async def test_the_load_log_says_how_many_passes_compute_side_by_side(
    bundled_model: TextEncoder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    side_by_side: int | None,
    words: str,
) -> None:
    """Three lanes take passes at once; where the model computes fewer of them side by side (OpenVINO's streams,
    ``passes_at_once``), the load log says that too, not three alone."""
    monkeypatch.setattr(bundled_model, "passes_at_once", side_by_side)
    with caplog.at_level(logging.INFO, logger="app"):
        async with serving(Settings(compute_lanes=3), bundled_model):
            pass
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert len(loaded) == 1 and f"padded tokens, {words}, loaded and warmed up" in loaded[0], loaded


async def test_two_lanes_compute_two_passes_of_one_model_at_once(
    bundled_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two compute lanes, a model has two inference threads: two passes (one text each here) compute side
    by side. Each pass waits until the other one runs too, which one lane would never let happen."""
    both_computing = threading.Barrier(2, timeout=10)
    embed = tasks.embed_texts

    def meeting(*args: Any) -> Any:
        both_computing.wait()
        return embed(*args)

    async with serving(Settings(compute_lanes=2), bundled_model) as service:
        monkeypatch.setattr(tasks, "embed_texts", meeting)
        before = await passes(service.client)
        # one request of two texts, queued at once: each lane takes its fair share, one text, and neither pass is
        # all the queue holds (so neither may take every thread and keep the other lane waiting)
        response = await service.client.post("/encode", json={"texts": ["one pass", "and another"]})
        assert response.status_code == 200, response.text
        monkeypatch.undo()
        reference = bundled_model.embed(["one pass", "and another"]).numpy()
        assert np.allclose([row["embedding"] for row in response.json()["data"]], reference, atol=1e-5)
        computed = await passes(service.client) - before
        assert computed.count == 2 and computed.all_of(1)


async def test_a_text_too_long_fails_only_its_own_request(client: httpx.AsyncClient, served: ServedModel) -> None:
    async with busy(served):
        good = asyncio.ensure_future(client.post("/encode", json={"texts": ["fine"], "truncate": False}))
        bad = asyncio.ensure_future(client.post("/encode", json={"texts": ["ok", "word " * 300], "truncate": False}))
        await until_metric(client, "encoder_queue_texts", lambda queued: queued >= 1)
    assert (await good).status_code == 200
    body = (await bad).json()
    assert (await bad).status_code == 422 and body["error"]["param"] == "texts[1]"


async def test_text_that_is_not_valid_unicode_fails_alone_among_concurrent_requests(client: httpx.AsyncClient) -> None:
    # JSON allows a lone surrogate escape; no tokenizer takes it. Before the fix every request that
    # arrived in the same turn as such a text was answered 500.
    good_texts = [f"good request number {i}" for i in range(30)]
    expected = (await client.post("/encode", json={"texts": good_texts})).json()["data"]
    bad_body = json.dumps({"texts": ["fine", "broken \ud800 text"]})  # the body holds the escape \\ud800
    assert "\\ud800" in bad_body
    for _ in range(3):
        requests = [client.post("/encode", json={"texts": text}) for text in good_texts]
        requests.insert(15, client.post("/encode", content=bad_body, headers={"content-type": "application/json"}))
        responses = await asyncio.gather(*requests)
        bad = responses.pop(15)
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["param"] == "texts[1]" and "lone surrogate" in bad.json()["error"]["message"]
        for response, want in zip(responses, expected, strict=True):
            assert response.status_code == 200, response.text
            np.testing.assert_allclose(response.json()["data"][0]["embedding"], want["embedding"], atol=1e-5)


async def test_a_bad_text_on_the_new_routes_fails_alone_among_concurrent_ones(client: httpx.AsyncClient) -> None:
    """The batch-poisoning test through chunking, late chunking and cosine reranking: a text that is no valid
    Unicode, sent among good requests of every route in the same turn, fails its own request with a 422 naming
    it, and every other request gets the answer it gets alone."""
    good = [
        ("/encode", {"texts": ["good one " * 300, "two"], "chunking": {"overlap": 8}}),
        ("/encode/late-chunks", {"text": "A first sentence. A second one."}),
        ("/rerank", {"query": "a query", "documents": ["one document", "another"]}),
        ("/v1/embeddings", {"input": ["good " * 400], "chunking": {}}),
    ]
    expected = [(await client.post(path, json=body)).json() for path, body in good]
    bad = [
        ("/encode", '{"texts": ["fine", "broken \\ud800 text"], "chunking": {}}', "texts[1]"),
        ("/encode/late-chunks", '{"text": "broken \\ud800 text"}', "text"),
        ("/rerank", '{"query": "q", "documents": ["fine", "broken \\ud800"]}', "documents[1]"),
    ]
    for path, body, param in bad:
        requests = [client.post(p, json=b) for p, b in good]
        requests.insert(2, client.post(path, content=body, headers={"content-type": "application/json"}))
        responses = await asyncio.gather(*requests)
        failed = responses.pop(2)
        assert failed.status_code == 422, failed.text
        assert failed.json()["error"]["param"] == param and "lone surrogate" in failed.json()["error"]["message"]
        for response, want in zip(responses, expected, strict=True):
            assert response.status_code == 200, response.text
            for result, reference in zip(response.json().get("results", []), want.get("results", []), strict=True):
                assert result["index"] == reference["index"]
                assert result["relevance_score"] == pytest.approx(reference["relevance_score"], abs=1e-5)
            got = response.json().get("data")
            if got is not None:
                for item, reference in zip(got, want["data"], strict=True):
                    np.testing.assert_allclose(item["embedding"], reference["embedding"], atol=1e-5)


async def test_readings_tokenised_in_one_loop_turn_each_read_as_their_own(bundled_model: TextEncoder) -> None:
    """A native request, a left-truncating one and a plain one (TEI's decoded ids) in the same loop turn go into
    one tokenisation turn, and each text is read as its own request says: the same tokens as asked alone."""
    from concurrent.futures import ThreadPoolExecutor

    from app.serving.tokenization import Reading, Tokenization

    long = " ".join(f"word{i}" for i in range(400))
    with ThreadPoolExecutor(1) as executor:
        native = Tokenization(bundled_model.card.tokenizer, executor)
        left, plain = native.read_as(Reading(left=True)), native.read_as(Reading(plain=True))
        assert native.read_as(Reading()) is native
        alone = [await way.encode([long, "[CLS] hello [SEP]"]) for way in (native, left, plain)]
        together = await asyncio.gather(*(way.encode([long, "[CLS] hello [SEP]"]) for way in (native, left, plain)))
    ids = [[encoding.ids for encoding in encodings] for encodings in together]
    assert ids == [[encoding.ids for encoding in encodings] for encodings in alone]
    assert ids[0][0][1:3] != ids[1][0][1:3] and ids[0][0][-1] == ids[1][0][-1] == 102  # kept its start, its end
    assert ids[2][1] == [101, 7592, 102] and ids[0][1] == [101, 101, 7592, 102, 102]  # no special tokens added
