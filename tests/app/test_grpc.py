"""Text-embeddings-inference's gRPC API (ENCODER_GRPC_PORT): every method against its TEI HTTP twin on the same
service, with clients generated from TEI's proto; streams answered in order; errors as gRPC status codes; API keys;
front ends that serve it as they serve HTTP; the generated code current with the proto."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.api.tei.grpc import tei_pb2 as pb
from app.api.tei.grpc import tei_pb2_grpc as pb_grpc
from app.api.tei.grpc.server import Gathering
from app.engine.messages import REQUEST_TIMING
from app.settings import Settings
from model import TextEncoder, default_model_path, load_model
from tests.app.test_processes import front_ends, supervised
from tests.helpers import (
    ROOT,
    Service,
    busy,
    free_port,
    server_log,
    serving,
    start_server,
    until_metric,
    wait_until,
    write_tiny_model,
)
from tests.retrieval import write_splade

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi", "naïve café — ünïcode"]
LONG = " ".join(["word"] * 400)  # longer than MiniLM's 256 positions
M = TypeVar("M")
# grpcio shares connections between a process's channels to one address: a port used again by the next test's server
# would find the last one's connection, closed. Each test channel keeps its own.
OWN_CONNECTIONS = [("grpc.use_local_subchannel_pool", 1)]


class Grpc:
    """A service with its gRPC port: its HTTP client (the TEI twin's) and stubs of TEI's five services."""

    def __init__(self, service: Service, channel: grpc.aio.Channel) -> None:
        self.service, self.http, self.channel = service, service.client, channel
        self.deadlines: dict[str, list[Any]] = {}  # written by watch_gathering
        self.info = pb_grpc.InfoStub(channel)
        self.embed = pb_grpc.EmbedStub(channel)
        self.predict = pb_grpc.PredictStub(channel)
        self.rerank = pb_grpc.RerankStub(channel)
        self.tokenize = pb_grpc.TokenizeStub(channel)

    async def tei(self, path: str, body: dict[str, Any]) -> Any:
        response = await self.http.post(f"/tei{path}", json=body)
        assert response.status_code == 200, response.text
        return response.json()


@asynccontextmanager
async def grpc_serving(model: TextEncoder, **settings: Any) -> AsyncIterator[Grpc]:
    port = free_port()
    async with (
        serving(Settings(grpc_port=port, grpc_host="127.0.0.1", **settings), model) as service,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTIONS) as channel,
    ):
        yield Grpc(service, channel)


@pytest.fixture(scope="module")
async def minilm() -> AsyncIterator[Grpc]:
    async with grpc_serving(load_model(default_model_path(), device="cpu", dtype="float32")) as running:
        yield running


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grpc")
    return {
        "ce": write_tiny_model(root / "ce", head="sequence-classification", num_labels=1),
        "clf": write_tiny_model(root / "clf", seed=3, head="sequence-classification", num_labels=3),
        "splade": write_splade(root / "splade", "bert", "max", seed=2),
    }


@pytest.fixture(scope="module")
async def classifier(tiny_models: dict[str, Path]) -> AsyncIterator[Grpc]:
    async with grpc_serving(load_model(tiny_models["clf"], device="cpu", dtype="float32")) as running:
        yield running


@pytest.fixture(scope="module")
async def cross_encoder(tiny_models: dict[str, Path]) -> AsyncIterator[Grpc]:
    async with grpc_serving(load_model(tiny_models["ce"], device="cpu", dtype="float32")) as running:
        yield running


@pytest.fixture(scope="module")
async def sparse(tiny_models: dict[str, Path]) -> AsyncIterator[Grpc]:
    async with grpc_serving(load_model(tiny_models["splade"], device="cpu", dtype="float32")) as running:
        yield running


async def each(messages: Iterable[M]) -> AsyncIterator[M]:
    for message in messages:
        yield message


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    """The status a call (awaitable, or a stream of answers read to the end) failed with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return caught.value.code(), caught.value.details() or ""


# ---- every method against its HTTP twin ----


async def test_info_equals_tei_info(minilm: Grpc) -> None:
    info = await minilm.info.Info(pb.InfoRequest())
    twin = (await minilm.http.get("/tei/info")).json()
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    for field in (
        "model_id",
        "model_dtype",
        "max_concurrent_requests",
        "max_input_length",
        "max_batch_tokens",
        "max_client_batch_size",
        "tokenization_workers",
        "version",
    ):
        assert getattr(info, field) == twin[field], field


async def test_embed_equals_tei_embed(minilm: Grpc) -> None:
    for text in TEXTS:
        for options in ({}, {"normalize": False}, {"dimensions": 128}):
            answer = await minilm.embed.Embed(pb.EmbedRequest(inputs=text, **options))
            [expected] = await minilm.tei("/embed", {"inputs": text, **options})
            assert len(answer.embeddings) == len(expected)
            np.testing.assert_allclose(answer.embeddings, expected, atol=1e-5)
        tokens = await minilm.tei("/tokenize", {"inputs": text})
        assert answer.metadata.compute_chars == len(text)
        assert answer.metadata.compute_tokens == len(tokens[0])  # with [CLS] and [SEP]
        assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0
        assert answer.metadata.total_time_ns >= answer.metadata.tokenization_time_ns > 0


async def test_truncation_as_asked_and_as_tei_by_default(minilm: Grpc) -> None:
    code, message = await status_of(minilm.embed.Embed(pb.EmbedRequest(inputs=LONG)))  # proto3: truncate false
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "256" in message, message
    for direction, name in ((pb.TRUNCATION_DIRECTION_RIGHT, "Right"), (pb.TRUNCATION_DIRECTION_LEFT, "Left")):
        text = "first words " + LONG + " last words"
        answer = await minilm.embed.Embed(pb.EmbedRequest(inputs=text, truncate=True, truncation_direction=direction))
        [expected] = await minilm.tei("/embed", {"inputs": text, "truncate": True, "truncation_direction": name})
        np.testing.assert_allclose(answer.embeddings, expected, atol=1e-5)


async def test_embed_stream_answers_every_message_in_order(minilm: Grpc) -> None:
    texts = [f"text number {i} of the stream, {'long ' * (i % 7)}" for i in range(40)]
    answers = [answer async for answer in minilm.embed.EmbedStream(each(pb.EmbedRequest(inputs=t) for t in texts))]
    expected = await minilm.tei("/embed", {"inputs": texts})
    assert len(answers) == len(texts)
    np.testing.assert_allclose([list(a.embeddings) for a in answers], expected, atol=1e-5)


async def test_a_streams_messages_of_different_options_each_answer_as_alone(minilm: Grpc) -> None:
    """Messages that arrive together are computed as one request where their options are equal: interleaved
    options, each answer still the one its message gets alone."""
    options: list[dict[str, Any]] = [{}, {"normalize": False}, {"dimensions": 64}, {}, {}, {"normalize": False}]
    requests = [pb.EmbedRequest(inputs=f"{TEXTS[i % 4]} {i}", **options[i % 6]) for i in range(48)]
    streamed = [answer async for answer in minilm.embed.EmbedStream(each(requests))]
    assert len(streamed) == len(requests)
    for request, answer in zip(requests, streamed, strict=True):
        alone = await minilm.embed.Embed(request)
        np.testing.assert_allclose(answer.embeddings, alone.embeddings, atol=1e-5)


async def test_embed_all_equals_tei_embed_all(minilm: Grpc) -> None:
    for text in TEXTS[:2]:
        answer = await minilm.embed.EmbedAll(pb.EmbedAllRequest(inputs=text))
        [expected] = await minilm.tei("/embed_all", {"inputs": text})
        np.testing.assert_allclose([list(t.embeddings) for t in answer.token_embeddings], expected, atol=1e-5)
    streamed = [a async for a in minilm.embed.EmbedAllStream(each(pb.EmbedAllRequest(inputs=t) for t in TEXTS))]
    assert [len(a.token_embeddings) for a in streamed] == [
        len(v) for v in await minilm.tei("/embed_all", {"inputs": TEXTS})
    ]


def simple(token: pb.SimpleToken) -> dict[str, Any]:
    return {
        "id": token.id,
        "text": token.text,
        "special": token.special,
        "start": token.start if token.HasField("start") else None,
        "stop": token.stop if token.HasField("stop") else None,
    }


async def test_tokenize_and_decode_equal_their_twins(minilm: Grpc) -> None:
    for text in TEXTS:
        for special in (True, False):
            answer = await minilm.tokenize.Tokenize(pb.EncodeRequest(inputs=text, add_special_tokens=special))
            [expected] = await minilm.tei("/tokenize", {"inputs": text, "add_special_tokens": special})
            assert [simple(token) for token in answer.tokens] == expected
    requests = [pb.EncodeRequest(inputs=text, add_special_tokens=True) for text in TEXTS]
    streamed = [a async for a in minilm.tokenize.TokenizeStream(each(requests))]
    assert [[t.id for t in a.tokens] for a in streamed] == [
        [t["id"] for t in row] for row in await minilm.tei("/tokenize", {"inputs": TEXTS})
    ]
    ids = [101, 1996, 4248, 2829, 4419, 102]
    for skip in (True, False):
        answer = await minilm.tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=skip))
        assert [answer.text] == await minilm.tei("/decode", {"ids": ids, "skip_special_tokens": skip})
    rows = [ids, ids[1:3], [7592]]
    decoded = [a.text async for a in minilm.tokenize.DecodeStream(each(pb.DecodeRequest(ids=row) for row in rows))]
    assert decoded == await minilm.tei("/decode", {"ids": rows, "skip_special_tokens": False})


