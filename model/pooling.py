"""Pooling: token vectors (B, T, D) become one sentence vector (B, D)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

Pooling = Literal["mean", "cls", "max"]
POOLING_MODES: tuple[Pooling, ...] = ("mean", "cls", "max")

# sentence-transformers' 1_Pooling/config.json flags and the mode each one selects.
ST_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}


@dataclass(frozen=True)
class PoolingConfig:
    mode: Pooling = "mean"  # how token vectors become the sentence vector
    normalize: bool = True  # L2-normalise the sentence vector

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> PoolingConfig:
        """The model's own pooling: sentence-transformers' ``1_Pooling/config.json`` if present, else mean."""
        path = Path(model_dir) / "1_Pooling" / "config.json"
        if not path.is_file():
            return cls()
        try:
            st = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        enabled = [flag for flag, value in st.items() if flag.startswith("pooling_mode_") and value]
        unsupported = [flag for flag in enabled if flag not in ST_POOLING_FLAGS]
        if unsupported or len(enabled) != 1:
            raise ValueError(
                f"{path}: exactly one of {', '.join(ST_POOLING_FLAGS)} must be true, got {enabled or 'none'}"
            )
        return cls(mode=ST_POOLING_FLAGS[enabled[0]])


def pool(hidden: Tensor, attention_mask: Tensor, mode: Pooling) -> Tensor:
    """One vector per sequence from its real (unpadded) tokens: mean, first ([CLS]) or element-wise max."""
    if mode == "cls":
        return hidden[:, 0]  # (B, D)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if mode == "mean":
        summed = (hidden * mask).sum(dim=1)  # (B, D)
        return summed / mask.sum(dim=1).clamp(min=1e-9)  # (B, D)
    if mode == "max":
        masked = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min)  # (B, T, D)
        return masked.max(dim=1).values  # (B, D)
    raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")


def normalize(x: Tensor) -> Tensor:
    """L2-normalise each row."""
    return F.normalize(x, p=2, dim=-1)


def sentence_embeddings(hidden: Tensor, attention_mask: Tensor, mode: Pooling, normalize_embeddings: bool) -> Tensor:
    """The one path from token vectors (B, T, D) to sentence vectors (B, D): pool, then L2-normalise if asked.

    Everything that serves or checks sentence embeddings goes through here.
    """
    sentences = pool(hidden, attention_mask, mode)  # (B, D)
    return normalize(sentences) if normalize_embeddings else sentences


def keep_dimensions(vectors: np.ndarray, dimensions: int, normalize_again: bool = True) -> np.ndarray:
    """Matryoshka: the first ``dimensions`` components of each row of (B, D), L2-normalised again if asked."""
    kept = vectors[..., :dimensions]  # (B, d)
    if not normalize_again:
        return kept
    norms = np.linalg.norm(kept, axis=-1, keepdims=True)  # (B, 1)
    return kept / np.maximum(norms, 1e-12)
