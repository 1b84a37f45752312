"""Pooling: token vectors (B, T, D) become one sentence vector (B, D'), as the directory's sentence-transformers
modules say: Pooling (every mode), then any Dense modules (D → D'), then the L2 norm.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from model.encoder import activation_module

logger = logging.getLogger(__name__)

Pooling = Literal["mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean"]
POOLING_MODES: tuple[Pooling, ...] = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")

# sentence-transformers' 1_Pooling/config.json flags (as written before its pooling_mode key) and their modes.
ST_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# Dense modules' activation_function values (torch classes, as sentence-transformers saves them) we run, and the
# activation (model/encoder.py's ACTIVATIONS) each one is.
DENSE_ACTIVATIONS: dict[str, str] = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}
# modules.json's kinds; any other is refused. MLMTransformer and SpladePooling make a SPLADE model (sparse_spec).
# MultiVectorMask makes a ColBERT model (model/late_interaction.py).
KNOWN_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling", "MultiVectorMask")
# config_sentence_transformers.json's model_type of a ColBERT checkpoint: sentence-transformers', PyLate's (≤ 3)
MULTI_VECTOR_TYPES = ("MultiVectorEncoder", "ColBERT")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SparseSpec:
    """How a model makes sparse vectors. ``splade``: sentence-transformers' SpladePooling, over the real tokens the
    maximum or the sum of log(1 + relu(MLM logits)) for every vocabulary entry (``log1p_relu``: log1p once more).
    ``bge-m3``: BGE-M3's lexical weights, relu(sparse_linear(h)) for each token, the largest for each token id,
    the ``excluded`` ids (the tokenizer's cls, eos, pad and unk) left out."""

    kind: Literal["splade", "bge-m3"] = "splade"
    pooling: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"
    excluded: tuple[int, ...] = ()


BGE_M3_SPARSE = "sparse_linear.pt"  # BGE-M3's token-weight layer, beside its XLM-R checkpoint
BGE_M3_COLBERT = "colbert_linear.pt"  # BGE-M3's multi-vector projection


def sparse_spec(model_dir: Path, excluded: tuple[int, ...] = ()) -> SparseSpec | None:
    """The directory's sparse output: a SpladePooling module of its modules.json, or BGE-M3's sparse_linear.pt
    (``excluded``: the ids its lexical weights leave out); None where there is neither, ValueError for what is not
    served."""
    if (Path(model_dir) / BGE_M3_SPARSE).is_file():
        return SparseSpec(kind="bge-m3", excluded=excluded)
    paths = [path for kind, path in st_modules(Path(model_dir)) if kind == "SpladePooling"]
    if not paths:
        return None
    config_path = Path(model_dir) / paths[0] / "config.json"
    st = read_json(config_path) if config_path.is_file() else {}
    pooling, activation = st.get("pooling_strategy", "max"), st.get("activation_function", "relu")
    if pooling not in ("max", "sum") or activation not in SPLADE_ACTIVATIONS:
        raise ValueError(f"{config_path}: unsupported SpladePooling ({pooling!r}, {activation!r})")
    return SparseSpec("splade", pooling, activation)


def splade(logits: Tensor, activation: str, pooling: str) -> Tensor:
    """One text's sparse vector from its real tokens' MLM logits (n, V) → (V,), as SpladePooling computes it."""
    weights = torch.log1p(torch.relu(logits))
    if activation == "log1p_relu":
        weights = torch.log1p(weights)
    return weights.amax(0) if pooling == "max" else weights.sum(0)


@dataclass(frozen=True)
class DenseSpec:
    """A sentence-transformers Dense module as its config.json describes it (no weights)."""

    directory: Path = field(compare=False)  # where its config.json and weights are
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of DENSE_ACTIVATIONS

    @property
    def affine(self) -> bool:
        """Without an activation: the module maps a mean of vectors to the mean of their images."""
        return DENSE_ACTIVATIONS[self.activation] == "identity"

    @classmethod
    def read(cls, directory: Path, tokens: bool = False) -> DenseSpec:
        """A Dense module's config.json: on the sentence embedding, or with ``tokens`` on each token vector (a
        ColBERT projection; PyLate's configs, which name no input, project tokens); ValueError for what is not
        served."""
        st = read_json(directory / "config.json")
        wanted = "token_embeddings" if tokens else "sentence_embedding"
        if st.get("use_residual") or st.get("module_input_name", wanted) != wanted:
            on = "each token vector" if tokens else "the sentence embedding"
            raise ValueError(f"{directory}: only Dense modules on {on}, without residual, are served")
        activation = st.get("activation_function", "torch.nn.modules.activation.Tanh")  # sentence-transformers' default
        if activation not in DENSE_ACTIVATIONS:
            raise ValueError(
                f"{directory}: unsupported activation_function {activation!r} "
                f"(supported: {', '.join(DENSE_ACTIVATIONS)})"
            )
        if not (directory / "model.safetensors").is_file():
            raise ValueError(f"{directory} has no model.safetensors (weights in other formats are not read)")
        return cls(directory, int(st["in_features"]), int(st["out_features"]), bool(st.get("bias", True)), activation)


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


@dataclass(frozen=True)
class PoolingConfig:
    mode: Pooling = "mean"  # how token vectors become the sentence vector
    normalize: bool = True  # L2-normalise the sentence vector
    include_prompt: bool = True  # False: a prompt's tokens are left out of the pooling (sentence-transformers)
    dense: tuple[DenseSpec, ...] = ()  # the Dense modules after pooling, in order (their weights: Dense.load)

    @property
    def affine(self) -> bool:
        """Whether every Dense module is affine (none, or none with an activation)."""
        return all(spec.affine for spec in self.dense)

    def dimension(self, width: int) -> int:
        """The sentence vector's width for token vectors of ``width``: the last Dense module's output."""
        return self.dense[-1].out_features if self.dense else width

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> PoolingConfig:
        """The model's own pooling and Dense modules, from sentence-transformers' files: modules.json where there is
        one, else ``1_Pooling/config.json``, else mean pooling."""
        model_dir = Path(model_dir)
        modules = st_modules(model_dir)
        pooling_dirs = [path for kind, path in modules if kind == "Pooling"] or ["1_Pooling"]
        path = model_dir / pooling_dirs[0] / "config.json"
        mode, include_prompt = _pooling(path) if path.is_file() else ("mean", True)
        if multi_vector_layout(model_dir):  # its Dense modules project token vectors (late_interaction.py)
            return cls(mode=mode, include_prompt=include_prompt)
        dense = tuple(DenseSpec.read(model_dir / path) for kind, path in modules if kind == "Dense")
        return cls(mode=mode, include_prompt=include_prompt, dense=dense)


def st_config(model_dir: Path) -> dict[str, Any]:
    """config_sentence_transformers.json ({} where there is none)."""
    path = Path(model_dir) / "config_sentence_transformers.json"
    st = read_json(path) if path.is_file() else {}
    if not isinstance(st, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return st


def multi_vector_layout(model_dir: Path) -> bool:
    """Whether the directory is a ColBERT checkpoint as sentence-transformers' MultiVectorEncoder or PyLate saves
    it: its model_type says so, or its modules include a MultiVectorMask."""
    if st_config(model_dir).get("model_type") in MULTI_VECTOR_TYPES:
        return True
    return any(kind == "MultiVectorMask" for kind, _ in st_modules(Path(model_dir)))


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(value, dict | list):
        raise ValueError(f"{path} must hold a JSON object")
    return value  # type: ignore[return-value]


def st_modules(model_dir: Path) -> list[tuple[str, str]]:
    """modules.json's (kind, path) pairs in order: kind the class name (Transformer, Pooling, Dense, Normalize)."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return []
    entries = read_json(path)
    if not isinstance(entries, list):
        raise ValueError(f"{path} must hold a list of modules")
    modules = []
    for entry in sorted(entries, key=lambda entry: entry.get("idx", 0)):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if kind not in KNOWN_MODULES:
            raise ValueError(f"{path}: unsupported sentence-transformers module {entry.get('type')!r}")
        modules.append((kind, str(entry.get("path", ""))))
    return modules


def _pooling(path: Path) -> tuple[Pooling, bool]:
    """A Pooling module's mode and include_prompt: its ``pooling_mode`` key, or the older boolean flags."""
    st = read_json(path)
    mode = st.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        enabled = [flag for flag, value in st.items() if flag.startswith("pooling_mode_") and value]
        unsupported = [flag for flag in enabled if flag not in ST_POOLING_FLAGS]
        if unsupported:
            raise ValueError(f"{path}: unsupported pooling flags {unsupported}")
        modes = [ST_POOLING_FLAGS[flag] for flag in enabled]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        served = ", ".join(POOLING_MODES)
        raise ValueError(f"{path}: exactly one pooling mode of {served} is served, got {modes or 'none'}")
    return modes[0], bool(st.get("include_prompt", True))


def pool(hidden: Tensor, attention_mask: Tensor, mode: Pooling, skip: Tensor | None = None) -> Tensor:
    """One vector per sequence from its real (unpadded) tokens, as sentence-transformers' Pooling computes it.

    ``skip`` (B,): the first tokens of each row left out (a prompt, where the model excludes it); the weighted
    mean still counts positions from the first token."""
    T = hidden.size(1)
    position = torch.arange(T, device=hidden.device)  # (T,)
    if skip is not None:
        attention_mask = attention_mask * (position[None, :] >= skip[:, None])  # (B, T)
    if mode in ("cls", "lasttoken"):
        chosen = (position * attention_mask).argmax(1) if mode == "lasttoken" else attention_mask.argmax(1)  # (B,)
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


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """``normalize`` for arrays: each vector along the last axis L2-normalised (a zero vector stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)  # (…, 1)
    return vectors / np.maximum(norms, 1e-12)  # F.normalize's epsilon


def keep_dimensions(vectors: np.ndarray, dimensions: int, normalize_again: bool = True) -> np.ndarray:
    """Matryoshka: the first ``dimensions`` components of each row of (B, D), L2-normalised again if asked."""
    kept = vectors[..., :dimensions]  # (B, d)
    return unit_rows(kept) if normalize_again else kept
