"""Text-embeddings-inference's API under /tei and /models/{name}/tei: huggingface_hub's InferenceClient against the
service, TEI's shapes checked against the native endpoints' answers, TEI's error bodies and statuses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from model import default_model_path
from tests.helpers import running_server, write_tiny_model
from tests.retrieval import write_splade

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bundled MiniLM (the default), a tiny cross-encoder, a tiny 3-label classifier and a tiny SPLADE model."""
    root = tmp_path_factory.mktemp("tei")
    models = {
        "minilm": default_model_path(),
        "ce": write_tiny_model(root / "ce", head="sequence-classification", num_labels=1),
        "clf": write_tiny_model(root / "clf", seed=3, head="sequence-classification", num_labels=3),
        "splade": write_splade(root / "splade", "bert", "max", seed=2),
    }
    with running_server({"ENCODER_MODELS": ",".join(f"{n}={d}" for n, d in models.items())}) as url:
        yield url


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> object:
    """huggingface_hub with its offline switch off in this (the client's) process only: it refuses every request,
    localhost included, while HF_HUB_OFFLINE is set."""
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return huggingface_hub


def native(server: str, path: str, body: dict) -> dict:
    response = httpx.post(f"{server}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def tei_error(response: httpx.Response, status: int, error_type: str, contains: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    assert contains in body["error"], body


def test_inference_client_feature_extraction_equals_encode(server: str, hub: object) -> None:
    from huggingface_hub import InferenceClient

    expected = [item["embedding"] for item in native(server, "/encode", {"texts": TEXTS})["data"]]
    client = InferenceClient(model=f"{server}/tei")
    for text, want in zip(TEXTS, expected, strict=True):
        np.testing.assert_allclose(client.feature_extraction(text)[0], want, atol=1e-6)
    named = InferenceClient(model=f"{server}/models/minilm/tei")
    np.testing.assert_allclose(named.feature_extraction(TEXTS[0])[0], expected[0], atol=1e-6)


def test_inference_client_sentence_similarity_equals_similarity(server: str, hub: object) -> None:
    from huggingface_hub import InferenceClient

    expected = [
        item["score"] for item in native(server, "/similarity", {"source": TEXTS[0], "texts": TEXTS[1:]})["data"]
    ]
    for url in (f"{server}/tei/similarity", f"{server}/tei"):
        scores = InferenceClient(model=url).sentence_similarity(TEXTS[0], TEXTS[1:])
        assert scores == pytest.approx(expected, abs=1e-6)


def test_inference_client_text_classification_equals_classify(server: str, hub: object) -> None:
    from huggingface_hub import InferenceClient

    expected = native(server, "/classify", {"texts": [TEXTS[0]], "model": "clf"})["data"][0]["labels"]
    # the client keeps the first element of /predict's answer: for one text, its best label
    top: Any = InferenceClient(model=f"{server}/models/clf/tei").text_classification(TEXTS[0])
    assert (top.label, top.score) == (expected[0]["label"], pytest.approx(expected[0]["score"], abs=1e-6))


def test_embed_shapes_and_options_equal_the_native_answers(server: str) -> None:
    single = httpx.post(f"{server}/tei/embed", json={"inputs": TEXTS[0]}).json()
    assert len(single) == 1 and len(single[0]) == 384  # always a batch
    raw = native(server, "/encode", {"texts": TEXTS, "normalize": False, "dimensions": 16})["data"]
    answer = httpx.post(f"{server}/tei/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 16}).json()
    np.testing.assert_allclose(answer, [item["embedding"] for item in raw], atol=1e-6)
    tokens = native(server, "/encode", {"texts": [TEXTS[1]], "return_token_embeddings": True, "normalize": False})
    every = httpx.post(f"{server}/tei/embed_all", json={"inputs": TEXTS[1], "extra": "ignored"}).json()
    np.testing.assert_allclose(every[0], tokens["data"][0]["token_embeddings"], atol=1e-6)
    ids = httpx.post(f"{server}/tei/embed", json={"inputs": [101, 7592, 102]}).json()  # token ids, as given
    by_ids = native(server, "/v1/embeddings", {"input": [101, 7592, 102]})["data"][0]["embedding"]
    np.testing.assert_allclose(ids[0], by_ids, atol=1e-6)


def test_embed_takes_texts_and_token_ids_mixed_in_one_batch_as_tei_does(server: str) -> None:
    """TEI's ``inputs`` is a batch of InputType, each a text or token ids: each item as it would be alone."""
    ids = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
    answer = httpx.post(f"{server}/tei/embed", json={"inputs": [TEXTS[0], ids, TEXTS[1], [101, 102]]})
    assert answer.status_code == 200, answer.text
    texts = httpx.post(f"{server}/tei/embed", json={"inputs": [TEXTS[0], TEXTS[1]]}).json()
    by_ids = native(server, "/v1/embeddings", {"input": [ids, [101, 102]]})["data"]
    vectors = answer.json()
    np.testing.assert_allclose([vectors[0], vectors[2]], texts, atol=1e-6)
    np.testing.assert_allclose([vectors[1], vectors[3]], [item["embedding"] for item in by_ids], atol=1e-6)
    assert not np.allclose(vectors[0], vectors[1])
    unnormalised = httpx.post(f"{server}/tei/embed", json={"inputs": [TEXTS[0], ids], "normalize": False})
    tei_error(unnormalised, 422, "Validation", "normalised")
    outside = httpx.post(f"{server}/tei/embed", json={"inputs": [TEXTS[0], [101, 10**6]]})  # named by its place
    tei_error(outside, 422, "Validation", "inputs[1][1]: token id 1000000 is outside the vocabulary")


def test_sparse_predict_and_rerank_equal_the_native_answers(server: str) -> None:
    sparse = native(server, "/encode/sparse", {"texts": TEXTS[:2], "model": "splade"})["data"]
    for path in ("/models/splade/tei/embed_sparse", "/models/splade/tei"):  # POST / on SPLADE: embed_sparse
        answer = httpx.post(f"{server}{path}", json={"inputs": TEXTS[:2]}).json()
        for got, want in zip(answer, sparse, strict=True):
            assert [entry["index"] for entry in got] == want["indices"]
            assert [entry["value"] for entry in got] == pytest.approx(want["values"], abs=1e-6)
    labels = native(server, "/classify", {"texts": [TEXTS[0], TEXTS[1]], "text_pair": [None, TEXTS[2]], "model": "clf"})
    batch = httpx.post(f"{server}/models/clf/tei/predict", json={"inputs": [[TEXTS[0]], [TEXTS[1], TEXTS[2]]]}).json()
    for got, want in zip(batch, labels["data"], strict=True):
        assert [(g["label"], g["score"]) for g in got] == [
            (w["label"], pytest.approx(w["score"], abs=1e-6)) for w in want["labels"]
        ]
    one = httpx.post(
        f"{server}/models/clf/tei", json={"inputs": TEXTS[0], "raw_scores": True}
    ).json()  # POST /: predict
    logits = native(server, "/classify", {"texts": [TEXTS[0]], "model": "clf", "raw_scores": True})["data"][0]["labels"]
    assert [(g["label"], g["score"]) for g in one] == [
        (w["label"], pytest.approx(w["score"], abs=1e-6)) for w in logits
    ]
    ranked = native(server, "/rerank", {"query": "a fox", "documents": TEXTS, "model": "ce"})["results"]
    for path in ("/models/ce/tei/rerank", "/models/ce/tei"):  # POST / on a reranker: rerank
        answer = httpx.post(f"{server}{path}", json={"query": "a fox", "texts": TEXTS, "return_text": True}).json()
        assert [(r["index"], r["text"]) for r in answer] == [(r["index"], TEXTS[r["index"]]) for r in ranked]
        assert [r["score"] for r in answer] == pytest.approx([r["relevance_score"] for r in ranked], abs=1e-6)
        assert list(answer[0]) == ["index", "text", "score"]


def test_tokenize_counts_bytes_and_decode_and_info_describe_the_model(server: str) -> None:
    tokens = httpx.post(f"{server}/tei/tokenize", json={"inputs": "héllo world"}).json()
    assert tokens[0][0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[0][1] == {"id": tokens[0][1]["id"], "text": "héllo", "special": False, "start": 0, "stop": 6}
    assert tokens[0][2]["start"] == 7 and tokens[0][2]["text"] == "world"  # é is two bytes
    bare = httpx.post(f"{server}/tei/tokenize", json={"inputs": ["a", "b"], "add_special_tokens": False}).json()
    assert [[t["text"] for t in row] for row in bare] == [["a"], ["b"]]
    assert httpx.post(f"{server}/tei/decode", json={"ids": [[101, 7592, 102], [2088]]}).json() == ["hello", "world"]
    outside = httpx.post(f"{server}/tei/decode", json={"ids": [[101], [2088, 10**6]]})  # named by its row and place
    tei_error(outside, 422, "Validation", "ids[1][1]: token id 1000000 is outside the vocabulary")
    outside = httpx.post(f"{server}/tei/decode", json={"ids": [101, 10**6]})  # one row given bare
    tei_error(outside, 422, "Validation", "ids[1]: token id 1000000 is outside the vocabulary")
    info = httpx.get(f"{server}/tei/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_input_length"] == 256
    reranker = httpx.get(f"{server}/models/ce/tei/info").json()["model_type"]
    assert reranker == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert "classifier" in httpx.get(f"{server}/models/clf/tei/info").json()["model_type"]
    assert httpx.get(f"{server}/models/splade/tei/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    health = httpx.get(f"{server}/tei/health")
    assert health.status_code == 200 and health.content == b""


def test_errors_take_teis_body_and_statuses(server: str) -> None:
    tei_error(httpx.post(f"{server}/tei/embed", json={"inputs": []}), 400, "Empty", "`inputs` cannot be empty")
    for inputs in ([[101, 102], []], ["a text", []]):  # a row of token ids with none in it, among ids or texts
        empty_row = httpx.post(f"{server}/tei/embed", json={"inputs": inputs})
        tei_error(empty_row, 400, "Empty", "Input validation error: `inputs` cannot be empty")
    for ids in ([], [[2088], []]):
        empty_ids = httpx.post(f"{server}/tei/decode", json={"ids": ids})
        tei_error(empty_ids, 400, "Empty", "Input validation error: `input_ids` cannot be empty")
    tei_error(httpx.post(f"{server}/tei/rerank", json={"query": "q", "texts": []}), 400, "Empty")
    long = {"inputs": ["fine", "word " * 400], "truncate": False}
    tei_error(httpx.post(f"{server}/tei/embed", json=long), 422, "Validation", "more than the maximum")
    tei_error(httpx.post(f"{server}/tei/embed", json={"inputs": ["x"] * 300}), 422, "Validation", "at most 256")
    # a model not of the kind the route needs: TEI's 424, in the words of its TextEmbeddingsError::Backend
    for path, body, says in (
        ("/models/ce/tei/embed", {"inputs": "x"}, "Model is not an embedding model"),
        ("/tei/predict", {"inputs": "x"}, "Model is not a classifier model"),
        ("/tei/embed_sparse", {"inputs": "x"}, "Model is not an embedding model with SPLADE pooling"),
        ("/models/splade/tei/embed", {"inputs": "x"}, "`normalize` is not available for SPLADE models"),
        ("/models/clf/tei/rerank", {"query": "q", "texts": ["a"]}, "model is not a re-ranker model"),  # 3 labels
    ):
        refused = httpx.post(f"{server}{path}", json=body)
        tei_error(refused, 424, "Backend")
        assert refused.json()["error"] == f"Backend error: {says}", path
    tei_error(httpx.post(f"{server}/tei/embed", json={"inputs": 5}), 422, "Validation")
    left = {"inputs": "x", "truncation_direction": "Up"}
    tei_error(httpx.post(f"{server}/tei/embed", json=left), 422, "Validation", "truncation_direction")
    prompt = {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "query"}}
    tei_error(httpx.post(f"{server}/tei/similarity", json=prompt), 422, "Validation", "has no prompt 'query'")
    malformed = httpx.post(f"{server}/tei/embed", content=b"{bad", headers={"content-type": "application/json"})
    tei_error(malformed, 422, "Validation", "malformed JSON")
    tei_error(httpx.post(f"{server}/models/nobody/tei/embed", json={"inputs": "x"}), 404, "Validation", "nobody")
    assert httpx.post(f"{server}/tei/embed", json={"inputs": "still serving"}).status_code == 200


def test_values_of_the_wrong_type_are_refused_as_teis_own_parser_refuses_them(server: str) -> None:
    """TEI reads its bodies with serde: unknown fields ignored, but a bool is no token id, 0 no boolean, "3" no
    number. Of a union's failures the one named is where the value went wrong (``inputs[0][0]``), not the first
    member tried (``inputs`` as a string)."""
    for path, body, says in (
        ("/tei/embed", {"inputs": [[False]]}, "inputs[0][0]: input should be a valid integer"),
        ("/tei/embed", {"inputs": [101, 2.0]}, "inputs[1]: input should be a valid integer"),
        ("/tei/embed", {"inputs": ["a", [101, "x"]]}, "inputs[1][1]: input should be a valid integer"),
        ("/tei/embed", {"inputs": "a", "normalize": 1}, "normalize: input should be a valid boolean"),
        ("/tei/embed", {"inputs": "a", "dimensions": "8"}, "dimensions: input should be a valid integer"),
        ("/tei/decode", {"ids": [[True]]}, "ids[0][0]: input should be a valid integer"),
        ("/tei/decode", {"ids": [101, 102], "skip_special_tokens": 0}, "skip_special_tokens: input should be"),
        ("/tei/rerank", {"query": "q", "texts": ["a"], "raw_scores": "no"}, "raw_scores: input should be"),
        ("/models/clf/tei/predict", {"inputs": [1]}, "inputs[0]: input should be a valid string"),
        ("/tei", {}, "inputs: field required"),  # POST /, dispatched by the model's kind, worded alike
        ("/tei", {"inputs": [[True]]}, "inputs[0][0]: input should be a valid integer"),
    ):
        response = httpx.post(f"{server}{path}", json=body)
        tei_error(response, 422, "Validation")
        assert response.json()["error"] == says or response.json()["error"].startswith(says), (path, response.text)
    ignored = httpx.post(f"{server}/tei/embed", json={"inputs": "a", "unknown": [True]})
    assert ignored.status_code == 200 and len(ignored.json()[0]) == 384


async def test_a_bad_text_through_tei_embed_fails_alone_among_concurrent_ones(server: str) -> None:
    good = [f"good request number {i}" for i in range(12)]
    expected = httpx.post(f"{server}/tei/embed", json={"inputs": good}).json()
    bad_body = json.dumps({"inputs": ["fine", "broken \ud800 text"]})
    async with httpx.AsyncClient(base_url=server, timeout=60) as client:
        requests = [client.post("/tei/embed", json={"inputs": text}) for text in good]
        requests.insert(6, client.post("/tei/embed", content=bad_body, headers={"content-type": "application/json"}))
        responses = await asyncio.gather(*requests)
    failed = responses.pop(6)
    tei_error(failed, 422, "Validation", "lone surrogate")
    for response, want in zip(responses, expected, strict=True):
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()[0], want, atol=1e-5)


def test_the_openapi_document_lists_the_tei_routes_under_their_tag(server: str) -> None:
    schema = httpx.get(f"{server}/openapi.json").json()
    tagged = {
        path
        for path, item in schema["paths"].items()
        for op in item.values()
        if "text-embeddings-inference" in op.get("tags", [])
    }
    for path in (
        "/tei",
        "/tei/embed",
        "/tei/rerank",
        "/tei/tokenize",
        "/tei/info",
        "/tei/health",
        "/models/{model_name}/tei/embed",
    ):
        assert path in tagged, sorted(tagged)


@pytest.mark.parametrize("direction", ["Left", "left"])
def test_left_truncation_keeps_the_end_as_tokenizers_cuts_it(server: str, direction: str) -> None:
    """truncation_direction Left: the text's last tokens kept, the special tokens around them, as the tokenizers
    library truncates on the left; the same ids sent to /v1/embeddings give the same vector."""
    from tokenizers import Tokenizer

    text = " ".join(f"word{i}" for i in range(400))
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256, direction="left")
    ids = tokenizer.encode(text).ids
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102
    expected = native(server, "/v1/embeddings", {"input": ids})["data"][0]["embedding"]
    body = {"inputs": text, "truncation_direction": direction}
    np.testing.assert_allclose(httpx.post(f"{server}/tei/embed", json=body).json()[0], expected, atol=1e-6)
    right = native(server, "/encode", {"texts": [text]})["data"][0]["embedding"]
    assert not np.allclose(right, expected, atol=1e-3)  # the end, not the start
    pair = {"query": "a fox", "texts": [text], "truncation_direction": direction, "raw_scores": True}
    assert httpx.post(f"{server}/models/ce/tei/rerank", json=pair).status_code == 200


async def test_each_request_keeps_its_reading_when_tokenised_in_one_turn(server: str) -> None:
    """Left-truncated TEI requests, decoded token ids and native requests tokenised in the same loop turns: each
    reads its own texts as its own route says, none as a neighbour's."""
    text = " ".join(f"word{i}" for i in range(400))
    left = {"inputs": text, "truncation_direction": "Left"}
    ids = {"inputs": [[101, 7592, 2088, 102]]}
    alone = (
        httpx.post(f"{server}/tei/embed", json=left).json()[0],
        native(server, "/encode", {"texts": [text]})["data"][0]["embedding"],
        httpx.post(f"{server}/tei/embed_all", json=ids).json()[0],
    )
    async with httpx.AsyncClient(base_url=server, timeout=60) as client:
        sent = []
        for _ in range(4):
            sent += [
                client.post("/tei/embed", json=left),
                client.post("/encode", json={"texts": [text]}),
                client.post("/tei/embed_all", json=ids),
            ]
        answers = await asyncio.gather(*sent)
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
    for at in range(0, len(answers), 3):
        np.testing.assert_allclose(answers[at].json()[0], alone[0], atol=1e-5)  # batched otherwise: not bit for bit
        np.testing.assert_allclose(answers[at + 1].json()["data"][0]["embedding"], alone[1], atol=1e-5)
        np.testing.assert_allclose(answers[at + 2].json()[0], alone[2], atol=1e-5)
    assert not np.allclose(alone[0], alone[1], atol=1e-3)  # the two readings differ: the check can fail


def test_token_ids_are_decoded_and_read_again_as_tei_does(server: str) -> None:
    ids = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
    every = httpx.post(f"{server}/tei/embed_all", json={"inputs": [ids]}).json()
    tokens = native(server, "/encode", {"texts": ["hello world"], "return_token_embeddings": True, "normalize": False})
    np.testing.assert_allclose(every[0], tokens["data"][0]["token_embeddings"], atol=1e-6)
    mixed = httpx.post(f"{server}/tei/embed_all", json={"inputs": ["text", [101, 102]]})
    tei_error(mixed, 422, "Validation", "not both")
    tokens = native(server, "/tokenize", {"texts": [TEXTS[1]], "model": "splade"})["data"][0]["tokens"]
    sparse = native(server, "/encode/sparse", {"texts": [TEXTS[1]], "model": "splade"})["data"][0]
    splade_ids = [token["id"] for token in tokens]
    by_ids = httpx.post(f"{server}/models/splade/tei/embed_sparse", json={"inputs": splade_ids}).json()[0]
    assert [entry["index"] for entry in by_ids] == sparse["indices"]
    unknown = {"inputs": "x", "prompt_name": "nope"}
    tei_error(httpx.post(f"{server}/models/splade/tei/embed_sparse", json=unknown), 422, "Validation", "no prompt")
    tei_error(httpx.post(f"{server}/tei/tokenize", json=unknown), 422, "Validation", "no prompt 'nope'")
    on_ids = {"inputs": splade_ids, "prompt_name": "query"}
    tei_error(httpx.post(f"{server}/models/splade/tei/embed_sparse", json=on_ids), 422, "Validation", "not token ids")
