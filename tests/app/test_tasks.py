"""/rerank against sentence-transformers' CrossEncoder, /classify against transformers, on tiny random models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import write_family_model
from tests.helpers import Service, local_model, wait_until_ready, write_tiny_model

QUERY = "what does the cat do"
DOCUMENTS = ["the cat sat on the mat", "a lazy dog", "hello world", "the quick brown fox jumps over the dog", "a cat"]
TEXTS = ["the cat sat on the mat", "hello world", "attention is all you need"]
PAIRS = ["a cat", "the dog", None]


def cross_encoder_dir(root: Path, family: str) -> Path:
    if family == "bert":
        return write_tiny_model(root / "bert-ce", head="sequence-classification", num_labels=1)
    return write_family_model(root / f"{family}-ce", family, head="sequence-classification", num_labels=1)


def classifier_dir(root: Path, family: str) -> Path:
    if family == "bert":
        return write_tiny_model(root / "bert-cls", head="sequence-classification", num_labels=3)
    return write_family_model(root / f"{family}-cls", family, head="sequence-classification", num_labels=3)


MODEL_DIRS: dict[str, Path] = {}  # name → directory of the models the fixture below serves


@pytest.fixture(scope="module")
async def tasks(tmp_path_factory: pytest.TempPathFactory, tiny_model: TextEncoder) -> AsyncIterator[Service]:
    """Cross-encoders and classifiers of two families, and a plain encoder, in one service."""

    root = tmp_path_factory.mktemp("tasks")
    models = {
        "bert-ce": cross_encoder_dir(root, "bert"),
        "modernbert-ce": cross_encoder_dir(root, "modernbert"),
        "bert-cls": classifier_dir(root, "bert"),
        "roberta-cls": classifier_dir(root, "roberta"),
        "roberta-multi": write_family_model(
            root / "roberta-multi",
            "roberta",
            head="sequence-classification",
            num_labels=3,
            problem_type="multi_label_classification",
        ),
    }
    loaded = {"plain": tiny_model} | {
        name: load_model(path, device="cpu", dtype="float32", name=name) for name, path in models.items()
    }
    app = create_app(Settings(), loaded)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            MODEL_DIRS.update(models)
            yield Service(app, client)


@pytest.mark.parametrize("name", ["bert-ce", "modernbert-ce"])
async def test_rerank_equals_cross_encoder_predict(tasks: Service, name: str) -> None:
    from sentence_transformers import CrossEncoder

    directory = MODEL_DIRS[name]
    cross_encoder = CrossEncoder(str(directory), device="cpu")
    pairs = [(QUERY, document) for document in DOCUMENTS]
    expected = cross_encoder.predict(pairs)  # sigmoid of the single logit
    raw = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity())
    body = (await tasks.client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "model": name})).json()
    assert body["model"] == name
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == len(DOCUMENTS)
    for result in body["results"]:
        assert result.keys() == {"index", "relevance_score"}
        assert result["relevance_score"] == pytest.approx(float(expected[result["index"]]), abs=1e-5)
    request = {
        "query": QUERY,
        "documents": DOCUMENTS,
        "model": name,
        "top_n": 2,
        "return_documents": True,
        "raw_scores": True,
    }
    top = (await tasks.client.post("/rerank", json=request)).json()["results"]
    best = np.argsort(-raw)[:2]
    assert [r["index"] for r in top] == best.tolist()
    for result in top:
        assert result["document"] == DOCUMENTS[result["index"]]
        assert result["relevance_score"] == pytest.approx(float(raw[result["index"]]), abs=1e-5)


@pytest.mark.parametrize("name", ["bert-cls", "roberta-cls", "roberta-multi"])
async def test_classify_equals_transformers(tasks: Service, name: str) -> None:
    from transformers import AutoModelForSequenceClassification

    model = local_model(tasks.app.state.registry.get(name))
    encodings = model.card.tokenizer.encode(TEXTS, PAIRS)
    batch = model.card.tokenizer.pad(encodings)
    inputs = {"input_ids": torch.from_numpy(batch.input_ids), "attention_mask": torch.from_numpy(batch.attention_mask)}
    if model.card.config.type_vocab_size > 1:
        inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
    reference = AutoModelForSequenceClassification.from_pretrained(MODEL_DIRS[name]).eval()
    with torch.inference_mode():
        logits = reference(**inputs).logits
    multi = name == "roberta-multi"
    expected = (torch.sigmoid(logits) if multi else torch.softmax(logits, dim=-1)).numpy()
    body = (await tasks.client.post("/classify", json={"texts": TEXTS, "text_pair": PAIRS, "model": name})).json()
    labels = reference.config.id2label
    for row, item in enumerate(body["data"]):
        assert item["index"] == row
        scores = [entry["score"] for entry in item["labels"]]
        assert scores == sorted(scores, reverse=True)
        got = {entry["label"]: entry["score"] for entry in item["labels"]}
        for label_id, label in labels.items():
            assert got[label] == pytest.approx(float(expected[row, int(label_id)]), abs=1e-5)
    top = (await tasks.client.post("/classify", json={"texts": TEXTS[0], "model": name, "top_k": 1})).json()
    assert len(top["data"][0]["labels"]) == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "words"),
    [
        (
            "/rerank",
            {"query": "q", "documents": ["d"], "model": "plain", "method": "cross-encoder"},
            422,
            "method",
            "by cosine",
        ),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "bert-ce", "method": "cosine"}, 422, "method", ""),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "plain", "instruction": "x"}, 422, "instruction", ""),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "bert-cls"}, 422, "model", "has 3 outputs"),
        ("/classify", {"texts": "x", "model": "plain"}, 422, "model", "cannot classify"),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "bert-ce", "top_n": 0}, 422, "top_n", ""),
        ("/rerank", {"query": "q", "documents": [], "model": "bert-ce"}, 422, "documents", ""),
        ("/rerank", {"query": "q", "documents": ["ok", ""], "model": "bert-ce"}, 422, "documents[1]", "empty"),
        ("/rerank", {"query": "", "documents": ["d"], "model": "bert-ce"}, 422, "query", "empty"),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "nope"}, 404, "model", "no model named"),
        ("/classify", {"texts": ["a", "b"], "text_pair": ["c"], "model": "bert-cls"}, 422, "text_pair", "1 entry for"),
        ("/classify", {"texts": "x", "model": "bert-cls", "top_k": 0}, 422, "top_k", ""),
        (
            "/rerank",
            {"query": "q", "documents": ["the " * 80], "model": "bert-ce", "truncate": False},
            422,
            "documents[0]",
            "tokens, more than the maximum",
        ),
    ],
)
async def test_bad_task_requests_get_their_error(
    tasks: Service, path: str, body: dict, status: int, param: str, words: str
) -> None:
    response = await tasks.client.post(path, json=body)
    type_ = "model_not_found" if status == 404 else "validation_error"
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == (type_, param) and words in error["message"], error


async def test_an_embedding_model_reranks_by_cosine_as_sentence_transformers(
    client: httpx.AsyncClient, sentence_transformer, hf_tokenizer
) -> None:
    query = "where does the cat sit?"
    theirs = sentence_transformer.similarity(
        sentence_transformer.encode_query([query]), sentence_transformer.encode_document(DOCUMENTS)
    )[0].numpy()
    body = {"query": query, "documents": DOCUMENTS, "top_n": 3, "return_documents": True, "method": "cosine"}
    response = await client.post("/rerank", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["method"] == "cosine"
    assert [r["index"] for r in answer["results"]] == np.argsort(-theirs, kind="stable")[:3].tolist()
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(float(theirs[result["index"]]), abs=1e-5)
        assert result["document"] == DOCUMENTS[result["index"]]
    n_tokens = sum(len(ids) for ids in hf_tokenizer([query, *DOCUMENTS])["input_ids"])
    assert answer["usage"]["prompt_tokens"] == n_tokens
