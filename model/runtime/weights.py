"""Loading ``model.safetensors`` checkpoints into our Encoder and its heads, by the tables of
model/spec/tensor_names.py."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from model.nn.encoder import Encoder
from model.nn.heads import LanguageModelHead, MaskedLanguageModelHead, SequenceClassificationHead
from model.spec.config import EncoderConfig
from model.spec.tensor_names import (
    FAMILIES,
    HEAD_TENSORS,
    IGNORED_SUFFIXES,
    LM_HEAD,
    MASKED_LM_TENSORS,
    QKV,
    head_tensors,
    masked_lm_tensors,
)

logger = logging.getLogger(__name__)


FLOATS = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def checkpoint_names(encoder: Encoder) -> dict[str, tuple[str, ...]]:
    """For each of the encoder's parameters, the checkpoint tensors it is loaded from."""
    ours = dict(encoder.named_parameters())
    names: dict[str, tuple[str, ...]] = {}
    for pattern, theirs in FAMILIES[encoder.config.family].tensors.items():
        for i in range(encoder.config.n_layers) if "{i}" in pattern else [None]:
            name = pattern.format(i=i)
            if name in ours:
                names[name] = tuple(part.format(i=i) for part in theirs)
    return names


def part_shapes(encoder: Encoder, name: str, n_parts: int) -> list[tuple[int, ...]]:
    """The shapes of the checkpoint tensors that make up one parameter, concatenated along its first axis: q, k
    and v of their widths (k and v narrower under grouped-query attention), other parts alike."""
    shape = tuple(encoder.get_parameter(name).shape)
    if n_parts == 3 and name.endswith(QKV):
        return [(width, *shape[1:]) for width in encoder.config.qkv_widths]
    return [(shape[0] // n_parts, *shape[1:])] * n_parts


def open_checkpoint(path: Path) -> Any:
    """The safetensors file, opened; ValueError naming what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path} (expected a model.safetensors file)")
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as error:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from error


def checkpoint_dtype(path: Path) -> torch.dtype:
    """The dtype most of the checkpoint's floating-point values are stored in (bfloat16 for most decoders)."""
    sizes: dict[torch.dtype, int] = {}
    with open_checkpoint(path) as checkpoint:
        keys = checkpoint.keys()
        for key in keys:
            part = checkpoint.get_slice(key)
            dtype = FLOATS.get(part.get_dtype())
            if dtype is not None:
                sizes[dtype] = sizes.get(dtype, 0) + math.prod(part.get_shape())
    return max(sizes, key=lambda dtype: sizes[dtype]) if sizes else torch.float32


def load_weights(encoder: Encoder, path: Path, dtype: torch.dtype | None = None) -> None:
    """Copy a safetensors checkpoint into ``encoder``, checking every name and shape first.

    An encoder built on the meta device (``read_encoder``) takes the checkpoint's tensors themselves, converted
    to ``dtype`` (its own parameters' dtype when None): nothing is allocated or initialised twice.
    Raises ValueError naming every missing tensor, unexpected tensor and wrong shape.
    """
    path = Path(path)
    with open_checkpoint(path) as checkpoint:
        stored = set(checkpoint.keys())
        family = FAMILIES[encoder.config.family]
        prefix = family.prefix(stored)
        plan = checkpoint_names(encoder)
        ours = dict(encoder.named_parameters())
        if set(plan) != set(ours):
            raise AssertionError(f"mapping table out of step with the encoder: {sorted(set(plan) ^ set(ours))}")

        missing: list[str] = []
        wrong_shape: list[str] = []
        tensors: dict[str, Tensor] = {}
        used: set[str] = set()
        for name, parts in plan.items():
            keys = [prefix + part for part in parts]
            absent = [key for key in keys if key not in stored]
            if absent:
                missing.extend(absent)
                continue
            used.update(keys)
            expected = part_shapes(encoder, name, len(keys))
            loaded = [checkpoint.get_tensor(key) for key in keys]
            bad = [
                f"{key} {tuple(t.shape)} (expected {shape})"
                for key, t, shape in zip(keys, loaded, expected)
                if tuple(t.shape) != shape
            ]
            if bad:
                wrong_shape.extend(bad)
                continue
            tensors[name] = loaded[0] if len(loaded) == 1 else torch.cat(loaded, dim=0)

    unexpected = sorted(
        key
        for key in stored - used
        if not key.removeprefix(prefix).startswith(family.ignored)
        and not key.endswith(IGNORED_SUFFIXES)
        and not (encoder.embeddings.position is None and "position_embeddings" in key)
    )
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(sorted(missing))}")
    if wrong_shape:
        problems.append(f"wrong shapes: {', '.join(wrong_shape)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if problems:
        raise ValueError(f"checkpoint {path} does not fit the config: " + "; ".join(problems))
    assign(encoder, tensors, dtype)
    logger.debug("loaded %d tensors from %s", len(tensors), path)


def assign(module: nn.Module, tensors: dict[str, Tensor], dtype: torch.dtype | None) -> None:
    """Put the loaded tensors into the module's parameters: as they are (converted to ``dtype``) where the
    module was built on the meta device, else copied into the parameters it has.

    Either way the parameters own their memory: a tensor already in ``dtype`` is copied too, never kept as a
    view of the checkpoint's mapped file, which would keep every page of the file resident beside the fused
    q/k/v and gate/up copies made from it (a bfloat16 Qwen3-0.6B: 1.8 GB resident instead of 1.2)."""
    ours = dict(module.named_parameters())
    with torch.no_grad():
        if any(parameter.is_meta for parameter in ours.values()):
            target = dtype or torch.float32
            owned = {name: t.to(target, copy=True) for name, t in tensors.items()}
            module.load_state_dict(owned, strict=False, assign=True)
        else:
            for name, tensor in tensors.items():
                ours[name].copy_(tensor)
    if any(parameter.is_meta for parameter in module.parameters()):
        raise AssertionError("a parameter was left without weights")


def read_encoder(config: EncoderConfig, path: Path, dtype: torch.dtype = torch.float32) -> Encoder:
    """An encoder of ``config`` holding the checkpoint's weights in ``dtype``, in eval mode: built on the meta
    device, so that no weight is initialised, nor held in another dtype, before the checkpoint's arrive."""
    with torch.device("meta"):
        encoder = Encoder(config)
    load_weights(encoder, path, dtype)
    return encoder.eval().requires_grad_(False)


def load_head(
    head: SequenceClassificationHead, config: EncoderConfig, path: Path, dtype: torch.dtype | None = None
) -> None:
    """Copy a sequence-classification head's tensors from the checkpoint, every name and shape checked."""
    names = head_tensors(HEAD_TENSORS[config.family], (name for name, _ in head.named_parameters()))
    ours = dict(head.named_parameters())
    with open_checkpoint(path) as checkpoint:
        stored = set(checkpoint.keys())
        missing = sorted(theirs for theirs in names.values() if theirs not in stored)
        if missing:
            raise ValueError(f"checkpoint {path} has a classification config but lacks its head: {', '.join(missing)}")
        tensors = {name: checkpoint.get_tensor(theirs) for name, theirs in names.items()}
    wrong = [
        f"{names[name]} {tuple(t.shape)} (expected {tuple(ours[name].shape)})"
        for name, t in tensors.items()
        if t.shape != ours[name].shape
    ]
    if wrong:
        raise ValueError(f"checkpoint {path}: classification head of the wrong shape: {', '.join(wrong)}")
    assign(head, tensors, dtype)


def load_language_model_rows(
    config: EncoderConfig, path: Path, tokens: Sequence[int], tied: bool, dtype: torch.dtype
) -> LanguageModelHead:
    """The rows of a ``…ForCausalLM`` checkpoint's LM head (``lm_head``, or the token embeddings it is tied to)
    for the given token ids: all a yes/no reranker needs of a vocabulary-wide head."""
    family = FAMILIES[config.family]
    with open_checkpoint(path) as checkpoint:
        stored = set(checkpoint.keys())
        embeddings = family.token_embeddings(stored)
        name = LM_HEAD if LM_HEAD in stored else (embeddings if tied else None)
        if name is None or name not in stored:
            raise ValueError(f"checkpoint {path} is a causal LM but holds no {LM_HEAD} (and its head is not tied)")
        table = checkpoint.get_slice(name)
        rows, width = table.get_shape()
        if width != config.d_model or any(not 0 <= token < rows for token in tokens):
            raise ValueError(f"checkpoint {path}: {name} of shape {(rows, width)} does not fit tokens {list(tokens)}")
        weight = torch.stack([table[token] for token in tokens]).to(dtype)  # (len(tokens), D)
    return LanguageModelHead(weight, config.final_logit_softcapping)


def load_masked_lm_head(config: EncoderConfig, path: Path, dtype: torch.dtype) -> MaskedLanguageModelHead:
    """A ``…ForMaskedLM`` checkpoint's head (MASKED_LM_TENSORS), its decoder tied to the token embeddings where the
    checkpoint holds no weight of its own; ValueError naming what is missing or of the wrong shape."""
    if config.family not in MASKED_LM_TENSORS:
        raise ValueError(f"no masked-LM head is read for model_type {config.family!r}")
    head = MaskedLanguageModelHead(config)
    with open_checkpoint(path) as checkpoint:
        stored = set(checkpoint.keys())
        theirs = masked_lm_tensors(config.family, (name for name, _ in head.named_parameters()), stored)
        missing = sorted(name for name in theirs.values() if name not in stored)
        if missing:
            raise ValueError(f"checkpoint {path} is a masked LM but lacks its head: {', '.join(missing)}")
        tensors = {ours: checkpoint.get_tensor(name) for ours, name in theirs.items()}
    expected = dict(head.named_parameters())
    wrong = [
        f"{theirs[name]} {tuple(t.shape)} (expected {tuple(expected[name].shape)})"
        for name, t in tensors.items()
        if t.shape != expected[name].shape
    ]
    if wrong:
        raise ValueError(f"checkpoint {path}: masked-LM head of the wrong shape: {', '.join(wrong)}")
    assign(head, tensors, dtype)
    return head.eval().requires_grad_(False)


def load_linear(path: Path, in_features: int, out_features: int | None = None) -> nn.Linear:
    """A linear layer saved as a torch state dict (``weight``, ``bias``), as BGE-M3 keeps its sparse and ColBERT
    layers (``out_features`` as stored when None); read with weights_only, so that no code in the file runs.
    ValueError naming what is wrong."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a pickle refused, a truncated file
        raise ValueError(f"{path} is not a readable state dict: {error}") from error
    if out_features is None:
        weight = state.get("weight") if isinstance(state, dict) else None
        out_features = int(weight.shape[0]) if isinstance(weight, Tensor) and weight.dim() == 2 else 1
    layer = nn.Linear(in_features, out_features)
    expected = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    found = {name: tuple(t.shape) for name, t in state.items()} if isinstance(state, dict) else None
    if found != expected:
        raise ValueError(f"{path} holds {found}, expected {expected}")
    with torch.no_grad():
        layer.weight.copy_(state["weight"])
        layer.bias.copy_(state["bias"])
    return layer.eval().requires_grad_(False)