async def test_predict_and_predict_pair_equal_tei_predict(classifier: Grpc) -> None:
    for raw in (False, True):
        answer = await classifier.predict.Predict(pb.PredictRequest(inputs=TEXTS[0], raw_scores=raw))
        expected = await classifier.tei("/predict", {"inputs": TEXTS[0], "raw_scores": raw})
        assert [p.label for p in answer.predictions] == [p["label"] for p in expected]
        np.testing.assert_allclose([p.score for p in answer.predictions], [p["score"] for p in expected], atol=1e-5)
        pair = await classifier.predict.PredictPair(pb.PredictPairRequest(inputs=TEXTS[:2], raw_scores=raw))
        expected = await classifier.tei("/predict", {"inputs": TEXTS[:2], "raw_scores": raw})
        assert [p.label for p in pair.predictions] == [p["label"] for p in expected]
        np.testing.assert_allclose([p.score for p in pair.predictions], [p["score"] for p in expected], atol=1e-5)
    streamed = [a async for a in classifier.predict.PredictStream(each(pb.PredictRequest(inputs=t) for t in TEXTS))]
    expected = await classifier.tei("/predict", {"inputs": [[t] for t in TEXTS]})
    assert [[p.label for p in a.predictions] for a in streamed] == [[p["label"] for p in row] for row in expected]
    pairs = [pb.PredictPairRequest(inputs=[a, b]) for a, b in zip(TEXTS, TEXTS[1:])]
    streamed = [a async for a in classifier.predict.PredictPairStream(each(pairs))]
    expected = await classifier.tei("/predict", {"inputs": [[a, b] for a, b in zip(TEXTS, TEXTS[1:])]})
    got = [[p.score for p in a.predictions] for a in streamed]
    np.testing.assert_allclose(got, [[p["score"] for p in row] for row in expected], atol=1e-5)


