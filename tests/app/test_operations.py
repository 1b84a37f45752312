"""What operators rely on: metrics, request ids and timing headers, logs, CORS, deadlines, the queue bound."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re

import httpx
import numpy as np
import pytest
from starlette.types import Message

from app.logs import JsonFormatter, RequestIdFilter, request_id
from app.settings import Settings
from model import TextEncoder, load_model
from tests.helpers import (
    assert_error,
    busy,
    local_model,
    metric,
    needs_cpu_bfloat16,
    serve,
    serving,
    until_metric,
)


async def test_metrics_count_requests_and_split_latency_by_phase(client: httpx.AsyncClient) -> None:
    before = (await client.get("/metrics")).text
    n_before = metric(before, "encoder_requests_total", 0, route="/encode", method="POST", status="200")
    for texts in (["one"], ["two", "three"]):
        assert (await client.post("/encode", json={"texts": texts})).status_code == 200
    assert (await client.post("/encode", json={"texts": ""})).status_code == 422
    assert (await client.get("/no-such-route")).status_code == 404
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert metric(text, "encoder_requests_total", route="/encode", method="POST", status="200") == n_before + 2
    assert metric(text, "encoder_requests_total", route="/encode", method="POST", status="422") >= 1
    assert metric(text, "encoder_requests_total", route="unmatched", method="GET", status="404") >= 1  # no raw paths
    for phase in ("tokenization", "queue", "inference", "serialization", "total"):
        assert metric(text, "encoder_request_seconds_count", route="/encode", phase=phase) >= 2
    assert metric(text, "encoder_batch_texts_count") >= 2 and metric(text, "encoder_batch_tokens_sum") > 0
    assert metric(text, "encoder_queue_texts") == 0 and metric(text, "encoder_admitted_texts") == 0
    assert (
        metric(
            text,
            "encoder_model_info",
            name="all-MiniLM-L6-v2",
            device="cpu",
            dtype="float32",
            weights_dtype="float32",
            runtime="openvino",  # the session's bundled model (tests/conftest.py, RUNTIME)
            layers="6",
            heads="12",
            hidden_size="384",
            max_tokens="256",
        )
        == 1
    )


@needs_cpu_bfloat16
async def test_bfloat16_products_are_reported_and_serve_close_to_float32(tiny_model_dir, tiny_model) -> None:
    """ENCODER_DTYPE=bfloat16 on a CPU with bfloat16 units: float32 weights,
    bfloat16 products; /info and the model metric say so, and the answers stay near float32's."""
    model = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    async with serve(Settings(), model) as client:
        info = (await client.get("/info")).json()
        assert (info["dtype"], info["weights_dtype"]) == ("bfloat16", "float32")
        text = (await client.get("/metrics")).text
        assert 'dtype="bfloat16"' in text and 'weights_dtype="float32"' in text
        texts = ["the quick brown fox", "hello world"]
        response = await client.post("/encode", json={"texts": texts})
        assert response.status_code == 200
    served = np.array([item["embedding"] for item in response.json()["data"]])
    full = tiny_model.embed(texts).numpy()
    assert not (served == full).all()  # the products did run in bfloat16
    assert abs(served - full).max() < 5e-2


async def test_metrics_stay_open_when_api_keys_are_set(bundled_model: TextEncoder) -> None:
    async with serve(Settings(api_keys="secret-key"), bundled_model) as guarded:
        assert (await guarded.get("/metrics")).status_code == 200
        assert (await guarded.post("/encode", json={"texts": "x"})).status_code == 401


