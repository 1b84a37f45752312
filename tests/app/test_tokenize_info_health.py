"""POST /tokenize, GET /info, GET /health, the OpenAPI schema."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

import app.main
from app.settings import Settings
from tests.helpers import assert_error, free_port, serve, serving, wait_until


async def test_tokenize_equals_the_tokenizer(client: httpx.AsyncClient, hf_tokenizer) -> None:
    texts = ["Hello, world!", "naïve café"]
    body = (await client.post("/tokenize", json={"texts": texts})).json()
    assert body["model"] == "all-MiniLM-L6-v2"
    for text, item in zip(texts, body["data"], strict=True):
        reference = hf_tokenizer(text, return_offsets_mapping=True)
        assert [t["id"] for t in item["tokens"]] == reference["input_ids"]
        assert [[t["start"], t["end"]] for t in item["tokens"]] == [list(o) for o in reference["offset_mapping"]]


async def test_tokenize_pairs_one_for_all_or_one_per_text(client: httpx.AsyncClient, hf_tokenizer) -> None:
    shared = (await client.post("/tokenize", json={"texts": ["a b", "c"], "text_pair": "d"})).json()
    each = (await client.post("/tokenize", json={"texts": ["a b", "c"], "text_pair": ["d", None]})).json()
    assert [t["segment"] for t in shared["data"][1]["tokens"]] == hf_tokenizer("c", "d")["token_type_ids"]
    assert each["data"][0] == shared["data"][0]
    assert [t["segment"] for t in each["data"][1]["tokens"]] == [0, 0, 0]


async def test_info_describes_model_device_and_limits(client: httpx.AsyncClient, bundled_path) -> None:
    body = (await client.get("/info")).json()
    assert body["model"] == "all-MiniLM-L6-v2" and body["path"] == str(bundled_path)
    assert body["architecture"] == {
        "layers": 6,
        "heads": 12,
        "hidden_size": 384,
        "intermediate_size": 1536,
        "vocab_size": 30522,
        "max_positions": 512,
        "position_embedding": "learned",
        "activation": "gelu",
        "pooling": "mean",
        "normalize": True,
        "family": "bert",
        "position_encoding": "learned",
        "attention": "bidirectional",
        "kv_heads": 12,
        "head_dim": 32,
        "norm": "layernorm",
        "sliding_window": None,
        "local_layers": [],
        "dimension": 384,
    }
    assert (body["device"], body["dtype"]) == ("cpu", "float32")
    assert (body["weights_dtype"], body["explicit_weights_dtype"], body["rerank"]) == ("float32", "float32", "cosine")
    assert body["sparse"] is None
    assert body["runtime"] == "openvino"  # the session's bundled model (tests/conftest.py, RUNTIME)
    assert body["limits"]["max_batch_texts"] == 256 and body["limits"]["max_tokens_per_text"] == 256
    assert body["auth"] is False
    assert body["version"]


async def test_health_is_503_until_the_model_is_warm(monkeypatch: pytest.MonkeyPatch, bundled_model) -> None:
    release = threading.Event()
    real_load = app.main.load_registry

    def slow_load(*args, **kwargs):
        assert release.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(app.main, "load_registry", slow_load)
    async with serve(Settings(), bundled_model, ready=False) as client:
        assert_error(await client.get("/health"), 503, "not_ready", contains="loading")
        assert_error(await client.get("/ready"), 503, "not_ready", contains="loading")
        assert (await client.head("/health")).status_code == 503
        assert (await client.head("/ready")).status_code == 503
        assert_error(await client.post("/encode", json={"texts": "x"}), 503, "not_ready")
        release.set()
        for _ in range(500):
            if (await client.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        for path in ("/health", "/ready", "/tei/health"):
            response = await client.get(path)
            assert response.status_code == 200, path
            head = await client.head(path)  # probes that use HEAD: as GET, without a body
            assert (head.status_code, head.content) == (200, b""), path
        assert (await client.get("/health")).json() == (await client.get("/ready")).json() == {"status": "ok"}


async def test_a_model_that_fails_to_load_is_reported_to_the_failure_hook_in_one_line(tmp_path) -> None:
    failures: list[str] = []
    missing = tmp_path / "missing"
    async with serving(Settings(model_dir=missing), ready=False, on_load_failure=failures.append) as service:
        await wait_until(lambda: bool(failures))
        error = assert_error(await service.client.get("/health"), 503, "not_ready", contains="failed to load")
    assert failures == [f"cannot serve model 'missing' from {missing}: model directory {missing} does not exist"]
    assert "does not exist" in error["message"]


@pytest.mark.slow
def test_a_server_whose_model_cannot_load_exits_non_zero_naming_directory_and_problem(tmp_path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "gpt2"}')
    process = subprocess.run(
        [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app", "--port", str(free_port())],
        env={**os.environ, "ENCODER_MODEL_DIR": str(broken)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 1, process.stderr
    lines = [line for line in process.stderr.splitlines() if "cannot serve model" in line]
    assert len(lines) == 1, process.stderr
    assert str(broken) in lines[0] and "unsupported config field 'model_type': 'gpt2'" in lines[0]
    assert "ERROR" in lines[0] and "Traceback" not in process.stderr


async def test_openapi_schema_shows_limits_and_examples(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    assert {"/encode", "/attention", "/positional-encoding", "/tokenize", "/info", "/health"} <= set(schema["paths"])
    components = schema["components"]["schemas"]
    assert components["AttentionRequest"]["properties"]["decimals"]["anyOf"][0]["maximum"] == 8
    assert components["EncodeRequest"]["properties"]["texts"]["anyOf"][1]["minItems"] == 1
    assert components["EncodeRequest"]["examples"]
    assert "422" in schema["paths"]["/encode"]["post"]["responses"]


async def test_root_serves_the_viewer_page_and_its_assets(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>Encoder inspector</title>" in page.text
    script = await client.get("/static/viewer.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "http://" not in script.text and "https://" not in script.text  # nothing from the network
    assert_error(await client.get("/static/missing.js"), 404, "not_found")


def test_importing_the_app_module_has_no_side_effects() -> None:
    """No app, no model, no logging set-up and no threads until create_app() is called."""
    probe = (
        "import logging, threading; handlers = list(logging.getLogger().handlers); import app.main; "
        "assert not hasattr(app.main, 'app'); assert logging.getLogger().handlers == handlers; "
        "assert threading.active_count() == 1, threading.enumerate(); print('clean')"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "clean", result.stderr


@pytest.mark.parametrize(("runtime", "reported"), [("torch", "torch (traced)"), ("openvino", "openvino")])
async def test_the_runtime_setting_picks_what_computes_the_pass(
    tiny_model_dir: Path, runtime: str, reported: str
) -> None:
    """ENCODER_RUNTIME, loaded from a directory: /info and the model metric say what computes the pass."""
    async with serve(Settings(model_dir=tiny_model_dir, dtype="float32", runtime=runtime)) as client:
        assert (await client.get("/info")).json()["runtime"] == reported
        assert f'runtime="{reported}"' in (await client.get("/metrics")).text
        assert (await client.post("/encode", json={"texts": ["hello world"]})).status_code == 200


async def test_int8_is_reported_where_it_runs(tiny_model_dir: Path) -> None:
    """ENCODER_DTYPE=int8: /info and the model metric name the precision and OpenVINO, and the pass serves."""
    async with serve(Settings(model_dir=tiny_model_dir, dtype="int8", runtime="auto")) as client:
        info = (await client.get("/info")).json()
        assert (info["dtype"], info["weights_dtype"]) == ("int8", "int8")
        # one compiled pass with AMX, two without (model/runtime/loader.py, ``openvino_passes``)
        assert info["runtime"] in ("openvino", "openvino for one text, openvino (packed) for more"), info["runtime"]
        assert 'dtype="int8"' in (await client.get("/metrics")).text
        assert (await client.post("/encode", json={"texts": ["hello world"]})).status_code == 200


def test_every_operation_in_the_schema_has_its_own_id() -> None:
    """HEAD answers as GET without being a second operation: duplicate operationIds break generated clients."""
    schema = app.main.create_app().openapi()
    ids = [operation["operationId"] for operations in schema["paths"].values() for operation in operations.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert list(schema["paths"]["/ready"]) == ["get"] and list(schema["paths"]["/health"]) == ["get"]
