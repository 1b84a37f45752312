"""Loading BERT-layout ``model.safetensors`` checkpoints into our Encoder.

The checkpoint's tensor names appear in this module's mapping table and nowhere else.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from model.encoder import Encoder

logger = logging.getLogger(__name__)

# Our parameter name → the checkpoint tensor(s) it is made of. Several names are concatenated along
# the output axis in the order given (q, k, v fused into one projection). "{i}" is the layer index.
EMBEDDING_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
    "embeddings.segment.weight": ("embeddings.token_type_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
}
LAYER_TENSORS: dict[str, tuple[str, ...]] = {
    "attention.qkv.weight": (
        "attention.self.query.weight",
        "attention.self.key.weight",
        "attention.self.value.weight",
    ),
    "attention.qkv.bias": ("attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias"),
    "attention.out.weight": ("attention.output.dense.weight",),
    "attention.out.bias": ("attention.output.dense.bias",),
    "attention_norm.weight": ("attention.output.LayerNorm.weight",),
    "attention_norm.bias": ("attention.output.LayerNorm.bias",),
    "feed_forward.expand.weight": ("intermediate.dense.weight",),
    "feed_forward.expand.bias": ("intermediate.dense.bias",),
    "feed_forward.contract.weight": ("output.dense.weight",),
    "feed_forward.contract.bias": ("output.dense.bias",),
    "feed_forward_norm.weight": ("output.LayerNorm.weight",),
    "feed_forward_norm.bias": ("output.LayerNorm.bias",),
}
LAYER_PREFIX = "encoder.layer.{i}."
# Prefixes a task model (BertForMaskedLM, …) puts before the encoder's own names.
MODEL_PREFIXES = ("bert.",)
# Tensors an encoder checkpoint may carry that an encoder does not use: the pooler and task heads,
# and the position-id buffer older exports saved.
IGNORED_PREFIXES = ("pooler.", "cls.", "classifier.", "qa_outputs.")
IGNORED_SUFFIXES = ("position_ids",)


def checkpoint_names(encoder: Encoder) -> dict[str, tuple[str, ...]]:
    """For each of the encoder's parameters, the checkpoint tensors it is loaded from."""
    names = dict(EMBEDDING_TENSORS)
    if encoder.embeddings.position is None:
        del names["embeddings.position.weight"]  # sinusoidal positions are computed, not loaded
    for i in range(encoder.config.n_layers):
        prefix = LAYER_PREFIX.format(i=i)
        for ours, theirs in LAYER_TENSORS.items():
            names[f"layers.{i}.{ours}"] = tuple(prefix + name for name in theirs)
    return names


def load_weights(encoder: Encoder, path: Path) -> None:
    """Copy a safetensors checkpoint into ``encoder``, checking every name and shape first.

    Raises ValueError naming every missing tensor, unexpected tensor and wrong shape.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path} (expected a model.safetensors file)")
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as error:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from error

    with handle as checkpoint:
        stored = set(checkpoint.keys())
        prefix = next((p for p in MODEL_PREFIXES if any(key.startswith(p) for key in stored)), "")
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
            expected = tuple(ours[name].shape)
            part_shape = (expected[0] // len(keys), *expected[1:])
            loaded = [checkpoint.get_tensor(key) for key in keys]
            bad = [
                f"{key} {tuple(t.shape)} (expected {part_shape})"
                for key, t in zip(keys, loaded)
                if tuple(t.shape) != part_shape
            ]
            if bad:
                wrong_shape.extend(bad)
                continue
            tensors[name] = loaded[0] if len(loaded) == 1 else torch.cat(loaded, dim=0)

    unexpected = sorted(
        key
        for key in stored - used
        if not key.removeprefix(prefix).startswith(IGNORED_PREFIXES) and not key.endswith(IGNORED_SUFFIXES)
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

    with torch.no_grad():
        for name, tensor in tensors.items():
            ours[name].copy_(tensor)
    logger.debug("loaded %d tensors from %s", len(tensors), path)
