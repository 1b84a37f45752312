"""Cohere's /v2/embed and /v2/rerank through the `cohere` client, and Jina's /v1/rerank, against the native
/encode and /rerank answers; their errors in Cohere's shape."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from model import default_model_path
from tests.helpers import running_server, write_tiny_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("ce") / "ce", head="sequence-classification", num_labels=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, ce_dir: Path) -> Iterator[str]:
    """MiniLM with e5's query and passage prompts (named "e5"), and a tiny cross-encoder ("ce")."""
    root = tmp_path_factory.mktemp("cohere")
    e5 = root / "e5"
    e5.mkdir()
    for file in default_model_path().iterdir():
        if file.name != "config_sentence_transformers.json":
            (e5 / file.name).symlink_to(file)
    prompts = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}
    (e5 / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    with running_server({"ENCODER_MODELS": f"e5={e5},ce={ce_dir}"}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    import cohere

    return cohere.ClientV2(api_key="unused", base_url=server)


def native(server: str, path: str, body: dict) -> dict:
    response = httpx.post(f"{server}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(("input_type", "prompt"), [("search_query", "query"), ("search_document", "passage")])
def test_embed_takes_the_input_types_prompt_and_equals_encode(
    server: str, client: Any, input_type: str, prompt: str
) -> None:
    expected = [
        item["embedding"]
        for item in native(server, "/encode", {"texts": TEXTS, "prompt_name": prompt, "model": "e5"})["data"]
    ]
    answer = client.embed(
        model="e5", input_type=input_type, texts=TEXTS, embedding_types=["float", "base64", "ubinary"]
    )
    np.testing.assert_allclose(answer.embeddings.float_, expected, atol=1e-6)
    decoded = [np.frombuffer(base64.b64decode(text), dtype=np.float32) for text in answer.embeddings.base64]
    np.testing.assert_allclose(decoded, expected, atol=1e-6)
    packed = np.asarray(quantize_embeddings(np.array(expected, dtype=np.float32), precision="ubinary"))
    np.testing.assert_array_equal(answer.embeddings.ubinary, packed)
    assert answer.texts == TEXTS and answer.meta.billed_units.input_tokens > 0
    plain = [item["embedding"] for item in native(server, "/encode", {"texts": TEXTS, "model": "e5"})["data"]]
    clustered = client.embed(model="e5", input_type="clustering", texts=TEXTS)  # a prompt the model lacks: none
    np.testing.assert_allclose(clustered.embeddings.float_, plain, atol=1e-6)


def test_embed_output_dimension_and_binary_equal_encode(server: str, client: Any) -> None:
    body = {"texts": TEXTS, "model": "e5", "dimensions": 64, "prompt_name": "query"}
    expected = np.array([item["embedding"] for item in native(server, "/encode", body)["data"]], dtype=np.float32)
    answer = client.embed(
        model="e5", input_type="search_query", texts=TEXTS, embedding_types=["binary"], output_dimension=64
    )
    np.testing.assert_array_equal(answer.embeddings.binary, quantize_embeddings(expected, precision="binary"))


def test_rerank_equals_the_native_rerank(server: str, client: Any, ce_dir: Path) -> None:
    from tokenizers import Tokenizer

    query = "a fox jumps"
    ranked = native(server, "/rerank", {"query": query, "documents": TEXTS, "model": "ce"})["results"]
    answer = client.rerank(model="ce", query=query, documents=TEXTS, top_n=2)
    assert [r.index for r in answer.results] == [r["index"] for r in ranked[:2]]
    assert [r.relevance_score for r in answer.results] == pytest.approx([r["relevance_score"] for r in ranked[:2]])
    # max_tokens_per_doc: each document cut after that many tokens, as if sent cut
    short = client.rerank(model="ce", query=query, documents=TEXTS, max_tokens_per_doc=3)
    tokenizer = Tokenizer.from_file(str(ce_dir / "tokenizer.json"))
    offsets = [tokenizer.encode(text, add_special_tokens=False).offsets for text in TEXTS]
    documents = [text[: ends[2][1]] if len(ends) > 3 else text for text, ends in zip(TEXTS, offsets, strict=True)]
    assert documents[0] != TEXTS[0]
    cut = native(server, "/rerank", {"query": query, "documents": documents, "model": "ce"})
    assert [(r.index, r.relevance_score) for r in short.results] == [
        (r["index"], pytest.approx(r["relevance_score"])) for r in cut["results"]
    ]


def test_jina_rerank_equals_the_native_rerank(server: str) -> None:
    ranked = native(server, "/rerank", {"query": "a fox", "documents": TEXTS, "model": "ce"})
    answer = native(server, "/v1/rerank", {"model": "ce", "query": "a fox", "documents": TEXTS, "top_n": 2})
    assert answer["model"] == "ce" and answer["usage"]["total_tokens"] == ranked["usage"]["total_tokens"]
    assert answer["results"] == [
        {
            "index": r["index"],
            "relevance_score": pytest.approx(r["relevance_score"]),
            "document": {"text": TEXTS[r["index"]]},
        }
        for r in ranked["results"][:2]
    ]
    wrong_types = (
        ({"top_n": "2"}, "top_n"),
        ({"top_n": True}, "top_n"),
        ({"return_documents": "no"}, "return_documents"),
    )
    for body, param in (
        ({"top_n": 0}, "top_n"),
        ({"documents": []}, "documents"),
        ({"query": 3}, "query"),
        *wrong_types,
    ):
        refused = httpx.post(f"{server}/v1/rerank", json={"model": "ce", "query": "q", "documents": TEXTS, **body})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == param, refused.text


def test_errors_take_cohere_shape_and_name_the_problem(server: str, client: Any) -> None:
    import cohere

    with pytest.raises(cohere.NotFoundError) as missing:
        client.embed(model="embed-v4.0", input_type="search_query", texts=["x"])
    assert missing.value.body == {"message": "model: no model named 'embed-v4.0' is served (served: e5, ce)"}
    for options, words in (
        ({"embedding_types": ["int8"]}, "int8 not served"),
        ({"truncate": "START"}, "START is not served"),
        ({"truncate": "NONE", "texts": ["word " * 400]}, "more than the maximum"),
    ):
        with pytest.raises(cohere.UnprocessableEntityError) as refused:
            client.embed(model="e5", input_type="search_query", **{"texts": ["x"], **options})
        assert words in refused.value.body["message"]
    for body, says in (  # a value of the wrong type is refused, not converted
        ({"output_dimension": "8"}, "output_dimension: input should be a valid integer"),
        ({"texts": ["x", 5]}, "texts[1]: input should be a valid string"),
    ):
        wrong = httpx.post(
            f"{server}/v2/embed", json={"model": "e5", "input_type": "search_query", "texts": ["x"], **body}
        )
        assert (wrong.status_code, wrong.json()) == (422, {"message": says}), wrong.text
    reranked = httpx.post(f"{server}/v2/rerank", json={"model": "ce", "query": "q", "documents": ["a"], "top_n": 1.0})
    assert (reranked.status_code, reranked.json()) == (422, {"message": "top_n: input should be a valid integer"})
    bare = httpx.post(f"{server}/v2/embed", json={"model": "e5", "texts": ["x"]})  # no input_type
    assert bare.status_code == 422 and set(bare.json()) == {"message"} and "input_type" in bare.json()["message"]
    assert client.embed(model="e5", input_type="search_query", texts=["still serving"]).embeddings.float_
