"""sentence-transformers' named prompts (e5's "query: " / "passage: ") on /encode and /v1/embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import write_family_model
from tests.helpers import assert_error, serving

TEXTS = ["Where does the cat sit?", "The quick brown fox."]
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def prompted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_family_model(tmp_path_factory.mktemp("e5-like"), "xlm-roberta")
    config = {"prompts": PROMPTS, "default_prompt_name": "passage"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    return directory


def cosines(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    return (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))


async def test_prompts_equal_sentence_transformers(prompted_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(prompted_dir), device="cpu")
    model = load_model(prompted_dir, device="cpu", dtype="float32")
    assert model.card.prompts == PROMPTS and model.card.default_prompt_name == "passage"
    async with serving(Settings(), model) as service:
        client = service.client
        for prompt_name in ("query", None):  # None: the model's default prompt, as sentence-transformers uses it
            expected = reference.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)
            encode = (await client.post("/encode", json={"texts": TEXTS, "prompt_name": prompt_name})).json()
            v1 = (await client.post("/v1/embeddings", json={"input": TEXTS, "prompt_name": prompt_name})).json()
            for body in (encode, v1):
                got = np.array([item["embedding"] for item in body["data"]])
                assert cosines(got, expected).min() >= 0.99999
                np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)  # element by element too
        # the prompt's tokens are counted, and a prompt changes the embedding
        plain = (await client.post("/encode", json={"texts": TEXTS, "prompt_name": "query"})).json()
        other = (await client.post("/encode", json={"texts": TEXTS, "prompt_name": "passage"})).json()
        assert cosines(np.array([plain["data"][0]["embedding"]]), np.array([other["data"][0]["embedding"]]))[0] < 0.9999
        error = assert_error(
            await client.post("/encode", json={"texts": "x", "prompt_name": "instruction"}),
            422,
            "validation_error",
            "prompt_name",
            "has no prompt 'instruction' (its prompts: query, passage)",
        )
        assert error


async def test_a_model_without_prompts_refuses_a_prompt_name(tiny_model: TextEncoder) -> None:
    async with serving(Settings(), tiny_model) as service:
        response = await service.client.post("/v1/embeddings", json={"input": "x", "prompt_name": "query"})
        assert_error(response, 422, "validation_error", "prompt_name", "(its prompts: none)")


async def test_rerank_by_cosine_encodes_as_encode_query_and_encode_document(prompted_dir: Path) -> None:
    """An embedding model reranks by the cosine of the query's and the documents' embeddings, prompted as
    encode_query and encode_document document it: the query with the "query" prompt, the documents with the first
    of "document", "passage", "corpus" (sentence-transformers 6.2's encode_document itself left the prompt out on
    this model, whose default prompt is "passage")."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(prompted_dir), device="cpu")
    query, documents = TEXTS[0], [TEXTS[1], "A cat sits on the mat.", "Nothing at all."]
    queries = reference.encode([query], prompt_name="query")
    theirs = reference.similarity(queries, reference.encode(documents, prompt_name="passage"))[0].numpy()
    model = load_model(prompted_dir, device="cpu", dtype="float32")
    async with serving(Settings(), model) as service:
        response = await service.client.post("/rerank", json={"query": query, "documents": documents})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["method"] == "cosine"
        assert [r["index"] for r in body["results"]] == np.argsort(-theirs, kind="stable").tolist()
        for result in body["results"]:
            assert result["relevance_score"] == pytest.approx(float(theirs[result["index"]]), abs=1e-5)
        assert (await service.client.get("/info")).json()["rerank"] == "cosine"
