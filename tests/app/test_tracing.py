"""OpenTelemetry traces (app/tracing.py), read by an OTLP receiver of OpenTelemetry's own protocol (tests/otlp.py):
a span for each request, HTTP and gRPC, continuing the incoming traceparent; under it tokenisation, the queue, the
pass and serialisation; a pass's span shared by the requests it carried, linked both ways; the engine's spans in the
front end's trace when it runs apart; the sampler's word kept; nothing started where the variables ask for nothing,
and a misconfiguration said in one line at start."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from tokenizers import Tokenizer

from app import tracing
from app.api.tei.grpc import tei_pb2 as pb
from app.settings import Settings
from model import TextEncoder
from tests.app.test_grpc import grpc_serving, watch_gathering
from tests.app.test_processes import supervised
from tests.helpers import ROOT, busy, serving, wait_until, write_tiny_model
from tests.otlp import ReceivedSpan, Receiver, grpc_receiver, http_receiver

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
ERROR = 2  # Status.StatusCode
PHASES_IN_ORDER = ("tokenize", "queue", "inference", "serialize")
PHASES = set(PHASES_IN_ORDER)
# Span times are taken from two clocks (the queue's perf_counter, the request's epoch time): they agree within this
SKEW_NS = 2_000_000


def traceparent(sampled: bool = True) -> tuple[str, str, str]:
    """A W3C traceparent header, its trace id and its (the caller's) span id."""
    trace_id, span_id = f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def exporting(monkeypatch: pytest.MonkeyPatch, receiver: Receiver, protocol: str = "http/protobuf") -> dict[str, str]:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # milliseconds
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with http_receiver() as running:
        exporting(monkeypatch, running)
        yield running


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, list[ReceivedSpan]]:
    found: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        if span.parent_id == parent.span_id and span.trace_id == parent.trace_id:
            found.setdefault(span.name, []).append(span)
    return found


def has_phases(request_name: str, trace_id: str, phases: set[str] = PHASES) -> Callable[[list[ReceivedSpan]], bool]:
    """A test for Receiver.wait_for: the trace holds the request's span and each of ``phases`` under it."""

    def done(spans: list[ReceivedSpan]) -> bool:
        mine = [span for span in spans if span.trace_id == trace_id]
        requests = named(mine, request_name)
        return len(requests) == 1 and phases <= set(children(mine, requests[0]))

    return done


def within(inner: ReceivedSpan, outer: ReceivedSpan) -> bool:
    return outer.start_ns - SKEW_NS <= inner.start_ns <= inner.end_ns <= outer.end_ns + SKEW_NS


