"""A text of whitespace alone is refused as an empty one is, on every endpoint that takes text (API.md, part five,
"Texts"): it has no token of its own, so there is nothing to embed, rank or look into. Each answer in its API's
shape, the text named where that shape names a field; a classifier takes its own routes too."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from model import load_model
from tests.helpers import serving, write_tiny_model

W = "  \n\t\u3000 "  # spaces, a newline, a tab and an ideographic space: whitespace to str.isspace
MODEL = "all-MiniLM-L6-v2"
NATIVE = "must not be empty: it holds whitespace alone"
TEI_EMPTY = "`inputs` cannot be empty"

# (path, body, status, what the body says, the param named or None where the API's shape names none)
CASES = [
    ("/encode", {"texts": ["fine", W]}, 422, NATIVE, "texts[1]"),
    ("/encode", {"texts": W}, 422, NATIVE, "texts[0]"),
    ("/encode/sparse", {"texts": [W]}, 422, NATIVE, "texts[0]"),
    ("/encode/late-chunks", {"text": W, "chunks": [[0, 1]]}, 422, NATIVE, "text"),
    ("/encode/multi-vector", {"texts": [W]}, 422, NATIVE, "texts[0]"),
    ("/tokenize", {"texts": ["fine", W]}, 422, NATIVE, "texts[1]"),
    ("/attention", {"text": W}, 422, NATIVE, "text"),
    ("/attention", {"text": "fine", "text_pair": W}, 422, NATIVE, "text_pair"),
    ("/attention/neuron", {"text": W, "layer": 0, "head": 0}, 422, NATIVE, "text"),
    ("/attention/heads", {"texts": [W]}, 422, NATIVE, "texts[0]"),
    ("/similarity", {"source": W, "texts": ["fine"]}, 422, NATIVE, "source"),
    ("/similarity", {"source": "fine", "texts": ["fine", W]}, 422, NATIVE, "texts[1]"),
    ("/rerank", {"query": W, "documents": ["fine"]}, 422, NATIVE, "query"),
    ("/rerank", {"query": "fine", "documents": ["fine", W]}, 422, NATIVE, "documents[1]"),
    ("/classify", {"texts": [W]}, 422, NATIVE, "texts[0]"),
    ("/v1/embeddings", {"model": MODEL, "input": ["fine", W]}, 422, NATIVE, "input[1]"),
    ("/v1/embeddings", {"model": MODEL, "input": W}, 422, NATIVE, "input"),
    ("/v1/rerank", {"model": MODEL, "query": W, "documents": ["fine"]}, 422, NATIVE, "query"),
    ("/v1/rerank", {"model": MODEL, "query": "fine", "documents": [W]}, 422, NATIVE, "documents[0]"),
    ("/v2/embed", {"model": MODEL, "texts": [W], "input_type": "search_query"}, 422, f"texts[0]: {NATIVE}", None),
    ("/v2/rerank", {"model": MODEL, "query": W, "documents": ["fine"]}, 422, f"query: {NATIVE}", None),
    ("/v2/rerank", {"model": MODEL, "query": "fine", "documents": [W]}, 422, f"documents[0]: {NATIVE}", None),
    ("/tei/embed", {"inputs": ["fine", W]}, 400, TEI_EMPTY, None),
    ("/tei/embed", {"inputs": W}, 400, TEI_EMPTY, None),
    ("/tei/embed", {"inputs": [[101, 102], W]}, 400, TEI_EMPTY, None),  # beside token ids
    ("/tei/embed_all", {"inputs": [W]}, 400, TEI_EMPTY, None),
    ("/tei", {"inputs": [W]}, 400, TEI_EMPTY, None),
    ("/tei/rerank", {"query": W, "texts": ["fine"]}, 422, f"query: {NATIVE}", None),
    ("/tei/rerank", {"query": "fine", "texts": [W]}, 422, NATIVE, None),
    ("/tei/similarity", {"inputs": {"source_sentence": W, "sentences": ["fine"]}}, 422, f"source: {NATIVE}", None),
    ("/tei/similarity", {"inputs": {"source_sentence": "fine", "sentences": [W]}}, 422, NATIVE, None),
    ("/tei/tokenize", {"inputs": ["fine", W]}, 400, TEI_EMPTY, None),
]


@pytest.mark.parametrize(("path", "body", "status", "says", "param"), CASES, ids=[case[0] for case in CASES])
async def test_a_whitespace_text_is_refused_as_an_empty_one(
    client: httpx.AsyncClient, path: str, body: dict, status: int, says: str, param: str | None
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    assert says in response.text
    if param is not None:
        assert response.json()["error"]["param"] == param
    assert (await client.post("/encode", json={"texts": ["still serving"]})).status_code == 200


@pytest.mark.parametrize("text", ["a", " a ", "\ta\n"])
async def test_a_text_with_whitespace_around_a_word_is_taken(client: httpx.AsyncClient, text: str) -> None:
    assert (await client.post("/encode", json={"texts": [text]})).status_code == 200


async def test_a_classifier_refuses_whitespace_on_tei_predict_and_classify(tmp_path: Path) -> None:
    directory = write_tiny_model(tmp_path / "classifier", head="sequence-classification")
    model = load_model(directory, device="cpu", dtype="float32", runtime="torch")
    async with serving(Settings(), model) as service:
        for path, body, param in [
            ("/classify", {"texts": ["fine", W]}, "texts[1]"),
            ("/classify", {"texts": ["fine"], "text_pair": [W]}, "text_pair[0]"),
        ]:
            response = await service.client.post(path, json=body)
            assert response.status_code == 422 and response.json()["error"]["param"] == param, response.text
        for inputs in (W, ["fine", W], [["fine", W]]):
            response = await service.client.post("/tei/predict", json={"inputs": inputs})
            assert response.status_code == 422 and NATIVE in response.text, response.text