async def test_responses_carry_a_request_id_and_their_timings(client: httpx.AsyncClient) -> None:
    response = await client.post("/encode", json={"texts": "timed"})
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    for header in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-serialization-time"):
        assert float(response.headers[header]) >= 0
    assert float(response.headers["x-inference-time"]) > 0
    assert float(response.headers["x-tokenization-time"]) > 0  # the text was tokenised, in its own time
    unread = await client.post("/tokenize", json={"texts": "timed"})
    assert float(unread.headers["x-tokenization-time"]) > 0 and float(unread.headers["x-inference-time"]) == 0
    echoed = await client.post("/encode", json={"texts": "x"}, headers={"X-Request-ID": "trace-42.a:b"})
    assert echoed.headers["x-request-id"] == "trace-42.a:b"
    hostile = await client.get("/health", headers={"X-Request-ID": "bad id\twith spaces" + "x" * 200})
    assert re.fullmatch(r"[0-9a-f]{32}", hostile.headers["x-request-id"])  # replaced, not echoed
    error = await client.post("/encode", json={"texts": ""}, headers={"X-Request-ID": "on-errors-too"})
    assert error.headers["x-request-id"] == "on-errors-too"


async def test_one_log_line_per_request_with_its_id_and_never_its_body(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "confidential-text-do-not-log"
    caplog.handler.addFilter(RequestIdFilter())  # as the service's own handler does
    with caplog.at_level(logging.INFO):
        await client.post("/encode", json={"texts": secret}, headers={"X-Request-ID": "log-check"})
    lines = [r for r in caplog.records if r.name == "app.access"]
    assert len(lines) == 1
    assert lines[0].getMessage().startswith("POST /encode 200")
    assert vars(lines[0])["status"] == 200 and vars(lines[0])["inference_ms"] > 0
    everything = " ".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert secret not in everything
    assert vars(lines[0])["request_id"] == "log-check"
    caplog.clear()
    labels = {"method": "POST", "route": "/encode", "status": "200"}
    counted = metric((await client.get("/metrics")).text, "encoder_requests_total", 0.0, **labels)
    with caplog.at_level(logging.WARNING):  # ENCODER_LOG_LEVEL=warning: no access line, the request counted still
        assert (await client.post("/encode", json={"texts": "quiet"})).status_code == 200
    assert not [r for r in caplog.records if r.name == "app.access"]
    assert metric((await client.get("/metrics")).text, "encoder_requests_total", **labels) == counted + 1


def test_json_log_lines_carry_the_request_id_and_extra_fields() -> None:
    record = logging.LogRecord("app.access", logging.INFO, __file__, 1, "POST /encode %d", (200,), None)
    record.status = 200
    token = request_id.set("abc123")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id.reset(token)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "POST /encode 200" and entry["request_id"] == "abc123"
    assert entry["status"] == 200 and entry["level"] == "info" and entry["logger"] == "app.access"


async def test_cors_is_closed_by_default_and_opens_for_configured_origins(bundled_model: TextEncoder) -> None:
    origin = {"Origin": "https://notebook.example"}
    async with serve(Settings(), bundled_model) as closed:
        response = await closed.get("/info", headers=origin)
        assert "access-control-allow-origin" not in response.headers
    async with serve(Settings(cors_origins="https://notebook.example"), bundled_model) as open_:
        response = await open_.get("/info", headers=origin)
        assert response.headers["access-control-allow-origin"] == "https://notebook.example"
        preflight = await open_.options(
            "/encode",
            headers={
                **origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        other = await open_.get("/info", headers={"Origin": "https://elsewhere.example"})
        assert "access-control-allow-origin" not in other.headers


async def test_a_request_past_its_deadline_is_dropped_and_answered_503(bundled_model: TextEncoder) -> None:
    async with serving(Settings(request_timeout_s=0.3), bundled_model) as service:
        client = service.client
        async with busy(service.model):
            response = await client.post("/encode", json={"texts": ["late one", "late two"]})
            error = assert_error(response, 503, "timeout", None, "not answered within 0.3 s")
            assert int(response.headers["retry-after"]) >= 1 and "overloaded" in error["message"]
        assert (await client.post("/encode", json={"texts": "on time"})).status_code == 200
        # the late texts were never computed
        await until_metric(client, "encoder_dropped_texts_total", lambda dropped: dropped == 2)
        assert metric((await client.get("/metrics")).text, "encoder_timeouts_total") == 1


async def test_a_deadline_reached_where_the_engine_runs_is_answered_and_counted_as_one_reached_here(
    bundled_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the engine is a process of its own, the request's deadline may pass there first, and its Timeout
    comes back in place of the result: the answer is the one a deadline reached here gives, and it is counted."""
    from app.engine.errors import DeadlinePassed

    async with serving(Settings(request_timeout_s=7), bundled_model) as service:
        served = service.app.state.registry.get(None)

        async def late(*args: object, **kwargs: object) -> list:
            raise DeadlinePassed("the request was not answered in time")  # as the engine sends it

        monkeypatch.setattr(served.queue, "run", late)
        response = await service.client.post("/encode", json={"texts": ["late"]})
        assert_error(response, 503, "timeout", None, "not answered within 7 s")
        assert int(response.headers["retry-after"]) >= 1
        assert metric((await service.client.get("/metrics")).text, "encoder_timeouts_total") == 1


async def test_the_queue_is_bounded_in_texts(bundled_model: TextEncoder) -> None:
    async with serving(Settings(max_queue_texts=4), bundled_model) as service:
        client = service.client
        async with busy(service.model):
            waiting = asyncio.ensure_future(client.post("/encode", json={"texts": ["a", "b", "c"]}))
            fits = asyncio.ensure_future(client.post("/encode", json={"texts": ["f"]}))  # 3 + 1 ≤ 4: admitted
            await until_metric(client, "encoder_admitted_texts", lambda admitted: admitted == 4)
            assert_error(await client.post("/encode", json={"texts": ["d"]}), 429, "overloaded", None, "4 texts in")
        assert (await waiting).status_code == 200 and (await fits).status_code == 200
        # alone, a request larger than the whole bound is still served rather than refused forever
        assert (await client.post("/encode", json={"texts": [str(i) for i in range(10)]})).status_code == 200


async def test_what_loading_made_is_out_of_the_collectors_reach(bundled_model: TextEncoder) -> None:
    """Full collections stall the event loop for as long as they traverse; the model, its tokenizer and the
    application live as long as the process, so once the service is ready they are frozen (not traversed)."""
    async with serving(Settings(), bundled_model) as running:
        assert (await running.client.get("/health")).status_code == 200
        tracked = gc.get_objects()  # every generation the collector traverses; frozen objects are not there
        long_lived = [local_model(running.model), running.model.card.tokenizer, running.model.queue]
        assert not any(obj is candidate for obj in tracked for candidate in long_lived)
        assert gc.get_freeze_count() > 10_000


@pytest.mark.parametrize("declared", [True, False], ids=["short-way", "framework-way"])
async def test_a_client_that_leaves_has_its_texts_dropped_and_the_service_goes_on(
    bundled_model: TextEncoder, declared: bool
) -> None:
    """The client disconnects while its texts wait: they are never computed (counted as dropped), its request is
    counted with status 499, and the next request is answered."""
    async with serving(Settings(), bundled_model) as service:
        body = b'{"texts": ["left one", "left two", "left three"]}'
        headers = [(b"content-type", b"application/json")]
        if declared:
            headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/encode", "raw_path": b"/encode", "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80), "state": {},
        }  # fmt: skip
        leave = asyncio.Event()
        messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Message:
            if messages:
                return messages.pop(0)
            await leave.wait()
            return {"type": "http.disconnect"}

        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        metrics = (await service.client.get("/metrics")).text
        dropped = metric(metrics, "encoder_dropped_texts_total", 0)
        counted = metric(metrics, "encoder_requests_total", 0, route="/encode", method="POST", status="499")
        async with busy(service.model):
            request = asyncio.ensure_future(service.app(scope, receive, send))
            await until_metric(service.client, "encoder_admitted_texts", lambda admitted: admitted == 3)
            leave.set()
            await asyncio.wait_for(request, 10)
        assert sent[0]["status"] == 499
        await until_metric(service.client, "encoder_queue_texts", lambda queued: queued == 0)
        metrics = (await service.client.get("/metrics")).text
        assert metric(metrics, "encoder_dropped_texts_total") == dropped + 3
        assert metric(metrics, "encoder_requests_total", route="/encode", method="POST", status="499") == counted + 1
        assert metric(metrics, "encoder_admitted_texts") == 0
        assert (await service.client.post("/encode", json={"texts": "next"})).status_code == 200
