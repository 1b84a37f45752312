"""Attention selection, head mean and rollout (model/nn/inspection.py) against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import AttentionSelection, IndexOutOfRange, attention_rollout, resolve_indices, select_attention


def random_attention(L: int = 4, H: int = 3, T: int = 5, seed: int = 0) -> torch.Tensor:
    scores = torch.randn(L, H, T, T, generator=torch.Generator().manual_seed(seed))
    return scores.softmax(dim=-1)  # (L, H, T, T), rows sum to 1


def rollout_in_numpy(attention: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema: Ã_l = normalise(mean_h A_l + I); R_0 = Ã_0, R_l = Ã_l R_{l-1}."""
    T = attention.shape[-1]
    out, current = [], None
    for layer in attention:
        mixed = layer.mean(axis=0) + np.eye(T)
        mixed = mixed / mixed.sum(axis=-1, keepdims=True)
        current = mixed if current is None else mixed @ current
        out.append(current)
    return np.stack(out)


def test_rollout_equals_the_paper_computed_in_numpy() -> None:
    attention = random_attention()
    np.testing.assert_allclose(attention_rollout(attention).numpy(), rollout_in_numpy(attention.numpy()), atol=1e-6)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        # layers and heads in the order asked, not sorted
        (AttentionSelection((3, 1), (2, 0)), lambda a: a[[3, 1]][:, [2, 0]]),
        (AttentionSelection((0, 2), (1, 2), "mean"), lambda a: a[[0, 2]][:, [1, 2]].mean(axis=1, keepdims=True)),
        # rollout runs through every layer up to each selected one, over the selected heads
        (AttentionSelection((1, 3), (0, 2), "rollout"), lambda a: rollout_in_numpy(a[:, [0, 2]])[[1, 3]][:, None]),
    ],
)
def test_select_attention(selection: AttentionSelection, expected) -> None:
    attention = random_attention()
    got = select_attention(attention, selection).numpy()
    assert got.shape == selection.shape(5)
    np.testing.assert_allclose(got, expected(attention.numpy()), atol=1e-6)


def test_indices_resolve_from_the_end_and_name_the_one_out_of_range() -> None:
    assert resolve_indices(None, 3) == [0, 1, 2]
    assert resolve_indices([-1, 0, -3], 3) == [2, 0, 0]
    with pytest.raises(IndexOutOfRange, match=r"5 is out of range: there are 3 \(-3 to 2\)") as raised:
        resolve_indices([0, 5], 3)
    assert raised.value.position == 1
