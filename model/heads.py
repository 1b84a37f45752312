"""Heads on the encoder's last hidden state (B, T, D): sequence classification, and the few rows of a causal
language model's head that a yes/no reranker reads.

Every family's classification head is the same few steps with its own choices: pool (the first token,
ModernBERT's optional mean, or the decoders' last real token), then, for the encoders, a dense D → D layer and
an activation (tanh for BERT's pooler, RoBERTa, MPNet; GELU for ELECTRA and DeBERTa's pooler; ReLU for
DistilBERT; ModernBERT's configured one, then a norm), and the output layer. They are loaded when a checkpoint
carries one (``…ForSequenceClassification``); cross-encoders for reranking are such heads with one label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from model.config import DECODERS, HF_ACTIVATIONS, EncoderConfig
from model.encoder import activation_module
from model.pooling import pool

HeadActivation = Literal["tanh", "gelu", "gelu_tanh", "relu", "silu"]
# What each encoder family's head does after pooling (the decoders' has no dense layer).
HEAD_ACTIVATIONS: dict[str, HeadActivation] = {
    "bert": "tanh",
    "roberta": "tanh",
    "xlm-roberta": "tanh",
    "camembert": "tanh",
    "mpnet": "tanh",
    "electra": "gelu",
    "distilbert": "relu",
}


@dataclass(frozen=True)
class HeadConfig:
    labels: tuple[str, ...]  # id2label, in id order
    multi_label: bool = False  # problem_type multi_label_classification: a sigmoid per label, not a softmax
    # the first token ([CLS], <s>); the mean (ModernBERT's option); or, as transformers scores a decoder, the last
    # token whose id is not the config's pad_token_id (the last real token where the config names none)
    pooling: Literal["first", "mean", "last"] = "first"
    activation: HeadActivation = "tanh"
    dense: bool = True  # a dense D → D layer and the activation before the output (none in the decoders)
    dense_bias: bool = True
    norm: bool = False  # ModernBERT: a LayerNorm after the activation
    out_bias: bool = True  # the decoders' ``score`` has none
    pad_token_id: int | None = None  # the decoders: which id does not count as the last token

    @classmethod
    def from_hf(cls, hf: dict[str, Any], config: EncoderConfig) -> HeadConfig | None:
        """The head of a ``…ForSequenceClassification`` config.json; None for other checkpoints."""
        architectures = hf.get("architectures") or []
        if not any(name.endswith("ForSequenceClassification") for name in architectures):
            return None
        id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2)))}
        labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
        multi_label = hf.get("problem_type") == "multi_label_classification"
        if config.family in DECODERS:
            pad_token_id = hf.get("pad_token_id")
            return cls(labels, multi_label, pooling="last", dense=False, out_bias=False, pad_token_id=pad_token_id)
        if config.family == "deberta-v2":
            if hf.get("pooler_hidden_size", config.d_model) != config.d_model:
                raise ValueError(f"unsupported config field 'pooler_hidden_size': {hf['pooler_hidden_size']!r}")
            return cls(labels, multi_label, activation=_activation(hf, "pooler_hidden_act", "gelu"))
        if config.family == "modernbert":
            pooling = hf.get("classifier_pooling", "cls")
            if pooling not in ("cls", "mean"):
                raise ValueError(f"unsupported config field 'classifier_pooling': {pooling!r} (supported: cls, mean)")
            return cls(
                labels,
                multi_label,
                pooling="first" if pooling == "cls" else "mean",
                activation=_activation(hf, "classifier_activation", "gelu"),
                dense_bias=bool(hf.get("classifier_bias", False)),
                norm=True,
            )
        return cls(labels, multi_label, activation=HEAD_ACTIVATIONS[config.family])


def _activation(hf: dict[str, Any], field: str, default: str) -> HeadActivation:
    value = hf.get(field, default)
    if value not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported config field {field!r}: {value!r}")
    return HF_ACTIVATIONS[value]


def last_token(input_ids: Tensor, attention_mask: Tensor, pad_token_id: int | None) -> Tensor:
    """Each row's last real token that is not ``pad_token_id`` (transformers' rule for a decoder's score: a
    tokenizer whose end-of-text token is also its padding token has the token before it scored), the last real
    token where no such id is given or every token is one. (B, T) → (B,) positions."""
    position = torch.arange(input_ids.size(1), device=input_ids.device)  # (T,)
    real = attention_mask.bool()
    last_real = (position * real).argmax(-1)  # (B,)
    if pad_token_id is None:
        return last_real
    counted = real & (input_ids != pad_token_id)  # (B, T)
    return torch.where(counted.any(-1), (position * counted).argmax(-1), last_real)


class SequenceClassificationHead(nn.Module):
    """pool → (dense → activation (→ norm)) → out: (B, T, D) → (B, labels)."""

    def __init__(self, config: EncoderConfig, head: HeadConfig) -> None:
        super().__init__()
        self.head = head
        self.dense = nn.Linear(config.d_model, config.d_model, bias=head.dense_bias) if head.dense else None
        self.norm = nn.LayerNorm(config.d_model, config.layer_norm_eps, bias=config.norm_bias) if head.norm else None
        self.out = nn.Linear(config.d_model, len(head.labels), bias=head.out_bias)
        self.activation = activation_module(head.activation)

    def forward(self, hidden: Tensor, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        if self.head.pooling == "first":
            pooled = hidden[:, 0]  # (B, D)
        elif self.head.pooling == "last":
            rows = torch.arange(hidden.size(0), device=hidden.device)
            pooled = hidden[rows, last_token(input_ids, attention_mask, self.head.pad_token_id)]  # (B, D)
        else:
            pooled = pool(hidden, attention_mask, "mean")  # (B, D)
        x = pooled
        if self.dense is not None:
            x = self.activation(self.dense(x))  # (B, D)
        if self.norm is not None:
            x = self.norm(x)
        return self.out(x)  # (B, labels)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Softmax over the labels; a sigmoid per label for a multi-label head, and for a head with one output
        (a cross-encoder's relevance, as sentence-transformers' CrossEncoder scores it)."""
        if self.head.multi_label or logits.size(-1) == 1:
            return torch.sigmoid(logits.float())
        return torch.softmax(logits.float(), dim=-1)


