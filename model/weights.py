"""Loading BERT-layout ``model.safetensors`` checkpoints into our Encoder.

The checkpoint's tensor names appear in this module's mapping table and nowhere else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from model.config import EncoderConfig
from model.encoder import Encoder
from model.heads import SequenceClassificationHead, head_names

logger = logging.getLogger(__name__)

# Our parameter name → the checkpoint tensor(s) it is made of, one table per family. Several names are
# concatenated along the output axis in the order given (q, k, v fused into one projection). "{i}" is
# the layer index. A table may name parameters a given config does not have (biases, the segment
# table, ELECTRA's projection): only those the encoder has are loaded, and every one it has must be named.
BERT_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
    "embeddings.segment.weight": ("embeddings.token_type_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "embeddings.project.weight": ("embeddings_project.weight",),  # ELECTRA
    "embeddings.project.bias": ("embeddings_project.bias",),
    "layers.{i}.attention.qkv.weight": (
        "encoder.layer.{i}.attention.self.query.weight",
        "encoder.layer.{i}.attention.self.key.weight",
        "encoder.layer.{i}.attention.self.value.weight",
    ),
    "layers.{i}.attention.qkv.bias": (
        "encoder.layer.{i}.attention.self.query.bias",
        "encoder.layer.{i}.attention.self.key.bias",
        "encoder.layer.{i}.attention.self.value.bias",
    ),
    "layers.{i}.attention.out.weight": ("encoder.layer.{i}.attention.output.dense.weight",),
    "layers.{i}.attention.out.bias": ("encoder.layer.{i}.attention.output.dense.bias",),
    "layers.{i}.attention_norm.weight": ("encoder.layer.{i}.attention.output.LayerNorm.weight",),
    "layers.{i}.attention_norm.bias": ("encoder.layer.{i}.attention.output.LayerNorm.bias",),
    "layers.{i}.feed_forward.expand.weight": ("encoder.layer.{i}.intermediate.dense.weight",),
    "layers.{i}.feed_forward.expand.bias": ("encoder.layer.{i}.intermediate.dense.bias",),
    "layers.{i}.feed_forward.contract.weight": ("encoder.layer.{i}.output.dense.weight",),
    "layers.{i}.feed_forward.contract.bias": ("encoder.layer.{i}.output.dense.bias",),
    "layers.{i}.feed_forward_norm.weight": ("encoder.layer.{i}.output.LayerNorm.weight",),
    "layers.{i}.feed_forward_norm.bias": ("encoder.layer.{i}.output.LayerNorm.bias",),
}
DISTILBERT_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "layers.{i}.attention.qkv.weight": (
        "transformer.layer.{i}.attention.q_lin.weight",
        "transformer.layer.{i}.attention.k_lin.weight",
        "transformer.layer.{i}.attention.v_lin.weight",
    ),
    "layers.{i}.attention.qkv.bias": (
        "transformer.layer.{i}.attention.q_lin.bias",
        "transformer.layer.{i}.attention.k_lin.bias",
        "transformer.layer.{i}.attention.v_lin.bias",
    ),
    "layers.{i}.attention.out.weight": ("transformer.layer.{i}.attention.out_lin.weight",),
    "layers.{i}.attention.out.bias": ("transformer.layer.{i}.attention.out_lin.bias",),
    "layers.{i}.attention_norm.weight": ("transformer.layer.{i}.sa_layer_norm.weight",),
    "layers.{i}.attention_norm.bias": ("transformer.layer.{i}.sa_layer_norm.bias",),
    "layers.{i}.feed_forward.expand.weight": ("transformer.layer.{i}.ffn.lin1.weight",),
    "layers.{i}.feed_forward.expand.bias": ("transformer.layer.{i}.ffn.lin1.bias",),
    "layers.{i}.feed_forward.contract.weight": ("transformer.layer.{i}.ffn.lin2.weight",),
    "layers.{i}.feed_forward.contract.bias": ("transformer.layer.{i}.ffn.lin2.bias",),
    "layers.{i}.feed_forward_norm.weight": ("transformer.layer.{i}.output_layer_norm.weight",),
    "layers.{i}.feed_forward_norm.bias": ("transformer.layer.{i}.output_layer_norm.bias",),
}
MPNET_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "relative_bias.weight": ("encoder.relative_attention_bias.weight",),
    "layers.{i}.attention.qkv.weight": (
        "encoder.layer.{i}.attention.attn.q.weight",
        "encoder.layer.{i}.attention.attn.k.weight",
        "encoder.layer.{i}.attention.attn.v.weight",
    ),
    "layers.{i}.attention.qkv.bias": (
        "encoder.layer.{i}.attention.attn.q.bias",
        "encoder.layer.{i}.attention.attn.k.bias",
        "encoder.layer.{i}.attention.attn.v.bias",
    ),
    "layers.{i}.attention.out.weight": ("encoder.layer.{i}.attention.attn.o.weight",),
    "layers.{i}.attention.out.bias": ("encoder.layer.{i}.attention.attn.o.bias",),
    "layers.{i}.attention_norm.weight": ("encoder.layer.{i}.attention.LayerNorm.weight",),
    "layers.{i}.attention_norm.bias": ("encoder.layer.{i}.attention.LayerNorm.bias",),
    "layers.{i}.feed_forward.expand.weight": ("encoder.layer.{i}.intermediate.dense.weight",),
    "layers.{i}.feed_forward.expand.bias": ("encoder.layer.{i}.intermediate.dense.bias",),
    "layers.{i}.feed_forward.contract.weight": ("encoder.layer.{i}.output.dense.weight",),
    "layers.{i}.feed_forward.contract.bias": ("encoder.layer.{i}.output.dense.bias",),
    "layers.{i}.feed_forward_norm.weight": ("encoder.layer.{i}.output.LayerNorm.weight",),
    "layers.{i}.feed_forward_norm.bias": ("encoder.layer.{i}.output.LayerNorm.bias",),
}
MODERNBERT_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.tok_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.norm.weight",),
    "embeddings.norm.bias": ("embeddings.norm.bias",),
    "layers.{i}.attention.qkv.weight": ("layers.{i}.attn.Wqkv.weight",),  # already fused, [W_q; W_k; W_v]
    "layers.{i}.attention.qkv.bias": ("layers.{i}.attn.Wqkv.bias",),
    "layers.{i}.attention.out.weight": ("layers.{i}.attn.Wo.weight",),
    "layers.{i}.attention.out.bias": ("layers.{i}.attn.Wo.bias",),
    "layers.{i}.attention_norm.weight": ("layers.{i}.attn_norm.weight",),  # none in layer 0
    "layers.{i}.attention_norm.bias": ("layers.{i}.attn_norm.bias",),
    "layers.{i}.feed_forward.expand.weight": ("layers.{i}.mlp.Wi.weight",),  # [value; gate]
    "layers.{i}.feed_forward.expand.bias": ("layers.{i}.mlp.Wi.bias",),
    "layers.{i}.feed_forward.contract.weight": ("layers.{i}.mlp.Wo.weight",),
    "layers.{i}.feed_forward.contract.bias": ("layers.{i}.mlp.Wo.bias",),
    "layers.{i}.feed_forward_norm.weight": ("layers.{i}.mlp_norm.weight",),
    "layers.{i}.feed_forward_norm.bias": ("layers.{i}.mlp_norm.bias",),
    "final_norm.weight": ("final_norm.weight",),
    "final_norm.bias": ("final_norm.bias",),
}


@dataclass(frozen=True)
class Family:
    tensors: dict[str, tuple[str, ...]]
    prefixes: tuple[str, ...]  # what a task model (…ForMaskedLM, …ForSequenceClassification) puts before them
    ignored: tuple[str, ...]  # tensors of heads and poolers, not part of the encoder (after the prefix)


HEADS = ("pooler.", "cls.", "classifier.", "qa_outputs.", "lm_head.", "head.", "decoder.")
FAMILIES: dict[str, Family] = {
    "bert": Family(BERT_TENSORS, ("bert.",), HEADS),
    "roberta": Family(BERT_TENSORS, ("roberta.",), HEADS),
    "xlm-roberta": Family(BERT_TENSORS, ("roberta.",), HEADS),
    "camembert": Family(BERT_TENSORS, ("roberta.",), HEADS),
    "electra": Family(
        BERT_TENSORS,
        ("electra.",),
        (*HEADS, "generator_predictions.", "generator_lm_head.", "discriminator_predictions."),
    ),
    "distilbert": Family(
        DISTILBERT_TENSORS,
        ("distilbert.",),
        (*HEADS, "pre_classifier.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector."),
    ),
    "mpnet": Family(MPNET_TENSORS, ("mpnet.",), HEADS),
    "modernbert": Family(MODERNBERT_TENSORS, ("model.",), HEADS),
}
# Tensors an encoder checkpoint may carry that an encoder does not use: the position-id buffer older
# exports saved, and a sinusoidal position table that we compute instead of loading.
IGNORED_SUFFIXES = ("position_ids",)


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
        family = FAMILIES[encoder.config.family]
        prefix = next((p for p in family.prefixes if any(key.startswith(p) for key in stored)), "")
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

    with torch.no_grad():
        for name, tensor in tensors.items():
            ours[name].copy_(tensor)
    logger.debug("loaded %d tensors from %s", len(tensors), path)


def load_head(head: SequenceClassificationHead, config: EncoderConfig, path: Path) -> None:
    """Copy a sequence-classification head's tensors from the checkpoint, every name and shape checked."""
    names = head_names(config, head)
    ours = dict(head.named_parameters())
    with safe_open(str(path), framework="pt", device="cpu") as checkpoint:
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
    with torch.no_grad():
        for name, tensor in tensors.items():
            ours[name].copy_(tensor)
