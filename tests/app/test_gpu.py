"""The service on a CUDA GPU, end to end over HTTP: what /info reports, the numbers against the references on the
CPU, and the GPU memory in /metrics. Runs only where torch sees a GPU (the parity tests cover the model itself:
tests/model/test_parity.py and test_families.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.settings import Settings
from model import load_model
from tests.app.test_explain import MODEL_DIRS, PAIR, TEXT, assert_equal_to_captum, captum_of
from tests.app.test_tasks import classifier_dir, cross_encoder_dir
from tests.families import write_family_model
from tests.helpers import serve, start_server, wait_until_ready

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.mark.parametrize(
    ("dtype", "graphs", "min_cosine", "weight_bytes"),
    [("auto", True, 0.9999, 4 + 2), ("auto", False, 0.9999, 4 + 2), ("float32", True, 0.99999, 4)],
)
async def test_the_service_on_cuda_equals_the_references(
    dtype, graphs, min_cosine, weight_bytes, sentence_transformer, hf_bert, hf_tokenizer
) -> None:
    """Under float16 the embedding pass runs on a float16 copy of the weights; /attention runs in float32 on the
    float32 weights either way, and equals transformers within 1e-4."""
    async with serve(Settings(device="cuda", dtype=dtype, cuda_graphs=graphs)) as client:
        info = (await client.get("/info")).json()
        assert info["device"].startswith("cuda")
        assert info["dtype"] == ("float16" if dtype == "auto" else "float32")

        response = await client.post("/encode", json={"texts": TEXTS})
        assert response.status_code == 200, response.text
        ours = np.array([item["embedding"] for item in response.json()["data"]])
        theirs = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= min_cosine, cosine

        response = await client.post("/attention", json={"text": TEXTS[0]})
        assert response.status_code == 200, response.text
        with torch.inference_mode():
            output = hf_bert(**hf_tokenizer(TEXTS[0], return_tensors="pt"), output_attentions=True)
        expected = torch.stack(output.attentions)[:, 0].numpy()
        assert np.abs(np.array(response.json()["attention"]) - expected).max() <= 1e-4

        metrics = (await client.get("/metrics")).text
        held = re.search(r'^encoder_model_gpu_memory_bytes\{model="all-MiniLM-L6-v2"\} (\S+)$', metrics, re.M)
        assert held is not None, "the model's GPU memory is reported"
        weights = sum(p.numel() for p in hf_bert.parameters()) * weight_bytes  # BertModel's pooler: ~1 % more
        assert float(held.group(1)) >= 0.9 * weights
        if not graphs:  # no graphs' scratch memory: the weights, and cuBLAS's workspace where nothing used it before
            assert float(held.group(1)) <= 1.5 * weights
        peak = re.search(r'^encoder_gpu_memory_peak_bytes\{device="cuda[:0-9]*"\} (\S+)$', metrics, re.M)
        assert peak is not None and float(peak.group(1)) >= float(held.group(1))


async def test_two_compute_lanes_on_cuda_give_each_request_its_own_rows(sentence_transformer) -> None:
    """ENCODER_COMPUTE_LANES=2 on a GPU: one lane pads and copies its batch while the other's pass runs (the graphs'
    replays serialised by their lock, every copy and pass in one stream's order). Concurrent requests of unlike
    sizes each get their own rows, equal to the reference."""
    texts = [f"{TEXTS[i % len(TEXTS)]} ({i})" for i in range(64)]
    batches = [texts[k : k + 1 + k % 7] for k in range(48)]
    async with serve(Settings(device="cuda", compute_lanes=2)) as client:

        async def encoded(batch: list[str]) -> np.ndarray:
            response = await client.post("/encode", json={"texts": batch})
            assert response.status_code == 200, response.text
            return np.array([item["embedding"] for item in response.json()["data"]])

        answers = await asyncio.gather(*(encoded(batch) for batch in batches))
    for batch, ours in zip(batches, answers, strict=True):
        theirs = sentence_transformer.encode(batch, normalize_embeddings=True)
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= 0.9999, (batch, cosine)


EXPLAINED = [  # (model, target, method, steps): a cross-encoder, a classifier's label by name, a yes/no reranker
    ("bert-ce", None, "integrated_gradients", 50),
    ("bert-cls", "LABEL_1", "gradient_x_input", 50),
    ("reranker", None, "integrated_gradients", 20),
]


@pytest.fixture(scope="module")
def explained_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("explain-cuda")
    models = {
        "bert-ce": cross_encoder_dir(root, "bert"),
        "bert-cls": classifier_dir(root, "bert"),
        "reranker": write_family_model(root / "reranker", "qwen3-reranker", head="causal-lm"),
    }
    MODEL_DIRS.update(models)  # where test_explain's Captum reference finds them
    return models


async def explain_all(client: httpx.AsyncClient) -> None:
    """Each of EXPLAINED asked of the service, against Captum on transformers' model on the CPU in float32."""
    for name, target, method, steps in EXPLAINED:
        body = {"model": name, "text": TEXT, "text_pair": PAIR, "method": method, "steps": steps}
        if target is not None:
            body["target"] = target
        response = await client.post("/explain", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        index = 0 if answer["target"] is None else answer["target"]["index"]
        assert index == (1 if target == "LABEL_1" else 0)
        assert_equal_to_captum(answer, captum_of(answer, name, method, steps))


async def test_explain_on_cuda_equals_captum_in_process(explained_models: dict[str, Path]) -> None:
    """Explanations run where the model runs, in float32 whatever the pass's precision (float16 here)."""
    loaded = {name: load_model(path, device="cuda", dtype="auto", name=name) for name, path in explained_models.items()}
    assert all(model.device.type == "cuda" for model in loaded.values())
    app = create_app(Settings(device="cuda", max_explain_steps=64), loaded)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            await wait_until_ready(client)
            assert (await client.get("/info")).json()["dtype"] == "float16"
            await explain_all(client)


async def test_explain_on_cuda_equals_captum_with_the_engine_apart(explained_models: dict[str, Path]) -> None:
    models = ",".join(f"{name}={path}" for name, path in explained_models.items())
    env = {"ENCODER_DEVICE": "cuda", "ENCODER_DTYPE": "auto", "ENCODER_MODELS": models, "ENCODER_WORKERS": "2"}
    process, url = start_server(env, timeout=300, supervised=True)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            await wait_until_ready(client, timeout=300)
            await explain_all(client)
    finally:
        process.terminate()
        process.wait(timeout=60)