class LanguageModelHead(nn.Module):
    """Some rows of a causal LM's output layer: the logits of a few tokens (a reranker's ``yes`` and ``no``),
    soft-capped as Gemma caps every logit (tanh(l / c) · c). (…, D) → (…, tokens)."""

    def __init__(self, weight: Tensor, softcap: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # (tokens, D)
        self.softcap = softcap

    def forward(self, hidden: Tensor) -> Tensor:
        logits = hidden @ self.weight.T  # (…, tokens)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# The masked-LM head's tensors in each family that has one here (after the checkpoint's encoder prefix is left as
# it is: these are top-level names): transform (dense D → D), norm, decoder bias; the decoder weight is the
# family's own or, tied, the token embeddings.
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


class MaskedLanguageModelHead(nn.Module):
    """A masked LM's head: dense → activation → norm → the vocabulary's logits, (…, D) → (…, V)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.activation = activation_module(config.activation)
        self.norm = nn.LayerNorm(config.d_model, config.layer_norm_eps)
        self.decoder = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(self.activation(self.dense(hidden))))  # (…, V)


@dataclass(frozen=True)
class YesNoTemplate:
    """How a yes/no reranker reads a (query, document) pair: Qwen3-Reranker's model card template. Its prefix and
    suffix are fixed; between them the instruction, the query and the document, which alone is cut to fit."""

    prefix: str = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix: str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    instruction: str = "Given a web search query, retrieve relevant passages that answer the query"

    def head(self, instruction: str, query: str) -> str:
        """What comes before the document between the prefix and the suffix."""
        return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: "

    def formatted(self, instruction: str, query: str, document: str) -> str:
        """The whole string the model reads."""
        return self.prefix + self.head(instruction, query) + document + self.suffix


YES_NO = YesNoTemplate()