async def test_each_request_span_holds_its_phases_and_its_pass_is_shared(
    receiver: Receiver, tiny_model: TextEncoder, tiny_model_dir: Path
) -> None:
    texts = [[f"text number {i}", "a lazy dog sat"] for i in range(6)]
    # an idle inference thread waits 50 ms for more texts: the six requests, sent at once, share passes
    async with serving(Settings(batch_wait_ms=50), tiny_model) as service:
        assert tracing.TRACER is not None
        unsampled, ignored_trace, _ = traceparent(sampled=False)
        response = await service.client.post(
            "/encode", json={"texts": ["not sampled"]}, headers={"traceparent": unsampled}
        )
        assert response.status_code == 200
        heads = [traceparent() for _ in texts]
        responses = await asyncio.gather(
            *(
                service.client.post("/encode", json={"texts": pair}, headers={"traceparent": head})
                for pair, (head, _, _) in zip(texts, heads, strict=True)
            )
        )
        assert [r.status_code for r in responses] == [200] * len(texts)
        spans = receiver.wait_for(lambda spans: all(has_phases("POST /encode", t)(spans) for _, t, _ in heads))
    assert tracing.TRACER is None  # stopped with the app that started it
    assert not [span for span in spans if span.trace_id == ignored_trace]  # the caller's sampler said no
    by_id = {span.span_id: span for span in spans}
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    tokens = {text: len(tokenizer.encode(text).ids) for pair in texts for text in pair}
    shared = 0
    for (_, trace_id, caller), response in zip(heads, responses, strict=True):
        mine = receiver.in_trace(trace_id)
        (request,) = named(mine, "POST /encode")
        assert request.parent_id == caller and request.kind == SERVER
        assert request.attributes["http.route"] == "/encode"
        assert request.attributes["http.request.method"] == "POST"
        assert request.attributes["http.response.status_code"] == 200
        assert request.attributes["encoder.request_id"] == response.headers["x-request-id"]
        phases = children(mine, request)
        (tokenize,), (queue,), (inference,), (serialize,) = (phases[name] for name in PHASES_IN_ORDER)
        for phase in (tokenize, queue, inference, serialize):
            assert within(phase, request), phase.name
        assert tokenize.end_ns <= queue.start_ns + SKEW_NS
        assert queue.end_ns == inference.start_ns  # the pass's start ends the wait
        assert inference.end_ns <= serialize.start_ns + SKEW_NS
        assert tokenize.attributes["encoder.texts"] == 2
        assert inference.attributes["encoder.kind"] == "embed" and inference.attributes["encoder.texts"] == 2
        assert len(inference.links) == inference.attributes["encoder.passes"] >= 1
        for link_trace, link_span in inference.links:  # each pass that carried it, linked back to it
            carried = by_id[link_span]
            assert carried.name == "pass" and carried.trace_id == link_trace
            assert (trace_id, request.span_id) in carried.links
            assert within(carried, inference)
            assert carried.attributes["encoder.pass.requests"] == len(carried.links)
            shared += carried.attributes["encoder.pass.requests"] > 1
    requests = {by_trace_request(spans, t): pair for pair, (_, t, _) in zip(texts, heads, strict=True)}
    for carried in named(spans, "pass"):
        # under the first traced request it carried, in that request's trace
        assert (carried.trace_id, carried.parent_id) == carried.links[0]
        carried_texts = [text for _, span_id in carried.links for text in requests[span_id]]
        assert carried.attributes["encoder.pass.texts"] == len(carried_texts)
        assert carried.attributes["encoder.pass.tokens"] == sum(tokens[text] for text in carried_texts)
        longest = max(tokens[text] for text in carried_texts)
        assert carried.attributes["encoder.pass.padded_tokens"] == longest * len(carried_texts)
    assert shared, "no pass carried more than one request"