async def test_rerank_and_rerank_stream_equal_tei_rerank(cross_encoder: Grpc) -> None:
    query, texts = "what is attention", TEXTS
    for raw, return_text in ((False, False), (True, True)):
        answer = await cross_encoder.rerank.Rerank(
            pb.RerankRequest(query=query, texts=texts, raw_scores=raw, return_text=return_text)
        )
        expected = await cross_encoder.tei(
            "/rerank", {"query": query, "texts": texts, "raw_scores": raw, "return_text": return_text}
        )
        assert [r.index for r in answer.ranks] == [r["index"] for r in expected]
        np.testing.assert_allclose([r.score for r in answer.ranks], [r["score"] for r in expected], atol=1e-5)
        assert [r.text if r.HasField("text") else None for r in answer.ranks] == [r.get("text") for r in expected]
    messages = [pb.RerankStreamRequest(query=query, text=text, return_text=True) for text in texts]
    streamed = await cross_encoder.rerank.RerankStream(each(messages))
    expected = await cross_encoder.tei("/rerank", {"query": query, "texts": texts, "return_text": True})
    assert [(r.index, r.text) for r in streamed.ranks] == [(r["index"], r["text"]) for r in expected]
    np.testing.assert_allclose([r.score for r in streamed.ranks], [r["score"] for r in expected], atol=1e-5)
    # two queries in one stream: each pair scored against its own, all ranked together
    other = "a fox"
    mixed = [
        pb.RerankStreamRequest(query=q, text=t) for q, t in ((query, texts[0]), (other, texts[1]), (query, texts[2]))
    ]
    streamed = await cross_encoder.rerank.RerankStream(each(mixed))
    by_query = {
        q: {texts.index(t): s for t, s in zip(ts, [await score(cross_encoder, q, t) for t in ts])}
        for q, ts in ((query, [texts[0], texts[2]]), (other, [texts[1]]))
    }
    want = {0: by_query[query][0], 1: by_query[other][1], 2: by_query[query][2]}
    assert [r.index for r in streamed.ranks] == sorted(want, key=lambda i: -want[i])
    np.testing.assert_allclose([r.score for r in streamed.ranks], sorted(want.values(), reverse=True), atol=1e-5)


