"""Long inputs: chunking on /encode and /v1/embeddings, against windows built from transformers' tokenizer and
pooled with transformers' BERT."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, serve

LONG = " ".join(f"word{i % 97} of a long document, sentence {i}." for i in range(160))  # about 1,600 tokens
WINDOW = 256  # all-MiniLM-L6-v2's max_seq_length, special tokens included


def reference(hf_bert, hf_tokenizer, text: str, overlap: int) -> tuple[np.ndarray, int]:
    """The chunked embedding by hand: [CLS] + content window + [SEP], each mean-pooled by transformers, their mean
    weighted by their tokens, L2-normalised; and the windows' tokens."""
    ids = hf_tokenizer(text)["input_ids"]
    cls, content, sep = ids[:1], ids[1:-1], ids[-1:]
    room = WINDOW - 2
    windows, start = [], 0
    while True:
        windows.append(cls + content[start : start + room] + sep)
        if start + room >= len(content):
            break
        start += room - overlap
    with torch.no_grad():
        pooled = [hf_bert(torch.tensor([w])).last_hidden_state[0].mean(0).numpy() for w in windows]
    weights = np.array([len(w) for w in windows], dtype=np.float32)
    mean = (weights[:, None] * np.stack(pooled)).sum(0) / weights.sum()
    return mean / np.linalg.norm(mean), int(weights.sum())


@pytest.mark.parametrize("overlap", [0, 50, 127])
async def test_a_long_text_is_the_weighted_mean_of_its_windows(
    client: httpx.AsyncClient, hf_bert, hf_tokenizer, overlap: int
) -> None:
    expected, n_tokens = reference(hf_bert, hf_tokenizer, LONG, overlap)
    assert n_tokens > 3 * WINDOW  # several windows
    response = await client.post("/encode", json={"texts": [LONG, "short"], "chunking": {"overlap": overlap}})
    assert response.status_code == 200, response.text
    body = response.json()
    np.testing.assert_allclose(body["data"][0]["embedding"], expected, atol=2e-5)
    short = (await client.post("/encode", json={"texts": "short"})).json()
    np.testing.assert_allclose(body["data"][1]["embedding"], short["data"][0]["embedding"], atol=1e-6)
    assert body["usage"]["prompt_tokens"] == n_tokens + short["usage"]["prompt_tokens"]
    openai = (await client.post("/v1/embeddings", json={"input": LONG, "chunking": {"overlap": overlap}})).json()
    np.testing.assert_allclose(openai["data"][0]["embedding"], expected, atol=2e-5)
    assert openai["usage"]["prompt_tokens"] == n_tokens


async def test_without_chunking_a_long_text_is_still_truncated(
    client: httpx.AsyncClient, hf_bert, hf_tokenizer
) -> None:
    truncated = (await client.post("/encode", json={"texts": LONG})).json()
    assert truncated["usage"]["prompt_tokens"] == WINDOW
    chunked = (await client.post("/encode", json={"texts": LONG, "chunking": {}})).json()
    assert not np.allclose(truncated["data"][0]["embedding"], chunked["data"][0]["embedding"], atol=1e-3)


async def test_bad_chunking_gets_its_422(client: httpx.AsyncClient, bundled_model: TextEncoder) -> None:
    for body, param, words in (
        ({"texts": LONG, "chunking": {"overlap": 128}}, "chunking.overlap", "at most half"),
        ({"texts": LONG, "chunking": {"overlap": -1}}, "chunking.overlap", ""),
        ({"texts": LONG, "chunking": {"size": 3}}, "chunking.size", ""),
        ({"texts": LONG, "chunking": {}, "return_token_embeddings": True}, "chunking", "return_token_embeddings"),
        ({"texts": LONG, "chunking": {}, "prompt": "query: "}, "chunking", "prompt"),
    ):
        assert_error(await client.post("/encode", json=body), 422, "validation_error", param, words)
    async with serve(Settings(max_batch_texts=4), bundled_model) as small:
        response = await small.post("/encode", json={"texts": LONG, "chunking": {}})
        assert_error(response, 422, "validation_error", "texts", "windows")
        assert (await small.post("/encode", json={"texts": "still serving", "chunking": {}})).status_code == 200
