"""POST /encode/sparse: a SPLADE model's sparse vectors, equal to sentence-transformers' SparseEncoder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import write_family_model
from tests.helpers import Service, assert_error, wait_until_ready
from tests.retrieval import write_splade

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


# (name, family, pooling): the served models
SPLADES = [
    ("max", "bert", "max"),
    ("sum", "bert", "sum"),
    ("distilbert", "distilbert", "max"),
    ("roberta", "roberta", "max"),
]


def write_bge_m3(directory: Path, seed: int) -> Path:
    """A tiny random XLM-R with BGE-M3's sparse_linear.pt beside it."""
    import torch

    model = write_family_model(directory, "xlm-roberta", seed=seed)
    width = json.loads((model / "config.json").read_text())["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    linear = {"weight": torch.randn(1, width, generator=generator), "bias": torch.randn(1, generator=generator)}
    torch.save(linear, model / "sparse_linear.pt")
    return model


def lexical_weights(directory: Path, text: str) -> dict[int, float]:
    """FlagEmbedding's lexical weights by hand: relu(sparse_linear(h)) for each token of transformers' pass, the
    largest for each id, the tokenizer's cls, eos, pad and unk ids left out."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    state = torch.load(directory / "sparse_linear.pt", weights_only=True)
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]
        weights = torch.relu(hidden @ state["weight"].T + state["bias"]).squeeze(-1).tolist()
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    result: dict[int, float] = {}
    for token, weight in zip(ids, weights, strict=True):
        if token not in unused and weight > 0 and weight > result.get(token, 0.0):
            result[token] = weight
    return result


@pytest.fixture(scope="module")
def splade_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("splade")
    dirs = {
        name: write_splade(root / name, family, pooling, seed) for seed, (name, family, pooling) in enumerate(SPLADES)
    }
    return dirs | {"bge-m3": write_bge_m3(root / "bge-m3", seed=7)}


@pytest.fixture(scope="module")
async def service(splade_dirs: dict[str, Path], bundled_model: TextEncoder) -> AsyncIterator[Service]:
    models = {name: load_model(path, name=name, dtype="float32") for name, path in splade_dirs.items()}
    app = create_app(Settings(), {**models, "minilm": bundled_model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            yield Service(app, client)


def reference(directory: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(directory), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()


@pytest.mark.parametrize("name", [name for name, _, _ in SPLADES])  # (bge-m3: its own test below)
async def test_sparse_vectors_equal_sparse_encoders(service: Service, splade_dirs: dict[str, Path], name: str) -> None:
    response = await service.client.post("/encode/sparse", json={"texts": TEXTS, "model": name})
    assert response.status_code == 200, response.text
    body = response.json()
    theirs = reference(splade_dirs[name], TEXTS)
    assert body["model"] == name and [item["index"] for item in body["data"]] == [0, 1, 2]
    for item, row in zip(body["data"], theirs, strict=True):
        assert item["indices"] == np.nonzero(row)[0].tolist()  # the non-zero ones, ascending
        np.testing.assert_allclose(item["values"], row[item["indices"]], rtol=1e-4, atol=1e-5)
        assert "tokens" not in item
    n_tokens = sum(len(e.ids) for e in service.app.state.registry.get(name).card.tokenizer.encode(TEXTS))
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


async def test_top_k_keeps_the_largest_and_return_tokens_names_them(
    service: Service, splade_dirs: dict[str, Path]
) -> None:
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(splade_dirs["max"]), device="cpu")
    response = await service.client.post(
        "/encode/sparse", json={"texts": TEXTS, "model": "max", "top_k": 5, "return_tokens": True}
    )
    assert response.status_code == 200, response.text
    theirs: list[list[tuple[str, float]]] = encoder.decode(  # type: ignore[assignment]
        encoder.encode(TEXTS, convert_to_tensor=True), top_k=5
    )
    for item, decoded in zip(response.json()["data"], theirs, strict=True):
        assert len(item["indices"]) == 5 and item["indices"] == sorted(item["indices"])
        ours = dict(zip(item["tokens"], item["values"], strict=True))
        assert set(ours) == {token for token, _ in decoded}
        for token, value in decoded:
            assert ours[token] == pytest.approx(value, rel=1e-5)


async def test_bge_m3_lexical_weights_equal_flag_embeddings_formula(
    service: Service, splade_dirs: dict[str, Path]
) -> None:
    response = await service.client.post("/encode/sparse", json={"texts": TEXTS, "model": "bge-m3"})
    assert response.status_code == 200, response.text
    for item, text in zip(response.json()["data"], TEXTS, strict=True):
        theirs = lexical_weights(splade_dirs["bge-m3"], text)
        assert item["indices"] == sorted(theirs)
        np.testing.assert_allclose(item["values"], [theirs[i] for i in item["indices"]], rtol=1e-4, atol=1e-5)
    ranked = await service.client.post(
        "/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:], "model": "bge-m3", "return_documents": True}
    )
    assert ranked.status_code == 200 and ranked.json()["method"] == "sparse-dot"
    query = lexical_weights(splade_dirs["bge-m3"], TEXTS[0])
    for result in ranked.json()["results"]:
        document = lexical_weights(splade_dirs["bge-m3"], result["document"])
        expected = sum(weight * document.get(token, 0.0) for token, weight in query.items())
        assert result["relevance_score"] == pytest.approx(expected, rel=1e-4, abs=1e-5)


async def test_info_says_which_models_are_sparse(service: Service) -> None:
    assert (await service.client.get("/info", params={"model": "max"})).json()["sparse"] == "splade"
    assert (await service.client.get("/info", params={"model": "bge-m3"})).json()["sparse"] == "bge-m3"
    assert (await service.client.get("/info", params={"model": "minilm"})).json()["sparse"] is None


async def test_bad_input_gets_its_422(service: Service) -> None:
    client = service.client
    not_sparse = await client.post("/encode/sparse", json={"texts": TEXTS, "model": "minilm"})
    assert_error(
        not_sparse,
        422,
        "validation_error",
        "model",
        "no sparse output (a SPLADE model's, a masked LM with SpladePooling, or BGE-M3's lexical weights)",
    )
    for body, param in (
        ({"texts": "x", "model": "max", "top_k": 0}, "top_k"),
        ({"texts": [], "model": "max"}, "texts"),
        ({"texts": "x", "model": "max", "pooling": "mean"}, "pooling"),
        ({"texts": ["fine", "word " * 600], "model": "max", "truncate": False}, "texts[1]"),
    ):
        assert_error(await client.post("/encode/sparse", json=body), 422, "validation_error", param)
    unknown = await client.post("/encode/sparse", json={"texts": "x", "model": "nobody"})
    assert unknown.status_code == 404
    assert (await client.post("/encode/sparse", json={"texts": "still serving", "model": "max"})).status_code == 200


async def test_rerank_by_sparse_dot_product_equals_sparse_encoders(
    service: Service, splade_dirs: dict[str, Path]
) -> None:
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(splade_dirs["max"]), device="cpu")
    query, documents = TEXTS[0], TEXTS[1:] + ["A fox is quick and brown."]
    theirs = (
        encoder.similarity(
            encoder.encode_query([query], convert_to_tensor=True),
            encoder.encode_document(documents, convert_to_tensor=True),
        )[0]
        .to_dense()
        .numpy()
    )
    response = await service.client.post("/rerank", json={"query": query, "documents": documents, "model": "max"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["method"] == "sparse-dot"
    assert [r["index"] for r in body["results"]] == np.argsort(-theirs, kind="stable").tolist()
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(float(theirs[result["index"]]), rel=1e-4, abs=1e-5)


def test_a_sparse_linear_of_the_wrong_shape_or_not_a_state_dict_is_refused(tmp_path: Path) -> None:
    import torch

    from model.runtime.weights import load_linear

    torch.save({"weight": torch.zeros(1, 5), "bias": torch.zeros(1)}, tmp_path / "wrong.pt")
    with pytest.raises(ValueError, match="expected"):
        load_linear(tmp_path / "wrong.pt", 8, 1)
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable state dict"):
        load_linear(tmp_path / "junk.pt", 8, 1)


async def test_weights_an_answer_may_hold_are_bounded_and_top_k_narrows(splade_dirs: dict[str, Path]) -> None:
    model = load_model(splade_dirs["max"], name="max", device="cpu", dtype="float32")
    app = create_app(Settings(max_sparse_weights_per_request=100), {"max": model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            assert (await client.get("/info")).json()["limits"]["max_sparse_weights_per_request"] == 100
            whole = await client.post("/encode/sparse", json={"texts": TEXTS})
            assert_error(whole, 422, "validation_error", "texts", "more than the limit of 100 a request")
            assert "top_k" in whole.json()["error"]["message"]
            narrowed = await client.post("/encode/sparse", json={"texts": TEXTS, "top_k": 30})
            assert narrowed.status_code == 200
            assert sum(len(item["indices"]) for item in narrowed.json()["data"]) <= 90
