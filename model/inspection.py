"""What /attention computes from a forward pass's attention probabilities: selection, head mean, rollout.

Shape key: L layers, H heads, T tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Aggregate = Literal["none", "mean", "rollout"]


class IndexOutOfRange(ValueError):
    """A layer or head index outside the model, with its position in the request's list."""

    def __init__(self, position: int, value: int, count: int) -> None:
        super().__init__(f"{value} is out of range: there are {count} ({-count} to {count - 1})")
        self.position = position


def resolve_indices(values: Sequence[int] | None, count: int) -> list[int]:
    """Layer or head indices, negative ones counted from the end; all of them when None."""
    if values is None:
        return list(range(count))
    resolved = []
    for position, value in enumerate(values):
        if not -count <= value < count:
            raise IndexOutOfRange(position, value, count)
        resolved.append(value % count)
    return resolved


@dataclass(frozen=True)
class AttentionSelection:
    """Which attention maps a request wants, and how they are combined."""

    layers: tuple[int, ...]  # absolute layer indices, in the order asked
    heads: tuple[int, ...]  # absolute head indices, in the order asked
    aggregate: Aggregate = "none"

    @property
    def deepest(self) -> int:
        """Layers that must be computed: up to the deepest one selected."""
        return max(self.layers) + 1

    def shape(self, n_tokens: int) -> tuple[int, int, int, int]:
        """The shape of the selected maps for a text of ``n_tokens`` tokens."""
        head_axis = len(self.heads) if self.aggregate == "none" else 1
        return (len(self.layers), head_axis, n_tokens, n_tokens)


def head_mean(attention: Tensor) -> Tensor:
    """(L, H, T, T) → (L, 1, T, T): the average over heads."""
    return attention.mean(dim=1, keepdim=True)


def attention_rollout(attention: Tensor) -> Tensor:
    """Abnar & Zuidema (2020): per layer, head mean plus identity with rows renormalised, multiplied up.

    (L, H, T, T) → (L, T, T), entry l being the rollout through layers 0..l.
    """
    T = attention.size(-1)
    mixed = attention.mean(dim=1) + torch.eye(T, dtype=attention.dtype, device=attention.device)  # (L, T, T)
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)  # (L, T, T), rows sum to 1
    rollout = [mixed[0]]
    for layer in mixed[1:]:
        rollout.append(layer @ rollout[-1])  # (T, T)
    return torch.stack(rollout)  # (L, T, T)


def select_attention(attentions: Tensor, selection: AttentionSelection) -> Tensor:
    """The selected layers and heads of (L', H, T, T) maps, L' ≥ deepest selected layer + 1, aggregated.

    → (L, H', T, T) for ``none``, (L, 1, T, T) for ``mean`` and ``rollout``. Rollout runs through every
    computed layer below each selected one, over the selected heads.
    """
    L, H = attentions.shape[:2]
    every_head = list(selection.heads) == list(range(H))
    heads = attentions if every_head else attentions[:, list(selection.heads)]  # (L', H', T, T)
    layers = list(selection.layers)
    if selection.aggregate == "none":
        return heads if layers == list(range(L)) else heads[layers]  # (L, H', T, T): no copy when all are asked
    if selection.aggregate == "mean":
        return head_mean(heads[layers])  # (L, 1, T, T)
    if selection.aggregate == "rollout":
        return attention_rollout(heads)[layers].unsqueeze(1)  # (L, 1, T, T)
    raise ValueError(f"aggregate must be none, mean or rollout, got {selection.aggregate!r}")