async def score(running: Grpc, query: str, text: str) -> float:
    [ranked] = await running.tei("/rerank", {"query": query, "texts": [text]})
    return float(ranked["score"])


async def test_embed_sparse_equals_tei_embed_sparse(sparse: Grpc) -> None:
    for text in TEXTS:
        answer = await sparse.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=text))
        [expected] = await sparse.tei("/embed_sparse", {"inputs": text})
        assert [v.index for v in answer.sparse_embeddings] == [v["index"] for v in expected]
        np.testing.assert_allclose(
            [v.value for v in answer.sparse_embeddings], [v["value"] for v in expected], atol=1e-5
        )
    requests = (pb.EmbedSparseRequest(inputs=text) for text in TEXTS)
    streamed = [a async for a in sparse.embed.EmbedSparseStream(each(requests))]
    expected = await sparse.tei("/embed_sparse", {"inputs": TEXTS})
    assert [[v.index for v in a.sparse_embeddings] for a in streamed] == [[v["index"] for v in r] for r in expected]


# ---- errors as status codes ----


async def test_bad_input_is_invalid_argument_and_a_missing_task_a_failed_precondition(
    minilm: Grpc, classifier: Grpc
) -> None:
    invalid, precondition = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    cases = [
        (minilm.embed.Embed(pb.EmbedRequest(inputs="")), invalid, "cannot be empty"),
        (minilm.embed.Embed(pb.EmbedRequest(inputs="   ")), invalid, "cannot be empty"),
        (minilm.embed.Embed(pb.EmbedRequest(inputs="a", dimensions=0)), invalid, "dimensions"),
        (minilm.embed.Embed(pb.EmbedRequest(inputs="a", prompt_name="absent")), invalid, "absent"),
        (minilm.tokenize.Decode(pb.DecodeRequest(ids=[10**7])), invalid, "ids"),
        (minilm.tokenize.Decode(pb.DecodeRequest()), invalid, "empty"),
        (minilm.rerank.Rerank(pb.RerankRequest(query="q")), invalid, "texts"),
        (
            minilm.predict.Predict(pb.PredictRequest(inputs="a")),
            precondition,
            "Backend error: Model is not a classifier",
        ),
        (minilm.embed.EmbedSparse(pb.EmbedSparseRequest(inputs="a")), precondition, "Backend error: Model is not an"),
        (classifier.embed.Embed(pb.EmbedRequest(inputs="a")), precondition, "Backend error: Model is not an embedding"),
        (classifier.predict.PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"])), invalid, "pair"),
    ]
    for call, code, part in cases:
        got, message = await status_of(call)
        assert (got, part in message) == (code, True), (got, message)
    # a classifier of several labels asked to rerank: TEI's gRPC server refuses it itself, in its own words
    refused = classifier.rerank.Rerank(pb.RerankRequest(query="q", texts=["a"]))
    assert await status_of(refused) == (precondition, "model is not a re-ranker model")


async def test_a_bad_message_ends_its_stream_with_its_status_after_the_answers_before_it(minilm: Grpc) -> None:
    stream = minilm.embed.EmbedStream(each(pb.EmbedRequest(inputs=t) for t in ["good", "fine", "", "never"]))
    answers = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for answer in stream:
            answers.append(answer)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(answers) == 2
    assert len((await minilm.embed.Embed(pb.EmbedRequest(inputs="still served"))).embeddings) == 384


async def test_not_ready_is_unavailable(minilm: Grpc) -> None:
    state = minilm.service.app.state
    registry, state.registry = state.registry, None
    try:
        code, message = await status_of(minilm.embed.Embed(pb.EmbedRequest(inputs="a")))
    finally:
        state.registry = registry
    assert code == grpc.StatusCode.UNAVAILABLE and "loading" in message


async def test_the_health_service_says_serving_while_ready(minilm: Grpc) -> None:
    """gRPC's health-checking protocol (grpc.health.v1, as Kubernetes' gRPC probes ask it): the server and each of
    TEI's services SERVING while ready; NOT_SERVING, streamed to a watcher, while not; an unknown service NOT_FOUND."""
    checks = health_pb2_grpc.HealthStub(minilm.channel)
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", "tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize"):
        assert (await checks.Check(health_pb2.HealthCheckRequest(service=service))).status == serving, service
    code, _ = await status_of(checks.Check(health_pb2.HealthCheckRequest(service="tei.v1.Nothing")))
    assert code == grpc.StatusCode.NOT_FOUND
    watch = checks.Watch(health_pb2.HealthCheckRequest(service="tei.v1.Embed"))
    state = minilm.service.app.state
    registry = state.registry
    try:
        assert (await asyncio.wait_for(watch.read(), 10)).status == serving
        state.registry = None  # as before the models are ready
        assert (await asyncio.wait_for(watch.read(), 10)).status == not_serving
        assert (await checks.Check(health_pb2.HealthCheckRequest())).status == not_serving
    finally:
        state.registry = registry
    assert (await asyncio.wait_for(watch.read(), 10)).status == serving
    watch.cancel()


async def test_a_full_queue_is_resource_exhausted_and_an_expired_deadline_deadline_exceeded(
    tiny_models: dict[str, Path],
) -> None:
    model = load_model(tiny_models["clf"], device="cpu", dtype="float32")
    async with grpc_serving(model, max_queue_texts=1, request_timeout_s=0.5) as running:
        async with busy(running.service.model):
            waiting = asyncio.ensure_future(running.predict.Predict(pb.PredictRequest(inputs="first")))
            client = running.service.client  # admitted, queued behind the held inference threads:
            await until_metric(client, "encoder_queue_texts", lambda queued: queued >= 1)
            code, message = await status_of(running.predict.Predict(pb.PredictRequest(inputs="second")))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
            code, message = await status_of(waiting)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "0.5 s" in message, message
        assert (await running.predict.Predict(pb.PredictRequest(inputs="after"))).predictions


async def test_api_keys_are_asked_for_in_metadata(tiny_models: dict[str, Path]) -> None:
    model = load_model(tiny_models["clf"], device="cpu", dtype="float32")
    async with grpc_serving(model, api_keys=["k-1", "k-2"]) as running:
        request = pb.PredictRequest(inputs="a")
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "k-1"),)):
            code, _ = await status_of(running.predict.Predict(request, metadata=metadata))
            assert code == grpc.StatusCode.UNAUTHENTICATED, metadata
        answer = await running.predict.Predict(request, metadata=(("authorization", "Bearer k-2"),))
        assert len(answer.predictions) == 3
        code, _ = await status_of(running.info.Info(pb.InfoRequest()))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        stream = running.predict.PredictStream(each([request]), metadata=(("authorization", "Bearer nope"),))
        code, _ = await status_of(stream)
        assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_calls_are_counted_in_the_metrics(minilm: Grpc) -> None:
    await minilm.embed.Embed(pb.EmbedRequest(inputs="counted"))
    await status_of(minilm.embed.Embed(pb.EmbedRequest(inputs="")))
    text = (await minilm.http.get("/metrics")).text
    assert 'route="/tei.v1.Embed/Embed",status="OK"' in text.replace('method="GRPC",', "")
    assert 'route="/tei.v1.Embed/Embed",status="INVALID_ARGUMENT"' in text.replace('method="GRPC",', "")


