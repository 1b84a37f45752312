"""POST /encode against sentence-transformers and transformers, through HTTP."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from model import TextEncoder

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Embeddings over HTTP.", "a"]


async def test_default_encode_equals_sentence_transformers(client: httpx.AsyncClient, sentence_transformer) -> None:
    response = await client.post("/encode", json={"texts": TEXTS})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "all-MiniLM-L6-v2" and body["dim"] == 384
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    assert all(set(item) == {"index", "embedding"} for item in body["data"])  # tokens only when asked for
    ours = np.array([item["embedding"] for item in body["data"]])
    theirs = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


async def test_single_string_is_one_text(client: httpx.AsyncClient) -> None:
    one = (await client.post("/encode", json={"texts": "Embeddings over HTTP."})).json()
    many = (await client.post("/encode", json={"texts": ["Embeddings over HTTP."]})).json()
    assert len(one["data"]) == 1
    assert one["data"][0]["embedding"] == many["data"][0]["embedding"]


async def test_usage_counts_real_tokens(client: httpx.AsyncClient, bundled_model: TextEncoder) -> None:
    body = (await client.post("/encode", json={"texts": TEXTS})).json()
    expected = sum(len(e.ids) for e in bundled_model.card.tokenizer.encode(TEXTS))
    assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected}


async def test_order_is_kept_when_lengths_differ(client: httpx.AsyncClient) -> None:
    texts = ["short", "a far longer text than the others, with many more tokens in it", "mid length text"]
    together = (await client.post("/encode", json={"texts": texts})).json()["data"]
    for index, text in enumerate(texts):
        alone = (await client.post("/encode", json={"texts": text})).json()["data"][0]
        np.testing.assert_allclose(together[index]["embedding"], alone["embedding"], atol=1e-6)


async def test_tokens_equal_the_tokenizer(client: httpx.AsyncClient, hf_tokenizer) -> None:
    body = (await client.post("/encode", json={"texts": TEXTS, "return_tokens": True})).json()
    for text, item in zip(TEXTS, body["data"], strict=True):
        reference = hf_tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert [t["id"] for t in item["tokens"]] == reference["input_ids"]
        assert [t["text"] for t in item["tokens"]] == hf_tokenizer.convert_ids_to_tokens(reference["input_ids"])
        assert [[t["start"], t["end"]] for t in item["tokens"]] == [list(o) for o in reference["offset_mapping"]]
        assert [int(t["special"]) for t in item["tokens"]] == reference["special_tokens_mask"]
        assert set(item["tokens"][0]) == {"id", "text", "start", "end", "special"}


@pytest.mark.parametrize("layer", [-1, 0, 3, -3])
@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
async def test_each_pooling_and_layer_equals_transformers_hidden_states(
    client: httpx.AsyncClient, hf_bert, hf_tokenizer, pooling: str, layer: int
) -> None:
    texts = ["pooling a sentence", "and another, somewhat longer sentence to pool"]
    request = {"texts": texts, "pooling": pooling, "layer": layer, "normalize": False, "return_token_embeddings": True}
    body = (await client.post("/encode", json=request)).json()
    for text, item in zip(texts, body["data"], strict=True):
        with torch.inference_mode():
            hidden = hf_bert(**hf_tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][
                0
            ]
        expected = {"mean": hidden.mean(0), "cls": hidden[0], "max": hidden.max(0).values}[pooling]
        np.testing.assert_allclose(item["embedding"], expected.numpy(), atol=2e-5)
        np.testing.assert_allclose(item["token_embeddings"], hidden.numpy(), atol=2e-5)  # no padding rows


async def test_normalize_false_gives_the_unnormalised_mean(client: httpx.AsyncClient) -> None:
    raw = np.array(
        (await client.post("/encode", json={"texts": TEXTS[0], "normalize": False})).json()["data"][0]["embedding"]
    )
    unit = np.array((await client.post("/encode", json={"texts": TEXTS[0]})).json()["data"][0]["embedding"])
    assert abs(np.linalg.norm(unit) - 1) < 1e-5 and abs(np.linalg.norm(raw) - 1) > 1e-2
    np.testing.assert_allclose(raw / np.linalg.norm(raw), unit, atol=1e-6)


async def test_base64_decodes_to_the_float_vectors(client: httpx.AsyncClient) -> None:
    request = {"texts": TEXTS[:2], "return_token_embeddings": True}
    floats = (await client.post("/encode", json=request)).json()["data"]
    encoded = (await client.post("/encode", json={**request, "encoding_format": "base64"})).json()["data"]
    for f, e in zip(floats, encoded, strict=True):
        vector = np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4")
        assert vector.shape == (384,)
        np.testing.assert_array_equal(vector, np.array(f["embedding"], dtype=np.float32))
        tokens = np.stack([np.frombuffer(base64.b64decode(v), dtype="<f4") for v in e["token_embeddings"]])
        np.testing.assert_array_equal(tokens, np.array(f["token_embeddings"], dtype=np.float32))


async def test_long_text_is_truncated_to_the_model_maximum(client: httpx.AsyncClient, sentence_transformer) -> None:
    text = "lengthy " * 500
    body = (await client.post("/encode", json={"texts": text, "return_tokens": True})).json()
    assert len(body["data"][0]["tokens"]) == 256 and body["usage"]["prompt_tokens"] == 256
    expected = sentence_transformer.encode([text], normalize_embeddings=True)[0]
    np.testing.assert_allclose(body["data"][0]["embedding"], expected, atol=1e-5)


async def test_a_full_batch_of_texts_is_served(client: httpx.AsyncClient) -> None:
    texts = [f"text number {i} " + "word " * (i % 37) for i in range(256)]
    body = (await client.post("/encode", json={"texts": texts})).json()
    assert len(body["data"]) == 256 and [d["index"] for d in body["data"]] == list(range(256))