async def test_a_global_provider_gets_no_second_span_from_the_framework(
    receiver: Receiver, tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that sets OpenTelemetry's global tracer provider (opentelemetry-instrument does) gets no spans from
    FastAPI's own instrumentation: each request is traced once, by the service, and its log line names that trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    framework = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(framework))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # the global, put back after the test
    assert trace.get_tracer_provider() is provider
    caplog.set_level(logging.INFO, logger="app.access")
    async with serving(Settings(), tiny_model) as service:
        heads = {path: traceparent() for path in ("/encode", "/tokenize")}
        for path, (head, _, _) in heads.items():
            response = await service.client.post(path, json={"texts": ["a lazy dog"]}, headers={"traceparent": head})
            assert response.status_code == 200, response.text
        traced = {trace_id for _, trace_id, _ in heads.values()}
        spans = receiver.wait_for(lambda spans: traced <= {span.trace_id for span in spans})
    assert framework.get_finished_spans() == ()
    lines = {record.getMessage().split()[1]: vars(record) for record in caplog.records if record.name == "app.access"}
    for path, (_, trace_id, _) in heads.items():
        (request,) = [span for span in spans if span.trace_id == trace_id and span.kind == SERVER]
        assert request.name == f"POST {path}"
        assert lines[path]["trace_id"] == trace_id and lines[path]["status"] == 200


def by_trace_request(spans: list[ReceivedSpan], trace_id: str) -> str:
    """The span id of the request span in ``trace_id``."""
    (request,) = [span for span in spans if span.trace_id == trace_id and span.kind == SERVER]
    return request.span_id


async def test_an_error_is_traced_with_its_status(receiver: Receiver, tiny_model: TextEncoder) -> None:
    async with serving(Settings(), tiny_model) as service:
        head, trace_id, _ = traceparent()
        response = await service.client.post("/encode", json={"texts": []}, headers={"traceparent": head})
        assert response.status_code == 422
        probed, probe_trace, _ = traceparent()
        assert (await service.client.get("/ready", headers={"traceparent": probed})).status_code == 200
        head_404, trace_404, _ = traceparent()
        assert (await service.client.get("/nowhere", headers={"traceparent": head_404})).status_code == 404
        spans = receiver.wait_for(lambda spans: {trace_id, trace_404} <= {span.trace_id for span in spans})
    assert probe_trace not in {span.trace_id for span in spans}  # probes are not traced (sent before the 404)
    (request,) = [span for span in spans if span.trace_id == trace_id]
    assert request.name == "POST /encode" and request.attributes["http.response.status_code"] == 422
    assert request.status != ERROR  # a client's error is not the server's (OpenTelemetry's HTTP conventions)
    (unmatched,) = [span for span in spans if span.trace_id == trace_404]
    assert unmatched.name == "GET" and "http.route" not in unmatched.attributes


async def test_grpc_calls_continue_the_trace_of_their_metadata(receiver: Receiver, tiny_model: TextEncoder) -> None:
    async with grpc_serving(tiny_model) as service:
        head, trace_id, caller = traceparent()
        answer = await service.embed.Embed(pb.EmbedRequest(inputs="the cat sat"), metadata=(("traceparent", head),))
        assert len(answer.embeddings) == tiny_model.card.dimension
        stream_head, stream_trace, _ = traceparent()
        messages = [pb.EmbedRequest(inputs=text) for text in ("one", "two", "three")]
        answers = [a async for a in service.embed.EmbedStream(iter(messages), metadata=(("traceparent", stream_head),))]
        assert len(answers) == 3
        bad_head, bad_trace, _ = traceparent()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await service.embed.Embed(pb.EmbedRequest(inputs=""), metadata=(("traceparent", bad_head),))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        phases = {"tokenize", "queue", "inference"}
        spans = receiver.wait_for(
            lambda spans: (
                has_phases("tei.v1.Embed/Embed", trace_id, phases)(spans)
                and has_phases("tei.v1.Embed/EmbedStream", stream_trace, phases)(spans)
                and bad_trace in {span.trace_id for span in spans}
            )
        )
    (call,) = named(receiver.in_trace(trace_id), "tei.v1.Embed/Embed")
    assert call.parent_id == caller and call.kind == SERVER
    assert call.attributes == {
        "rpc.system": "grpc",
        "rpc.service": "tei.v1.Embed",
        "rpc.method": "Embed",
        "rpc.grpc.status_code": 0,
    }
    (stream,) = named(receiver.in_trace(stream_trace), "tei.v1.Embed/EmbedStream")
    under = children(spans, stream)
    assert sum(span.attributes["encoder.texts"] for span in under["inference"]) == 3  # every message, in its runs
    (bad,) = [span for span in spans if span.trace_id == bad_trace]
    assert bad.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad.status != ERROR


async def test_gathered_grpc_calls_each_get_a_span_linked_to_the_call_their_run_computed_under(
    receiver: Receiver, tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embed calls that arrive while another computes go as one request (app/api/tei/grpc/server.py, Gathering):
    its phases under the first call's span, and a ``gathered`` span under each other call's, linked to that one."""
    async with grpc_serving(tiny_model) as service:
        arrived, requests = watch_gathering(service, monkeypatch)
        heads = [traceparent() for _ in range(3)]

        def call(text: str, head: str) -> asyncio.Future[pb.EmbedResponse]:
            return asyncio.ensure_future(
                service.embed.Embed(pb.EmbedRequest(inputs=text), metadata=[("traceparent", head)])
            )

        async with busy(service.service.model):
            calls = [call("computing", heads[0][0])]
            await wait_until(lambda: len(requests) == 1)
            calls += [call(text, head) for text, (head, _, _) in zip(("one", "two"), heads[1:], strict=True)]
            await wait_until(lambda: len(arrived) == 3)
        await asyncio.gather(*calls)
        assert sorted(map(len, requests)) == [1, 2]
        lone, *pair = [trace for _, trace, _ in heads]
        spans = receiver.wait_for(
            lambda spans: (
                has_phases("tei.v1.Embed/Embed", lone, {"tokenize", "queue", "inference"})(spans)
                and len(named([span for span in spans if span.trace_id in pair], "tei.v1.Embed/Embed")) == 2
            )
        )
    (leader,) = [trace for trace in pair if has_phases("tei.v1.Embed/Embed", trace, {"inference"})(spans)]
    (follower,) = set(pair) - {leader}
    (leading_call,) = named(receiver.in_trace(leader), "tei.v1.Embed/Embed")
    (inference,) = children(spans, leading_call)["inference"]
    assert inference.attributes["encoder.texts"] == 2  # both calls' texts, in its one request
    (following_call,) = named(receiver.in_trace(follower), "tei.v1.Embed/Embed")
    under = children(spans, following_call)
    assert set(under) == {"gathered"}
    (gathered,) = under["gathered"]
    assert gathered.links == [(leader, leading_call.span_id)] and gathered.attributes == {"encoder.gathered.calls": 2}
    assert within(gathered, following_call)


def test_the_engine_spans_join_the_front_ends_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In the multi-process mode, over OTLP/gRPC: the front end's request span holds its ``engine`` span, and the
    engine process's queue, inference and pass spans are under that one, in the same trace."""
    tiny = write_tiny_model(tmp_path / "tiny", hidden_size=32, intermediate_size=64)
    with grpc_receiver() as receiver:
        env = exporting(monkeypatch, receiver, "grpc")
        env |= {"ENCODER_MODELS": f"tiny={tiny}", "ENCODER_WORKERS": "2", "OTEL_SERVICE_NAME": "encoders-under-test"}
        with supervised(env) as (_, url):
            head, trace_id, caller = traceparent()
            response = httpx.post(f"{url}/encode", json={"texts": ["a cat", "a dog"]}, headers={"traceparent": head})
            assert response.status_code == 200

            def complete(spans: list[ReceivedSpan]) -> bool:
                return {"POST /encode", "engine", "queue", "inference", "pass"} <= {
                    span.name for span in spans if span.trace_id == trace_id
                }

            spans = [span for span in receiver.wait_for(complete) if span.trace_id == trace_id]
    (request,) = named(spans, "POST /encode")
    assert request.parent_id == caller
    assert request.resource["encoder.process"] == "front-end"
    assert request.resource["service.name"] == "encoders-under-test"
    phases = children(spans, request)
    assert {"tokenize", "engine", "serialize"} <= set(phases)
    (engine,) = phases["engine"]
    assert engine.kind == CLIENT and within(engine, request)
    computed = children(spans, engine)
    (queue,), (inference,) = computed["queue"], computed["inference"]
    assert queue.resource["encoder.process"] == inference.resource["encoder.process"] == "engine"
    assert queue.resource["process.pid"] != request.resource["process.pid"]
    assert within(inference, engine) and queue.end_ns == inference.start_ns
    passes = named(spans, "pass")  # the request's two texts, in one pass or (on two lanes) one each
    assert sum(carried.attributes["encoder.pass.texts"] for carried in passes) == 2
    for carried in passes:
        assert carried.parent_id == engine.span_id and carried.links == [(trace_id, engine.span_id)]
        assert carried.resource["encoder.process"] == "engine" and within(carried, inference)
    assert sorted(inference.links) == sorted((trace_id, carried.span_id) for carried in passes)


def test_the_variables_say_whether_traces_are_on() -> None:
    assert tracing.wanted({}) is None
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == "otlp"
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}) == "otlp"
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"}) == "otlp"  # to the default endpoint
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert tracing.wanted(endpoint | {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.wanted(endpoint | {"OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(tracing.TracingUnavailable, match="OTEL_TRACES_EXPORTER=zipkin"):
        tracing.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert tracing.protocol({}) == "http/protobuf"
    assert tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert (
        tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
        == "http/protobuf"
    )


async def test_off_where_the_variables_ask_for_nothing(
    monkeypatch: pytest.MonkeyPatch, tiny_model: TextEncoder
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    async with serving(Settings(), tiny_model) as service:
        assert tracing.TRACER is None
        assert (await service.client.post("/encode", json={"texts": ["a cat"]})).status_code == 200
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    async with serving(Settings(), tiny_model):
        assert tracing.TRACER is None


def test_a_missing_exporter_is_named_with_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(tracing.TracingUnavailable, match=r"encoder-service\[otel\]"):
        tracing.check(env)


def test_a_protocol_the_service_cannot_send_stops_it_at_start() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    done = subprocess.run(
        [sys.executable, "-m", "app.serve", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/json: traces are sent by http/protobuf or grpc"
    ]


def test_nothing_of_the_sdk_is_loaded_where_traces_are_off(tiny_model_dir: Path) -> None:
    """A service that answered a request with the variables absent has not imported OpenTelemetry's SDK."""
    probe = f"""
import asyncio, sys
import httpx
from app.main import create_app
from app.settings import Settings
from model import load_model

async def main():
    app = create_app(Settings(), {{"tiny": load_model({str(tiny_model_dir)!r}, device="cpu", dtype="float32")}})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            while (await client.get("/ready")).status_code != 200:
                await asyncio.sleep(0.05)
            assert (await client.post("/encode", json={{"texts": ["a cat"]}})).status_code == 200
    print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))

asyncio.run(main())
"""
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
