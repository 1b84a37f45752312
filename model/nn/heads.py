"""Heads on the encoder's last hidden state (B, T, D): sequence classification, and the few rows of a causal
language model's head that a yes/no reranker reads.

Every family's classification head is the same few steps with its own choices: pool (the first token,
ModernBERT's optional mean, or the decoders' last real token), then, for the encoders, a dense D → D layer and
an activation (tanh for BERT's pooler, RoBERTa, MPNet; GELU for ELECTRA and DeBERTa's pooler; ReLU for
DistilBERT; ModernBERT's configured one, then a norm), and the output layer. They are loaded when a checkpoint
carries one (``…ForSequenceClassification``); cross-encoders for reranking are such heads with one label.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.nn.encoder import activation_module
from model.nn.pooling import last_token, pool
from model.spec.checkpoint import HeadConfig
from model.spec.config import EncoderConfig


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
            pooled = hidden[rows, last_token(attention_mask, input_ids, self.head.pad_token_id)]  # (B, D)
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
