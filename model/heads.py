"""Sequence-classification heads: the encoder's last hidden state (B, T, D) → logits (B, labels).

Every family's head is the same few steps with its own choices: pool (the first token, or ModernBERT's
optional mean), a dense D → D layer, an activation (tanh for BERT's pooler, RoBERTa, MPNet; GELU for
ELECTRA; ReLU for DistilBERT; ModernBERT's configured one, then a LayerNorm), and the output layer.
They are loaded when a checkpoint carries one (``…ForSequenceClassification``); cross-encoders for
reranking are such heads with one label.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from model.config import HF_ACTIVATIONS, EncoderConfig

HeadActivation = Literal["tanh", "gelu", "gelu_tanh", "relu"]
# What each family's head does after pooling, and its tensor names: ours → the checkpoint's.
HEAD_ACTIVATIONS: dict[str, HeadActivation] = {
    "bert": "tanh",
    "roberta": "tanh",
    "xlm-roberta": "tanh",
    "camembert": "tanh",
    "mpnet": "tanh",
    "electra": "gelu",
    "distilbert": "relu",
}
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
}


@dataclass(frozen=True)
class HeadConfig:
    labels: tuple[str, ...]  # id2label, in id order
    multi_label: bool = False  # problem_type multi_label_classification: a sigmoid per label, not a softmax
    pooling: Literal["first", "mean"] = "first"  # the first token ([CLS], <s>), or the mean (ModernBERT's option)
    activation: HeadActivation = "tanh"
    dense_bias: bool = True
    norm: bool = False  # ModernBERT: a LayerNorm after the activation

    @classmethod
    def from_hf(cls, hf: dict[str, Any], config: EncoderConfig) -> HeadConfig | None:
        """The head of a ``…ForSequenceClassification`` config.json; None for other checkpoints."""
        architectures = hf.get("architectures") or []
        if not any(name.endswith("ForSequenceClassification") for name in architectures):
            return None
        id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2)))}
        labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
        multi_label = hf.get("problem_type") == "multi_label_classification"
        if config.family == "modernbert":
            activation = hf.get("classifier_activation", "gelu")
            if activation not in HF_ACTIVATIONS:
                raise ValueError(f"unsupported config field 'classifier_activation': {activation!r}")
            pooling = hf.get("classifier_pooling", "cls")
            if pooling not in ("cls", "mean"):
                raise ValueError(f"unsupported config field 'classifier_pooling': {pooling!r} (supported: cls, mean)")
            return cls(
                labels,
                multi_label,
                pooling="first" if pooling == "cls" else "mean",
                activation=HF_ACTIVATIONS[activation],
                dense_bias=bool(hf.get("classifier_bias", False)),
                norm=True,
            )
        return cls(labels, multi_label, activation=HEAD_ACTIVATIONS[config.family])


class SequenceClassificationHead(nn.Module):
    """pool → dense → activation (→ LayerNorm) → out: (B, T, D) → (B, labels)."""

    def __init__(self, config: EncoderConfig, head: HeadConfig) -> None:
        super().__init__()
        self.head = head
        self.dense = nn.Linear(config.d_model, config.d_model, bias=head.dense_bias)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias) if head.norm else None
        self.out = nn.Linear(config.d_model, len(head.labels))
        activations: dict[str, nn.Module] = {
            "tanh": nn.Tanh(),
            "gelu": nn.GELU(),
            "gelu_tanh": nn.GELU(approximate="tanh"),
            "relu": nn.ReLU(),
        }
        self.activation = activations[head.activation]

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        if self.head.pooling == "first":
            pooled = hidden[:, 0]  # (B, D)
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)  # (B, D)
        x = self.activation(self.dense(pooled))  # (B, D)
        if self.norm is not None:
            x = self.norm(x)
        return self.out(x)  # (B, labels)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Softmax over the labels; a sigmoid per label for a multi-label head, and for a head with one output
        (a cross-encoder's relevance, as sentence-transformers' CrossEncoder scores it)."""
        if self.head.multi_label or logits.size(-1) == 1:
            return torch.sigmoid(logits.float())
        return torch.softmax(logits.float(), dim=-1)


def head_names(config: EncoderConfig, head: SequenceClassificationHead) -> dict[str, str]:
    """Our head's parameter names → the checkpoint's tensor names."""
    parts = HEAD_TENSORS[config.family]
    names = {}
    for name, _ in head.named_parameters():
        module, _, kind = name.partition(".")  # dense.weight → dense, weight
        names[name] = f"{parts[module]}.{kind}"
    return names


def read_head_config(model_dir: Path, config: EncoderConfig) -> HeadConfig | None:
    path = Path(model_dir) / "config.json"
    return HeadConfig.from_hf(json.loads(path.read_text(encoding="utf-8")), config)
