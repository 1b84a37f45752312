"""Loading ``model.safetensors`` checkpoints into our Encoder and its heads.

The checkpoint's tensor names appear in this module's mapping tables and nowhere else.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from model.checkpoint import MASKED_LM_TENSORS
from model.config import DECODERS, EncoderConfig
from model.encoder import Encoder
from model.heads import LanguageModelHead, MaskedLanguageModelHead, SequenceClassificationHead

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


DEBERTA_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),  # position_biased_input only
    "embeddings.segment.weight": ("embeddings.token_type_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "relative_embeddings.weight": ("encoder.rel_embeddings.weight",),
    "relative_norm.weight": ("encoder.LayerNorm.weight",),
    "relative_norm.bias": ("encoder.LayerNorm.bias",),
    "layers.{i}.attention.qkv.weight": (
        "encoder.layer.{i}.attention.self.query_proj.weight",
        "encoder.layer.{i}.attention.self.key_proj.weight",
        "encoder.layer.{i}.attention.self.value_proj.weight",
    ),
    "layers.{i}.attention.qkv.bias": (
        "encoder.layer.{i}.attention.self.query_proj.bias",
        "encoder.layer.{i}.attention.self.key_proj.bias",
        "encoder.layer.{i}.attention.self.value_proj.bias",
    ),
    **{name: parts for name, parts in BERT_TENSORS.items() if ".attention.qkv." not in name and ".{i}." in name},
}
# The decoders (Qwen2, Qwen3, Llama, Mistral): pre-norm layers; q, k and v fused as ours, gate and up likewise.
DECODER_TENSORS: dict[str, tuple[str, ...]] = {
    "embeddings.token.weight": ("embed_tokens.weight",),
    "layers.{i}.attention.qkv.weight": (
        "layers.{i}.self_attn.q_proj.weight",
        "layers.{i}.self_attn.k_proj.weight",
        "layers.{i}.self_attn.v_proj.weight",
    ),
    "layers.{i}.attention.qkv.bias": (
        "layers.{i}.self_attn.q_proj.bias",
        "layers.{i}.self_attn.k_proj.bias",
        "layers.{i}.self_attn.v_proj.bias",
    ),
    "layers.{i}.attention.out.weight": ("layers.{i}.self_attn.o_proj.weight",),
    "layers.{i}.attention.out.bias": ("layers.{i}.self_attn.o_proj.bias",),
    "layers.{i}.attention.query_norm.weight": ("layers.{i}.self_attn.q_norm.weight",),  # Qwen3, Gemma 3
    "layers.{i}.attention.key_norm.weight": ("layers.{i}.self_attn.k_norm.weight",),
    "layers.{i}.attention_norm.weight": ("layers.{i}.input_layernorm.weight",),
    "layers.{i}.feed_forward.expand.weight": ("layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.up_proj.weight"),
    "layers.{i}.feed_forward.expand.bias": ("layers.{i}.mlp.gate_proj.bias", "layers.{i}.mlp.up_proj.bias"),
    "layers.{i}.feed_forward.contract.weight": ("layers.{i}.mlp.down_proj.weight",),
    "layers.{i}.feed_forward.contract.bias": ("layers.{i}.mlp.down_proj.bias",),
    "layers.{i}.feed_forward_norm.weight": ("layers.{i}.post_attention_layernorm.weight",),  # before the MLP
    "final_norm.weight": ("norm.weight",),
}
# Gemma 3 norms each sublayer's input and output: its post_attention_layernorm follows the attention.
GEMMA3_TENSORS: dict[str, tuple[str, ...]] = {
    **DECODER_TENSORS,
    "layers.{i}.attention_output_norm.weight": ("layers.{i}.post_attention_layernorm.weight",),
    "layers.{i}.feed_forward_norm.weight": ("layers.{i}.pre_feedforward_layernorm.weight",),
    "layers.{i}.feed_forward_output_norm.weight": ("layers.{i}.post_feedforward_layernorm.weight",),
}


@dataclass(frozen=True)
class Family:
    tensors: dict[str, tuple[str, ...]]
    prefixes: tuple[str, ...]  # what a task model (…ForMaskedLM, …ForSequenceClassification) puts before them
    ignored: tuple[str, ...]  # tensors of heads and poolers, not part of the encoder (after the prefix)


HEADS = ("pooler.", "cls.", "classifier.", "qa_outputs.", "lm_head.", "head.", "decoder.")
DECODER = Family(DECODER_TENSORS, ("model.",), ("lm_head.", "score."))
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
    "deberta-v2": Family(DEBERTA_TENSORS, ("deberta.",), (*HEADS, "lm_predictions.", "mask_predictions.")),
    "qwen2": DECODER,
    "qwen3": DECODER,
    "llama": DECODER,
    "mistral": DECODER,
    "gemma3_text": Family(GEMMA3_TENSORS, ("model.",), ("lm_head.", "score.")),
}
# A sequence-classification head's parts (model/heads.py) → the checkpoint's names, per family.
CLASSIFIER_NAMES = {"dense": "classifier.dense", "out": "classifier.out_proj"}
HEAD_TENSORS: dict[str, dict[str, str]] = {
    "bert": {"dense": "bert.pooler.dense", "out": "classifier"},
    "roberta": CLASSIFIER_NAMES,
    "xlm-roberta": CLASSIFIER_NAMES,
    "camembert": CLASSIFIER_NAMES,
    "mpnet": CLASSIFIER_NAMES,
    "electra": CLASSIFIER_NAMES,
    "distilbert": {"dense": "pre_classifier", "out": "classifier"},
    "modernbert": {"dense": "head.dense", "norm": "head.norm", "out": "classifier"},
    "deberta-v2": {"dense": "pooler.dense", "out": "classifier"},
    **{family: {"out": "score"} for family in DECODERS},
}
# Tensors an encoder checkpoint may carry that an encoder does not use: the position-id buffer older
# exports saved, and a sinusoidal position table that we compute instead of loading.
IGNORED_SUFFIXES = ("position_ids",)
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
    if n_parts == 3 and name.endswith((".attention.qkv.weight", ".attention.qkv.bias")):
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
    parts = HEAD_TENSORS[config.family]
    names = {}
    for name, _ in head.named_parameters():
        module, _, kind = name.partition(".")  # dense.weight → dense, weight
        names[name] = f"{parts[module]}.{kind}"
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
        prefix = next((p for p in family.prefixes if any(key.startswith(p) for key in stored)), "")
        embeddings = prefix + family.tensors["embeddings.token.weight"][0]
        name = "lm_head.weight" if "lm_head.weight" in stored else (embeddings if tied else None)
        if name is None or name not in stored:
            raise ValueError(f"checkpoint {path} is a causal LM but holds no lm_head.weight (and its head is not tied)")
        table = checkpoint.get_slice(name)
        rows, width = table.get_shape()
        if width != config.d_model or any(not 0 <= token < rows for token in tokens):
            raise ValueError(f"checkpoint {path}: {name} of shape {(rows, width)} does not fit tokens {list(tokens)}")
        weight = torch.stack([table[token] for token in tokens]).to(dtype)  # (len(tokens), D)
    return LanguageModelHead(weight, config.final_logit_softcapping)


def load_masked_lm_head(config: EncoderConfig, path: Path, dtype: torch.dtype) -> MaskedLanguageModelHead:
    """A ``…ForMaskedLM`` checkpoint's head (MASKED_LM_TENSORS), its decoder tied to the token embeddings where the
    checkpoint holds no weight of its own; ValueError naming what is missing or of the wrong shape."""
    names = MASKED_LM_TENSORS.get(config.family)
    if names is None:
        raise ValueError(f"no masked-LM head is read for model_type {config.family!r}")
    head = MaskedLanguageModelHead(config)
    family = FAMILIES[config.family]
    with open_checkpoint(path) as checkpoint:
        stored = set(checkpoint.keys())
        prefix = next((p for p in family.prefixes if any(key.startswith(p) for key in stored)), "")
        embeddings = prefix + family.tensors["embeddings.token.weight"][0]
        theirs = {
            "dense.weight": f"{names['dense']}.weight",
            "dense.bias": f"{names['dense']}.bias",
            "norm.weight": f"{names['norm']}.weight",
            "norm.bias": f"{names['norm']}.bias",
            "decoder.weight": f"{names['decoder']}.weight" if f"{names['decoder']}.weight" in stored else embeddings,
            "decoder.bias": names["bias"] if names["bias"] in stored else f"{names['decoder']}.bias",
        }
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
