"""POST /attention: equal to transformers' output_attentions; selection, mean, rollout, rounding, pairs."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

TEXT = "The animal didn't cross the street because it was too tired."


async def attention(client: httpx.AsyncClient, **request) -> dict:
    response = await client.post("/attention", json={"text": TEXT, **request})
    assert response.status_code == 200, response.text
    return response.json()


def reference_attention(hf_bert, hf_tokenizer, text: str, pair: str | None = None) -> np.ndarray:
    with torch.inference_mode():
        output = hf_bert(**hf_tokenizer(text, pair, return_tensors="pt"), output_attentions=True)
    return torch.stack(output.attentions)[:, 0].numpy()  # (L, H, T, T)


async def test_defaults_equal_transformers_output_attentions(client, hf_bert, hf_tokenizer) -> None:
    body = await attention(client)
    expected = reference_attention(hf_bert, hf_tokenizer, TEXT)
    weights = np.array(body["attention"])
    assert body["shape"] == list(weights.shape) == list(expected.shape)
    assert body["layers"] == list(range(6)) and body["heads"] == list(range(12))
    assert np.abs(weights - expected).max() <= 1e-4
    assert body["tokens"] == hf_tokenizer.convert_ids_to_tokens(hf_tokenizer(TEXT)["input_ids"])
    assert [t["text"] for t in body["token_details"]] == body["tokens"]


async def test_every_row_sums_to_one(client) -> None:
    weights = np.array((await attention(client))["attention"])
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("layers", "heads", "resolved_layers", "resolved_heads"),
    [
        ([0], [0], [0], [0]),  # first layer, first head
        ([-1], None, [5], list(range(12))),  # the last layer, all heads
        ([2, -6], [11, -1, 3], [2, 0], [11, 11, 3]),  # negative indices and order as given
    ],
)
async def test_layer_and_head_selection_slices_the_full_result(
    client, layers, heads, resolved_layers, resolved_heads
) -> None:
    full = np.array((await attention(client))["attention"])
    body = await attention(client, layers=layers, heads=heads)
    assert body["layers"] == resolved_layers and body["heads"] == resolved_heads
    expected = full[resolved_layers][:, resolved_heads]
    np.testing.assert_allclose(np.array(body["attention"]), expected, atol=1e-6)
    assert body["shape"] == list(expected.shape)


async def test_mean_averages_the_selected_heads(client) -> None:
    full = np.array((await attention(client))["attention"])
    body = await attention(client, aggregate="mean", heads=[1, 4, 7], layers=[1, 5])
    assert body["shape"] == [2, 1, full.shape[2], full.shape[3]]
    expected = np.stack([(full[layer, 1] + full[layer, 4] + full[layer, 7]) / 3 for layer in (1, 5)])[:, None]
    np.testing.assert_allclose(np.array(body["attention"]), expected, atol=1e-6)


def rollout_by_hand(full: np.ndarray, heads: list[int]) -> list[np.ndarray]:
    """Abnar & Zuidema: Â_l = rownorm(mean_h A_l + I); R_0 = Â_0, R_l = Â_l R_(l-1)."""
    T = full.shape[-1]
    rollouts, current = [], np.eye(T)
    for layer in range(full.shape[0]):
        mixed = full[layer, heads].mean(axis=0) + np.eye(T)
        mixed = mixed / mixed.sum(axis=1, keepdims=True)
        current = mixed @ current
        rollouts.append(current)
    return rollouts


@pytest.mark.parametrize("heads", [None, [0, 5]])
async def test_rollout_equals_a_straightforward_computation(client, heads) -> None:
    full = np.array((await attention(client))["attention"]).astype(np.float64)
    body = await attention(client, aggregate="rollout", heads=heads, layers=[0, 2, -1])
    expected = rollout_by_hand(full, heads or list(range(12)))
    weights = np.array(body["attention"])
    assert body["shape"] == [3, 1, full.shape[2], full.shape[3]]
    for row, layer in enumerate([0, 2, 5]):
        np.testing.assert_allclose(weights[row, 0], expected[layer], atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("decimals", [0, 2, 5])
async def test_decimals_round_every_weight(client, decimals: int) -> None:
    full = np.array((await attention(client, layers=[3]))["attention"])
    body = await attention(client, layers=[3], decimals=decimals)
    rounded = np.array(body["attention"])
    # each weight a whole number of 10^-decimals, the nearest one (a value at a tie, as float32 keeps it, may go
    # either way, so the nearest is checked to within float32's rounding rather than against np.round of the JSON)
    units = rounded * 10**decimals
    np.testing.assert_allclose(units, np.round(units), atol=1e-6 * max(1.0, 10**decimals / 1e3))
    assert np.abs(rounded - full).max() <= 0.5 * 10**-decimals + 1e-7
    assert np.abs(rounded - full).max() > 0.1 * 10**-decimals, "the weights must have been rounded"


async def test_text_pair_has_segments_and_equals_transformers(client, hf_bert, hf_tokenizer) -> None:
    pair = "It was very tired indeed."
    body = await attention(client, text_pair=pair)
    segments = [t["segment"] for t in body["token_details"]]
    reference = hf_tokenizer(TEXT, pair)
    assert segments == reference["token_type_ids"]
    assert segments[-1] == 1 and segments[0] == 0
    expected = reference_attention(hf_bert, hf_tokenizer, TEXT, pair)
    assert np.abs(np.array(body["attention"]) - expected).max() <= 1e-4
    for token in body["token_details"]:
        if not token["special"]:
            source = TEXT if token["segment"] == 0 else pair
            assert source[token["start"] : token["end"]].lower() == token["text"].removeprefix("##")


async def test_long_text_is_truncated_to_the_attention_maximum(client) -> None:
    body = await attention(client, text="word " * 300, layers=[0], heads=[0])
    assert body["shape"] == [1, 1, 256, 256] and body["tokens"][-1] == "[SEP]"
