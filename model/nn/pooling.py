"""Pooling: token vectors (B, T, D) become one sentence vector (B, D'), as the directory's sentence-transformers
modules say: Pooling (every mode), then any Dense modules (D → D'), then the L2 norm.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from model.nn.encoder import activation_module
from model.spec.checkpoint import DENSE_ACTIVATIONS, POOLING_MODES, DenseSpec, Pooling

logger = logging.getLogger(__name__)


def splade(logits: Tensor, activation: str, pooling: str) -> Tensor:
    """One text's sparse vector from its real tokens' MLM logits (n, V) → (V,), as SpladePooling computes it."""
    weights = torch.log1p(torch.relu(logits))
    if activation == "log1p_relu":
        weights = torch.log1p(weights)
    return weights.amax(0) if pooling == "max" else weights.sum(0)


class Dense(nn.Module):
    """A sentence-transformers Dense module: activation(W x + b), on the pooled vector."""

    def __init__(self, in_features: int, out_features: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_name = activation
        self.activation = activation_module(DENSE_ACTIVATIONS[activation])

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.linear(x))  # (…, out_features)

    @classmethod
    def load(cls, spec: DenseSpec) -> Dense:
        """The module with its weights, from its directory's model.safetensors (``linear.weight``, ``linear.bias``)."""
        weights = spec.directory / "model.safetensors"
        dense = cls(spec.in_features, spec.out_features, spec.bias, spec.activation)
        with safe_open(str(weights), framework="pt", device="cpu") as checkpoint:
            names = checkpoint.keys()
            tensors = {name: checkpoint.get_tensor(name) for name in names}
        ours = dict(dense.named_parameters())
        if set(tensors) != set(ours) or any(tensors[n].shape != ours[n].shape for n in ours):
            found = {name: tuple(t.shape) for name, t in tensors.items()}
            expected = {name: tuple(p.shape) for name, p in ours.items()}
            raise ValueError(f"{weights} holds {found}, expected {expected}")
        with torch.no_grad():
            for name, tensor in tensors.items():
                ours[name].copy_(tensor)
        return dense.eval().requires_grad_(False)


def last_token(attention_mask: Tensor, input_ids: Tensor | None = None, pad_token_id: int | None = None) -> Tensor:
    """Each row's last real token (the ``lasttoken`` pooling); with ``input_ids`` and ``pad_token_id``, the last
    real token that is not ``pad_token_id`` (transformers' rule for a decoder's score: a tokenizer whose
    end-of-text token is also its padding token has the token before it scored), the last real token where every
    token is one. (B, T) → (B,) positions."""
    position = torch.arange(attention_mask.size(1), device=attention_mask.device)  # (T,)
    real = attention_mask.bool()
    last_real = (position * real).argmax(-1)  # (B,)
    if input_ids is None or pad_token_id is None:
        return last_real
    counted = real & (input_ids != pad_token_id)  # (B, T)
    return torch.where(counted.any(-1), (position * counted).argmax(-1), last_real)


def pool(hidden: Tensor, attention_mask: Tensor, mode: Pooling, skip: Tensor | None = None) -> Tensor:
    """One vector per sequence from its real (unpadded) tokens, as sentence-transformers' Pooling computes it.

    ``skip`` (B,): the first tokens of each row left out (a prompt, where the model excludes it); the weighted
    mean still counts positions from the first token."""
    T = hidden.size(1)
    position = torch.arange(T, device=hidden.device)  # (T,)
    if skip is not None:
        attention_mask = attention_mask * (position[None, :] >= skip[:, None])  # (B, T)
    if mode in ("cls", "lasttoken"):
        chosen = last_token(attention_mask) if mode == "lasttoken" else attention_mask.argmax(1)  # (B,)
        return hidden[torch.arange(hidden.size(0), device=hidden.device), chosen]  # (B, D)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        summed = (hidden * mask).sum(dim=1)  # (B, D)
        count = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1)
        return summed / (count if mode == "mean" else count.sqrt())  # (B, D)
    if mode == "weightedmean":
        weights = mask * (position + 1).to(hidden.dtype)[None, :, None]  # (B, T, 1): 1, 2, … from the first token
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (B, D)
    if mode == "max":
        masked = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min)  # (B, T, D)
        return masked.max(dim=1).values  # (B, D)
    raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")


def normalize(x: Tensor) -> Tensor:
    """L2-normalise each row."""
    return F.normalize(x, p=2, dim=-1)


def sentence_embeddings(
    hidden: Tensor,
    attention_mask: Tensor,
    mode: Pooling,
    normalize_embeddings: bool,
    dense: tuple[Dense, ...] = (),
    skip: Tensor | None = None,
) -> Tensor:
    """The one path from token vectors (B, T, D) to sentence vectors (B, D'): pool, the Dense modules, then
    L2-normalise if asked.

    Everything that serves or checks sentence embeddings goes through here.
    """
    sentences = pool(hidden, attention_mask, mode, skip)  # (B, D)
    for module in dense:
        sentences = module(sentences.to(module.linear.weight.dtype))  # (B, D')
    return normalize(sentences) if normalize_embeddings else sentences