# ---- unary calls gathered ----


def embedding(running: Grpc, text: str, **options: Any) -> asyncio.Future[pb.EmbedResponse]:
    """An Embed call sent, its answer to come."""
    return asyncio.ensure_future(running.embed.Embed(pb.EmbedRequest(inputs=text, **options)))


def request_deadline() -> float | None:
    """The deadline of the request the calling task works for (the responder's ``Timing``)."""
    timing = REQUEST_TIMING.get()
    assert timing is not None, "called outside a request's work"
    return timing.deadline


def watch_gathering(running: Grpc, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[list[str]]]:
    """The texts of the Embed calls that reached the gathering, and of each request made of them to the service;
    each call's deadline and each request's, in ``running.deadlines``."""
    arrived: list[str] = []
    requests: list[list[str]] = []
    running.deadlines = {"calls": [], "requests": []}
    join, embeddings = Gathering.join, running.service.app.state.embeddings
    encode = embeddings.encode

    async def counted(self: Gathering, request: pb.EmbedRequest, served: Any) -> Any:
        arrived.append(request.inputs)
        options = isinstance(request, pb.EmbedRequest) and request.HasField("normalize")
        running.deadlines["calls"].append((request.inputs, options, request_deadline()))
        return await join(self, request, served)

    def recorded(served: Any, native: Any) -> Any:
        requests.append(list(native.texts))
        running.deadlines["requests"].append(request_deadline())
        return encode(served, native)

    monkeypatch.setattr(Gathering, "join", counted)
    monkeypatch.setattr(embeddings, "encode", recorded)
    return arrived, requests


