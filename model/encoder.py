"""The transformer encoder, bottom-up: positions → attention → feed-forward → block → encoder.

Shape key: B batch, T tokens, D model width, H heads, Dh head width (D = H · Dh), F feed-forward width.

Masks are boolean, True where a query may attend to a key, broadcastable to (B, H, T, T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import EncoderConfig


class AttentionResult(NamedTuple):
    values: Tensor  # (B, H, T, Dh) or, from MultiHeadAttention, (B, T, D)
    attention: Tensor | None  # (B, H, T, T), only when asked for


def sinusoidal_positional_encoding(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d_model)), PE[pos, 2i+1] = cos(pos / base^(2i/d_model))."""
    if length < 1:
        raise ValueError(f"length must be at least 1, got {length}")
    if d_model < 2 or d_model % 2 != 0:
        raise ValueError(f"d_model must be a positive even number, got {d_model}")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite number greater than 1, got {base}")
    # float64 for the angles: positions in the thousands lose digits in float32.
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    denominator = torch.pow(base, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    pe = torch.zeros(length, d_model, dtype=torch.float64)  # (T, D)
    pe[:, 0::2] = torch.sin(position / denominator)  # even columns: sine
    pe[:, 1::2] = torch.cos(position / denominator)  # odd columns: cosine
    return pe.to(torch.float32)


def padding_mask(attention_mask: Tensor, causal: bool = False) -> Tensor:
    """Boolean attention mask from a (B, T) 0/1 padding mask: keys that are padding get no weight."""
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        T = attention_mask.size(1)
        future = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()  # (T, T)
        mask = mask & future  # (B, 1, T, T): query i sees keys j ≤ i
    return mask


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> AttentionResult:
    """softmax(q kᵀ / √Dh, masked) v, returning the weighted values and the attention probabilities."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    attention = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (B, H, T, T), rows sum to 1
    return AttentionResult(attention @ v, attention)  # (B, H, T, Dh), (B, H, T, T)


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a padded (B, T) batch sit, so that per-token work skips the padding.

    Everything in a layer but the attention core acts on each token alone, so the fast path runs it on
    the (N, D) real tokens only, N = number of real tokens, and scatters into the (B, T) layout just
    around the attention core.
    """

    index: Tensor  # (N,) flat positions b·T + t of the real tokens
    batch: int  # B
    length: int  # T

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> Packing:
        B, T = attention_mask.shape
        return cls(attention_mask.flatten().nonzero().squeeze(1), B, T)

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) → (N, ...)"""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) → (B, T, ...), zeros where the padding is."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out.index_copy_(0, self.index, x)
        return out.view(self.batch, self.length, *x.shape[1:])


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    ``qkv`` holds [W_q; W_k; W_v] stacked along the output axis (as torch.nn.MultiheadAttention's
    ``in_proj_weight``), so ``qkv(x)`` splits into q, k, v of width D, each then cut into H heads.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, packing: Packing | None = None
    ) -> AttentionResult:
        """x is (B, T, D), or with ``packing`` the (N, D) real tokens alone (and so is the result)."""
        qkv = self.qkv(x)  # (B, T, 3D) or (N, 3D)
        if packing is not None:
            qkv = packing.unpack(qkv)  # (B, T, 3D)
        B, T, D = qkv.size(0), qkv.size(1), self.d_model
        q, k, v = qkv.split(D, dim=-1)  # 3 × (B, T, D)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        if need_weights:
            values, attention = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, T)
        else:
            # The fused kernel: same arithmetic, no (T, T) matrix kept.
            values, attention = F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None  # (B, H, T, Dh)
        values = values.transpose(1, 2).reshape(B, T, D)  # (B, T, D): heads concatenated
        if packing is not None:
            values = packing.pack(values)  # (N, D)
        return AttentionResult(self.out(values), attention)  # (B, T, D) or (N, D)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W₂ act(W₁ x + b₁) + b₂, applied to every token alike."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu") -> None:
        super().__init__()
        self.expand = nn.Linear(d_model, d_ff)
        self.contract = nn.Linear(d_ff, d_model)
        if activation == "gelu":
            self.activation: nn.Module = nn.GELU()
        elif activation == "gelu_tanh":
            self.activation = nn.GELU(approximate="tanh")
        elif activation == "relu":
            self.activation = nn.ReLU()
        else:
            raise ValueError(f"activation must be gelu, gelu_tanh or relu, got {activation!r}")

    def forward(self, x: Tensor) -> Tensor:
        return self.contract(self.activation(self.expand(x)))  # (B, T, D) → (B, T, F) → (B, T, D)


class EncoderLayer(nn.Module):
    """One encoder block, post-LN as in BERT and the paper: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(config.d_model, config.n_heads)
        self.attention_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = PositionwiseFeedForward(config.d_model, config.d_ff, config.activation)
        self.feed_forward_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, packing: Packing | None = None
    ) -> AttentionResult:
        attended, attention = self.attention(x, mask, need_weights, packing)  # like x, (B, H, T, T) | None
        x = self.attention_norm(x + attended)  # (B, T, D)
        x = self.feed_forward_norm(x + self.feed_forward(x))  # (B, T, D)
        return AttentionResult(x, attention)


class Embeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm: the input of the first layer."""

    sinusoid: Tensor  # (max_positions, D), a buffer, when the positions are the fixed sinusoid

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        self.segment = nn.Embedding(config.type_vocab_size, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if config.position_embedding == "learned":
            self.position: nn.Embedding | None = nn.Embedding(config.max_positions, config.d_model)
        else:
            self.position = None
            # Computed once and kept with the module (not a weight: nothing to load).
            sinusoid = sinusoidal_positional_encoding(config.max_positions, config.d_model, config.sinusoid_base)
            self.register_buffer("sinusoid", sinusoid, persistent=False)  # (max_positions, D)

    def position_table(self) -> Tensor:
        """The (max_positions, D) position encodings this model adds to its tokens."""
        return self.position.weight if self.position is not None else self.sinusoid

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        T = input_ids.size(1)
        if self.config.max_positions < T:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.config.max_positions} positions")
        x = self.token(input_ids) + self.segment(token_type_ids)  # (B, T, D)
        x = x + self.position_table()[:T].to(x.dtype)  # (B, T, D) + (T, D)
        return self.norm(x)  # (B, T, D)


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, T, D): output of the last layer computed
    hidden_states: list[Tensor] | None = None  # N + 1 × (B, T, D): [0] embeddings, [l] output of layer l
    attentions: list[Tensor] | None = None  # N × (B, H, T, T): attention probabilities of each layer


class Encoder(nn.Module):
    """Embeddings followed by N encoder layers."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))

    def forward(
        self,
        input_ids: Tensor,  # (B, T) token ids
        attention_mask: Tensor | None = None,  # (B, T) 1 for real tokens, 0 for padding
        token_type_ids: Tensor | None = None,  # (B, T) segment ids
        *,
        return_hidden_states: bool = False,  # keep every layer's output, embeddings first
        return_attentions: bool = False,  # keep every layer's attention probabilities (explicit path)
        causal: bool = False,  # also hide future positions (the decoder mask of the paper)
        n_layers: int | None = None,  # stop after this many layers (all by default)
    ) -> EncoderOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        n_layers = self.config.n_layers if n_layers is None else n_layers
        if not 0 <= n_layers <= self.config.n_layers:
            raise ValueError(f"n_layers must be between 0 and {self.config.n_layers}, got {n_layers}")

        mask = padding_mask(attention_mask, causal)  # (B, 1, 1|T, T)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        # Fast path with padding: per-token work on the real tokens only (padded rows come back as zeros).
        packing = None if return_attentions or bool(attention_mask.all()) else Packing.from_mask(attention_mask)
        if packing is not None:
            x = packing.pack(x)  # (N, D)
        unpack = packing.unpack if packing is not None else (lambda t: t)
        hidden_states = [unpack(x)] if return_hidden_states else None
        attentions: list[Tensor] | None = [] if return_attentions else None
        for layer in self.layers[:n_layers]:
            x, attention = layer(x, mask, return_attentions, packing)  # (B, T, D) | (N, D), (B, H, T, T) | None
            if hidden_states is not None:
                hidden_states.append(unpack(x))
            if attentions is not None:
                attentions.append(attention)
        return EncoderOutput(last_hidden_state=unpack(x), hidden_states=hidden_states, attentions=attentions)
