"""The packed pass's layouts (model/nn/encoder.py, ``Packing``): the real tokens gathered, and spread back for the
attention core with every real token in its place."""

from __future__ import annotations

import torch

from model.nn.encoder import Packing


def test_the_attention_core_gets_every_real_token_in_its_place_and_real_rows_in_the_padding() -> None:
    """``spread`` gathers rather than scatters into zeros: the real tokens where ``unpack`` puts them, and at each
    padding position a copy of a real token's row (finite, so a masked key weighs exactly nothing)."""
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])  # right, left, none
    x = torch.randn(4, 5, 6)
    packing = Packing.from_mask(mask)
    packed = packing.pack(x)  # (N, 6)
    assert packed.shape == (int(mask.sum()), 6)
    spread, unpacked = packing.spread(packed), packing.unpack(packed)
    real = mask.bool()
    assert torch.equal(spread[real], x[real]) and torch.equal(unpacked[real], x[real])
    assert torch.equal(unpacked[~real], torch.zeros(int((~real).sum()), 6))
    for row in spread[~real]:
        assert any(torch.equal(row, token) for token in packed)


def test_a_batch_without_padding_is_spread_as_a_view() -> None:
    mask = torch.ones(2, 3, dtype=torch.long)
    x = torch.randn(2, 3, 4)
    packing = Packing.from_mask(mask)
    packed = packing.pack(x)
    assert packing.full and torch.equal(packing.spread(packed), x)
    assert packing.spread(packed).data_ptr() == x.data_ptr()
