"""The checkpoint's tensor names, every table of them, read without torch: what model/runtime/weights.py loads each of
our
parameters from, and what a model's card checks a checkpoint has (model/spec/card.py). Nowhere else names them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from model.spec.config import DECODERS

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

    def prefix(self, stored: set[str]) -> str:
        """The prefix the checkpoint's encoder tensors carry: a task model's, or none."""
        return next((p for p in self.prefixes if any(key.startswith(p) for key in stored)), "")

    def token_embeddings(self, stored: set[str]) -> str:
        """The checkpoint's token-embedding table, which a tied head reads as its weight."""
        return self.prefix(stored) + self.tensors["embeddings.token.weight"][0]


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


# A sequence-classification head's parts (model/nn/heads.py) → the checkpoint's names, per family.
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


# The masked-LM head's parts (model/nn/heads.py) → the checkpoint's names, in each family that has one here (top-level
# names: the encoder's prefix is not before them): transform (dense D → D), norm, decoder, and the decoder's bias
# where the checkpoint keeps it apart (masked_lm_tensors).
MASKED_LM_TENSORS: dict[str, dict[str, str]] = {
    "bert": {
        "dense": "cls.predictions.transform.dense",
        "norm": "cls.predictions.transform.LayerNorm",
        "decoder": "cls.predictions.decoder",
        "bias": "cls.predictions.bias",
    },
    "distilbert": {
        "dense": "vocab_transform",
        "norm": "vocab_layer_norm",
        "decoder": "vocab_projector",
        "bias": "vocab_projector.bias",
    },
    "roberta": {
        "dense": "lm_head.dense",
        "norm": "lm_head.layer_norm",
        "decoder": "lm_head.decoder",
        "bias": "lm_head.bias",
    },
}

MASKED_LM_TENSORS["xlm-roberta"] = MASKED_LM_TENSORS["camembert"] = MASKED_LM_TENSORS["roberta"]
MASKED_LM_FAMILIES = tuple(MASKED_LM_TENSORS)
# Our fused projections whose checkpoint parts are q, k and v, each of its own width under grouped-query attention.
QKV = (".attention.qkv.weight", ".attention.qkv.bias")
# A …ForCausalLM checkpoint's LM head, unless it is tied to the token embeddings.
LM_HEAD = "lm_head.weight"


def head_tensors(parts: dict[str, str], ours: Iterable[str]) -> dict[str, str]:
    """Our head's parameters (``dense.weight``, …) → the checkpoint's tensors, by a table of its parts' names."""
    names = {}
    for name in ours:
        part, _, kind = name.partition(".")  # dense.weight → dense, weight
        names[name] = f"{parts[part]}.{kind}"
    return names


def masked_lm_tensors(family: str, ours: Iterable[str], stored: set[str]) -> dict[str, str]:
    """Our masked-LM head's parameters → the checkpoint's tensors (MASKED_LM_TENSORS): the decoder's weight is the
    family's own or, where the checkpoint holds none, the token embeddings it is tied to; its bias is the one kept
    apart where there is one."""
    parts = MASKED_LM_TENSORS[family]
    names = head_tensors(parts, ours)
    if names["decoder.weight"] not in stored:
        names["decoder.weight"] = FAMILIES[family].token_embeddings(stored)
    if parts["bias"] in stored:
        names["decoder.bias"] = parts["bias"]
    return names
