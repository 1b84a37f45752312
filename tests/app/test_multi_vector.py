"""POST /encode/multi-vector and MaxSim reranking on a BGE-M3-shaped model (XLM-R with colbert_linear.pt and
sparse_linear.pt), against FlagEmbedding's formulas computed by hand on transformers' pass."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sentence_transformers.util.quantization import quantize_embeddings

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import write_family_model
from tests.helpers import Service, assert_error, wait_until_ready

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]
COLBERT_WIDTH = 12


@pytest.fixture(scope="module")
def bge_m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_family_model(tmp_path_factory.mktemp("bge-m3") / "bge-m3", "xlm-roberta", seed=3)
    width = json.loads((directory / "config.json").read_text())["hidden_size"]
    generator = torch.Generator().manual_seed(3)
    colbert = {"weight": torch.randn(COLBERT_WIDTH, width, generator=generator), "bias": torch.randn(COLBERT_WIDTH)}
    torch.save(colbert, directory / "colbert_linear.pt")
    torch.save(
        {"weight": torch.randn(1, width, generator=generator), "bias": torch.zeros(1)}, directory / "sparse_linear.pt"
    )
    return directory


@pytest.fixture(scope="module")
async def service(bge_m3_dir: Path, bundled_model: TextEncoder) -> AsyncIterator[Service]:
    model = load_model(bge_m3_dir, name="bge-m3", device="cpu", dtype="float32")
    app = create_app(Settings(), {"bge-m3": model, "minilm": bundled_model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            yield Service(app, client)


def colbert_vectors(directory: Path, text: str) -> tuple[np.ndarray, list[str]]:
    """FlagEmbedding's ColBERT vectors by hand: normalize(colbert_linear(h)) for every token after the first."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    state = torch.load(directory / "colbert_linear.pt", weights_only=True)
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0, 1:]
        vectors = torch.nn.functional.normalize(hidden @ state["weight"].T + state["bias"], dim=-1)
    tokens: list[str] = tokenizer.convert_ids_to_tokens(ids)[1:]  # type: ignore[assignment]
    return vectors.numpy(), tokens


async def test_vectors_equal_flag_embeddings_formula(service: Service, bge_m3_dir: Path) -> None:
    response = await service.client.post("/encode/multi-vector", json={"texts": TEXTS, "model": "bge-m3"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dim"] == COLBERT_WIDTH
    for item, text in zip(body["data"], TEXTS, strict=True):
        theirs, tokens = colbert_vectors(bge_m3_dir, text)
        np.testing.assert_allclose(item["embeddings"], theirs, atol=2e-5)
        assert item["tokens"] == tokens
    packed = await service.client.post(
        "/encode/multi-vector", json={"texts": TEXTS[0], "model": "bge-m3", "encoding_format": "ubinary"}
    )
    floats = np.array(body["data"][0]["embeddings"], dtype=np.float32)
    expected = np.asarray(quantize_embeddings(floats, precision="ubinary")).astype(np.int64)
    np.testing.assert_array_equal(np.array(packed.json()["data"][0]["embeddings"]), expected)


async def test_rerank_by_maxsim_averaged_over_the_query(service: Service, bge_m3_dir: Path) -> None:
    query, documents = TEXTS[0], [*TEXTS[1:], "A quick fox."]
    response = await service.client.post("/rerank", json={"query": query, "documents": documents, "model": "bge-m3"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["method"] == "maxsim"
    q, _ = colbert_vectors(bge_m3_dir, query)
    expected = [float((q @ colbert_vectors(bge_m3_dir, d)[0].T).max(axis=1).mean()) for d in documents]
    assert [r["index"] for r in body["results"]] == np.argsort(-np.array(expected), kind="stable").tolist()
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
    for method in ("sparse-dot", "cosine"):  # the model's other ways, when asked
        other = {"query": query, "documents": documents, "model": "bge-m3", "method": method}
        answer = await service.client.post("/rerank", json=other)
        assert answer.status_code == 200 and answer.json()["method"] == method
    info = (await service.client.get("/info", params={"model": "bge-m3"})).json()
    assert (info["rerank"], info["sparse"], info["multi_vector"]) == ("maxsim", "bge-m3", "bge-m3")


async def test_a_model_without_vectors_of_its_tokens_gets_a_422(service: Service) -> None:
    response = await service.client.post("/encode/multi-vector", json={"texts": TEXTS, "model": "minilm"})
    assert_error(response, 422, "validation_error", "model", "no multi-vector output")
    maxsim = {"query": "q", "documents": ["d"], "model": "minilm", "method": "maxsim"}
    assert_error(await service.client.post("/rerank", json=maxsim), 422, "validation_error", "method", "by cosine")
    bad = {"texts": "x", "model": "bge-m3", "encoding_format": "int4"}
    assert_error(
        await service.client.post("/encode/multi-vector", json=bad), 422, "validation_error", "encoding_format"
    )
    assert (
        await service.client.post("/encode/multi-vector", json={"texts": "ok", "model": "bge-m3"})
    ).status_code == 200


async def test_similarity_is_maxsim_averaged_and_explained_by_best_matches(service: Service, bge_m3_dir: Path) -> None:
    source, texts = TEXTS[0], TEXTS[1:]
    body = {"source": source, "texts": texts, "model": "bge-m3", "explain": True}
    response = await service.client.post("/similarity", json=body)
    assert response.status_code == 200, response.text
    q, source_tokens = colbert_vectors(bge_m3_dir, source)
    for item, text in zip(response.json()["data"], texts, strict=True):
        d, tokens = colbert_vectors(bge_m3_dir, text)
        products = q @ d.T
        assert item["score"] == pytest.approx(float(products.max(axis=1).mean()), abs=1e-5)
        explanation = item["explanation"]
        assert (explanation["source_tokens"], explanation["tokens"]) == (source_tokens, tokens)
        contributions = np.array(explanation["contributions"])
        expected = np.zeros_like(products)
        expected[np.arange(len(q)), products.argmax(axis=1)] = products.max(axis=1) / len(q)
        np.testing.assert_allclose(contributions, expected, atol=2e-5)