async def test_embed_calls_that_arrive_while_one_computes_are_one_request_each_answered_as_alone(
    minilm: Grpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrived, requests = watch_gathering(minilm, monkeypatch)
    async with busy(minilm.service.model):
        first = embedding(minilm, "the first, computing")
        await wait_until(lambda: len(requests) == 1)  # a lone call goes at once
        calls = [embedding(minilm, text) for text in TEXTS]
        other = embedding(minilm, TEXTS[0], normalize=False)
        await wait_until(lambda: len(arrived) == 2 + len(TEXTS))
        assert len(requests) == 1  # the rest wait for the first's end
    answers, unnormalized = await asyncio.gather(*calls), await other
    assert len((await first).embeddings) == 384
    assert sorted(requests[1:], key=len) == [[TEXTS[0]], sorted(TEXTS, key=TEXTS.index)]  # by options, in one each
    run = [len(request) for request in requests].index(len(TEXTS))
    gathered = [deadline for text, options, deadline in minilm.deadlines["calls"] if text in TEXTS and not options]
    assert minilm.deadlines["requests"][run] == max(gathered)  # the run dropped only when no call waits any more
    for text, answer in zip(TEXTS, answers, strict=True):
        [expected] = await minilm.tei("/embed", {"inputs": text})
        np.testing.assert_allclose(answer.embeddings, expected, atol=1e-5)
        assert answer.metadata.compute_chars == len(text)
        assert answer.metadata.total_time_ns >= answer.metadata.queue_time_ns > 0  # its wait counted as queued
    [expected] = await minilm.tei("/embed", {"inputs": TEXTS[0], "normalize": False})
    np.testing.assert_allclose(unnormalized.embeddings, expected, atol=1e-5)


async def test_a_bad_call_among_gathered_ones_fails_alone_and_a_call_gone_is_not_computed(
    minilm: Grpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrived, requests = watch_gathering(minilm, monkeypatch)
    async with busy(minilm.service.model):
        first = embedding(minilm, "the first, computing")
        await wait_until(lambda: len(requests) == 1)
        good = [embedding(minilm, text) for text in TEXTS[:2]]
        bad = embedding(minilm, "")
        gone = asyncio.ensure_future(minilm.embed.Embed(pb.EmbedRequest(inputs="gone before its turn"), timeout=0.5))
        await wait_until(lambda: len(arrived) == 5)
        assert (await status_of(gone))[0] == grpc.StatusCode.DEADLINE_EXCEEDED  # its client's deadline, waiting
    code, message = await status_of(bad)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    assert len((await first).embeddings) == 384
    for text, call in zip(TEXTS[:2], good, strict=True):
        [expected] = await minilm.tei("/embed", {"inputs": text})
        np.testing.assert_allclose((await call).embeddings, expected, atol=1e-5)
    computed = [text for request in requests for text in request]
    assert "gone before its turn" not in computed and set(TEXTS[:2]) <= set(computed)


async def test_a_call_that_would_be_gathered_is_admitted_as_it_arrives_and_a_full_queue_refuses_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(write_tiny_model(tmp_path / "embedder"), device="cpu", dtype="float32")
    async with grpc_serving(model, max_queue_texts=2, request_timeout_s=0.5) as running:
        arrived, requests = watch_gathering(running, monkeypatch)
        with running.service.admission.admit(1):  # another request's text, in throughout
            async with busy(running.service.model):
                first = asyncio.ensure_future(running.embed.Embed(pb.EmbedRequest(inputs="first")))
                await wait_until(lambda: len(requests) == 1)
                code, message = await status_of(running.embed.Embed(pb.EmbedRequest(inputs="refused")))
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message  # while the first still computes
                code, message = await status_of(first)  # its deadline passes, its run still held
                assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "0.5 s" in message, message
                await wait_until(lambda: running.service.admission.admitted == 1)  # the first's text out again
        answer = await running.embed.Embed(pb.EmbedRequest(inputs="after"))
        [expected] = await running.tei("/embed", {"inputs": "after"})
        np.testing.assert_allclose(answer.embeddings, expected, atol=1e-5)
        assert arrived == ["first", "after"]  # the refused one never reached the gathering
        metrics = (await running.http.get("/metrics")).text
        assert "encoder_dropped_texts_total 1.0" in metrics  # the first's run, no one waiting for it, left the queue


async def test_predict_calls_are_gathered_as_embed_calls_are_texts_apart_from_pairs(
    classifier: Grpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    classified: list[tuple[list[str], list[str] | None]] = []
    tasks = classifier.service.app.state.tasks
    classify = tasks.classify

    def recorded(served: Any, native: Any) -> Any:
        classified.append((list(native.texts), native.text_pair))
        return classify(served, native)

    monkeypatch.setattr(tasks, "classify", recorded)
    arrived, _ = watch_gathering(classifier, monkeypatch)
    pairs = [pb.PredictPairRequest(inputs=[a, b]) for a, b in zip(TEXTS, TEXTS[1:])]
    async with busy(classifier.service.model):
        firsts = [  # each method's first call goes at once: Predict's and PredictPair's gather apart
            asyncio.ensure_future(classifier.predict.Predict(pb.PredictRequest(inputs="the first"))),
            asyncio.ensure_future(classifier.predict.PredictPair(pairs[0])),
        ]
        await wait_until(lambda: len(classified) == 2)
        singles = [asyncio.ensure_future(classifier.predict.Predict(pb.PredictRequest(inputs=t))) for t in TEXTS]
        paired_calls = [asyncio.ensure_future(classifier.predict.PredictPair(pair)) for pair in pairs]
        await wait_until(lambda: len(arrived) == 2 + len(TEXTS) + len(pairs))
        assert len(classified) == 2
    answers, paired = await asyncio.gather(*singles), await asyncio.gather(*paired_calls)
    assert all(len(answer.predictions) == 3 for answer in await asyncio.gather(*firsts))
    assert sorted(classified[2:], key=lambda run: run[1] is None) == [
        (TEXTS[:-1], TEXTS[1:]),  # the pairs, one request
        (TEXTS, None),  # the single texts, another
    ]
    expected = await classifier.tei("/predict", {"inputs": [[t] for t in TEXTS]})
    got = [[p.score for p in answer.predictions] for answer in answers]
    np.testing.assert_allclose(got, [[p["score"] for p in row] for row in expected], atol=1e-5)
    expected = await classifier.tei("/predict", {"inputs": [list(pair.inputs) for pair in pairs]})
    got = [[p.score for p in answer.predictions] for answer in paired]
    np.testing.assert_allclose(got, [[p["score"] for p in row] for row in expected], atol=1e-5)
    for text, answer in zip(TEXTS, answers, strict=True):
        tokens = await classifier.tei("/tokenize", {"inputs": text})
        assert answer.metadata.compute_tokens == len(tokens[0]) and answer.metadata.compute_chars == len(text)


# ---- front ends, and the generated code ----


@pytest.fixture(scope="module")
def split(tiny_models: dict[str, Path]) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """python -m app.serve with two front ends around an engine, gRPC on: the process, HTTP's URL, gRPC's target."""
    port = free_port()
    env = {"ENCODER_MODELS": f"clf={tiny_models['clf']}", "ENCODER_WORKERS": "2", "ENCODER_GRPC_PORT": str(port)}
    with supervised(env) as (process, url):
        yield process, url, f"127.0.0.1:{port}"


def predict(target: str, text: str) -> pb.PredictResponse:
    with grpc.insecure_channel(target, options=OWN_CONNECTIONS) as channel:
        return pb_grpc.PredictStub(channel).Predict(pb.PredictRequest(inputs=text), timeout=30, wait_for_ready=True)


def test_front_ends_serve_grpc_and_one_that_dies_leaves_the_other_serving(
    split: tuple[subprocess.Popen, str, str],
) -> None:
    process, url, target = split
    expected = httpx.post(f"{url}/tei/predict", json={"inputs": "a text"}, timeout=30).json()
    answer = predict(target, "a text")
    np.testing.assert_allclose([p.score for p in answer.predictions], [p["score"] for p in expected], atol=1e-5)
    before = front_ends(process)
    os.kill(before[0], signal.SIGKILL)
    answered = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # a new connection each time: the kernel spreads them over the listeners
        assert len(predict(target, "a text").predictions) == 3
        answered += 1
    assert answered > 10
    after = front_ends(process)
    assert len(after) == 2 and before[0] not in after


def test_a_grpc_port_in_use_stops_the_start_in_one_line(tiny_models: dict[str, Path]) -> None:
    with socket_on() as port:
        env = {**os.environ, "ENCODER_MODELS": f"clf={tiny_models['clf']}", "ENCODER_GRPC_PORT": str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "app.serve", "--host", "0.0.0.0", "--port", str(free_port())],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 3, done.stderr
    assert f"cannot listen on 0.0.0.0:{port}" in done.stderr and "ENCODER_GRPC_PORT" in done.stderr, done.stderr


def test_loading_beside_grpc_logs_no_line_for_each_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC starts before the models load, and OpenVINO's conversion forks about 40 times: with grpcio's fork
    handlers on, each fork logged "skipping fork() handlers". Off (app/api/tei/grpc/__init__.py), the log holds the
    service's own lines, and gRPC serves."""
    monkeypatch.delenv("GRPC_ENABLE_FORK_SUPPORT", raising=False)  # as this process's own import set it: the service's
    port = free_port()
    env = {"ENCODER_GRPC_PORT": str(port), "ENCODER_RUNTIME": "openvino", "ENCODER_WORKERS": "1"}
    process, _ = start_server(env, supervised=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTIONS) as channel:
            info = pb_grpc.InfoStub(channel).Info(pb.InfoRequest(), timeout=30, wait_for_ready=True)
        assert info.model_id
        log = server_log(process)
        assert "gRPC (text-embeddings-inference's tei.v1" in log and "runs on openvino" in log, log
        assert "fork" not in log, log
    finally:
        process.terminate()
        process.wait(timeout=30)


class socket_on:
    """A port held by a listening socket for the block (no SO_REUSEPORT: nobody else may listen there)."""

    def __enter__(self) -> int:
        import socket

        self.socket = socket.socket()
        self.socket.bind(("0.0.0.0", 0))
        self.socket.listen(1)
        return int(self.socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


def test_the_generated_code_is_current_with_the_proto(tmp_path: Path) -> None:
    from grpc_tools import protoc

    proto = "app/api/tei/grpc/tei.proto"
    include = str(Path(protoc.__file__).parent / "_proto")
    arguments = ["protoc", "-I.", f"-I{include}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert protoc.main([*arguments, f"--grpc_python_out={tmp_path}", proto]) == 0
    finally:
        os.chdir(cwd)
    for name in ("tei_pb2.py", "tei_pb2.pyi", "tei_pb2_grpc.py"):
        generated = (tmp_path / "app/api/tei/grpc" / name).read_text()
        assert generated == (ROOT / "app/api/tei/grpc" / name).read_text(), f"{name}: run make proto"
