"""POST /encode/late-chunks: one pass over the text, each chunk the mean of its own tokens' final vectors, against
transformers' BERT."""

from __future__ import annotations

import httpx
import numpy as np
import torch

from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, serve

TEXT = "Berlin is a city in Germany. It is the capital!  Its population is large?\nAbout 3.8 million people live there."


def reference(hf_bert, hf_tokenizer, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """Each span's mean of transformers' final token vectors over the tokens wholly inside it, L2-normalised."""
    encoded = hf_tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    with torch.no_grad():
        states = hf_bert(torch.tensor([encoded["input_ids"]])).last_hidden_state[0].numpy()
    out = []
    for start, end in spans:
        rows = [
            i
            for i, ((s, e), special) in enumerate(zip(encoded["offset_mapping"], encoded["special_tokens_mask"]))
            if not special and e > s and start <= s and e <= end
        ]
        mean = states[rows].mean(0)
        out.append(mean / np.linalg.norm(mean))
    return np.stack(out)


async def test_default_chunks_are_the_sentences_and_equal_transformers(
    client: httpx.AsyncClient, hf_bert, hf_tokenizer
) -> None:
    response = await client.post("/encode/late-chunks", json={"text": TEXT})
    assert response.status_code == 200, response.text
    body = response.json()
    spans = [(item["start"], item["end"]) for item in body["data"]]
    # cut after ".", "!", "?" and newlines that whitespace follows; "3.8" is not cut
    assert [TEXT[s:e] for s, e in spans] == [
        "Berlin is a city in Germany.",
        " It is the capital!",
        "  Its population is large?",
        "\nAbout 3.8 million people live there.",
    ]
    expected = reference(hf_bert, hf_tokenizer, TEXT, spans)
    np.testing.assert_allclose([item["embedding"] for item in body["data"]], expected, atol=2e-5)
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == len(hf_tokenizer(TEXT)["input_ids"])


async def test_given_spans_and_unnormalised(client: httpx.AsyncClient, hf_bert, hf_tokenizer) -> None:
    spans = [(0, 6), (20, 27), (50, 80)]
    response = await client.post("/encode/late-chunks", json={"text": TEXT, "chunks": spans, "normalize": False})
    assert response.status_code == 200, response.text
    got = np.array([item["embedding"] for item in response.json()["data"]])
    expected = reference(hf_bert, hf_tokenizer, TEXT, spans)
    np.testing.assert_allclose(got / np.linalg.norm(got, axis=1, keepdims=True), expected, atol=2e-5)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)


async def test_a_long_text_goes_in_windows_overlapping_by_half(
    client: httpx.AsyncClient, hf_bert, hf_tokenizer
) -> None:
    """Beyond the window each chunk comes from the window where its centre sits furthest from an edge: for a chunk
    near the start that is the first window, whose tokens are the text's first 256 (a pass over those alone)."""
    sentence = "The river flows past the old town and under seven bridges. "
    text = sentence * 40  # about 480 tokens
    first = (0, len(sentence) - 1)
    response = await client.post("/encode/late-chunks", json={"text": text, "chunks": [first]})
    assert response.status_code == 200, response.text
    ids = hf_tokenizer(text)["input_ids"]
    window = ids[:255] + ids[-1:]  # [CLS] + the first 254 content tokens + [SEP]
    offsets = hf_tokenizer(text, return_offsets_mapping=True)["offset_mapping"][:255]
    with torch.no_grad():
        states = hf_bert(torch.tensor([window])).last_hidden_state[0].numpy()
    rows = [i for i, (s, e) in enumerate(offsets) if e > s and first[0] <= s and e <= first[1]]
    expected = states[rows].mean(0)
    np.testing.assert_allclose(response.json()["data"][0]["embedding"], expected / np.linalg.norm(expected), atol=2e-5)
    every = await client.post("/encode/late-chunks", json={"text": text})
    assert every.status_code == 200 and len(every.json()["data"]) == 40


async def test_bad_spans_get_their_422(client: httpx.AsyncClient) -> None:
    for chunks, param, words in (
        ([[0, 500]], "chunks[0]", "span"),
        ([[5, 5]], "chunks[0]", "span"),
        ([[0, 10], [5, 20]], "chunks[1]", "overlaps"),
        ([[0, 10], [28, 29]], "chunks[1]", "no token"),
        ([[0, 1, 2]], "chunks[0]", ""),
        ([], "chunks", ""),
    ):
        response = await client.post("/encode/late-chunks", json={"text": TEXT, "chunks": chunks})
        assert_error(response, 422, "validation_error", param, words)
    long = await client.post("/encode/late-chunks", json={"text": "word " * 600, "chunks": [[0, 2000]]})
    assert_error(long, 422, "validation_error", "chunks[0]", "longer than half")
    assert (await client.post("/encode/late-chunks", json={"text": "still serving."})).status_code == 200


async def test_the_windows_of_a_request_are_bounded_as_info_says(bundled_model: TextEncoder) -> None:
    async with serve(Settings(max_batch_texts=2), bundled_model) as small:
        limit = (await small.get("/info")).json()["limits"]["max_windows_per_request"]
        assert limit == 2
        text = "A sentence of a long text. " * 120  # about 840 tokens: six windows overlapping by half
        response = await small.post("/encode/late-chunks", json={"text": text})
        assert_error(response, 422, "validation_error", "text", "windows")
        assert (await small.post("/encode/late-chunks", json={"text": "Short. Text."})).status_code == 200
