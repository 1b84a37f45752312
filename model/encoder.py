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


class Attended(NamedTuple):
    values: Tensor  # (B, H, T, Dh): the attention-weighted values of each head
    attention: Tensor  # (B, H, T, T): the attention probabilities


class HeadSteps(NamedTuple):
    """One head of one layer on one text of T tokens, step by step (the neuron view)."""

    queries: Tensor  # (T, Dh), after the rotation for rotary models
    keys: Tensor  # (T, Dh), likewise
    values: Tensor  # (T, Dh)
    scale: float  # what q · k is multiplied by: 1/√Dh
    scores: Tensor  # (T, T): scale · q kᵀ (+ the position bias), before masking and softmax
    attention: Tensor  # (T, T): softmax of the masked scores
    context: Tensor  # (T, Dh): attention · values


HEAD_STEP_ARRAYS = tuple(name for name in HeadSteps._fields if name != "scale")  # the tensors among the steps


class AttentionResult(NamedTuple):
    values: Tensor  # (B, T, D) (or the (N, D) packed tokens): what a layer or its attention outputs
    attention: Tensor | None  # (B, H, T, T), only when asked for
    value_norms: Tensor | None = None  # (B, H, T): ‖f_h(x_j)‖ of every head and key, only when asked for


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


def local_window_mask(length: int, window: int, device: torch.device) -> Tensor:
    """ModernBERT's sliding window: query i sees key j when |i − j| ≤ window // 2. (1, 1, T, T) boolean."""
    position = torch.arange(length, device=device)
    return ((position[None, :] - position[:, None]).abs() <= window // 2)[None, None]  # (1, 1, T, T)


def padding_mask(attention_mask: Tensor, causal: bool = False) -> Tensor:
    """Boolean attention mask from a (B, T) 0/1 padding mask: keys that are padding get no weight."""
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        T = attention_mask.size(1)
        future = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()  # (T, T)
        mask = mask & future  # (B, 1, T, T): query i sees keys j ≤ i
    return mask


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
) -> Attended:
    """softmax(q kᵀ / √Dh + bias, masked) v, returning the weighted values and the attention probabilities."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, T)
    if bias is not None:
        scores = scores + bias  # (1|B, H, T, T): a position bias (MPNet)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    attention = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (B, H, T, T), rows sum to 1
    return Attended(attention @ v, attention)  # (B, H, T, Dh), (B, H, T, T)


def rotary_angles(length: int, head_dim: int, base: float, device: torch.device | None = None) -> Tensor:
    """θ[pos, i] = pos / base^(2i/Dh): the seeds' sinusoid frequencies, as rotation angles. (T, Dh/2), float32."""
    position = torch.arange(length, dtype=torch.float64, device=device).unsqueeze(1)  # (T, 1)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim  # (Dh/2,)
    frequency = 1.0 / torch.pow(base, exponents)  # (Dh/2,)
    return (position * frequency).to(torch.float32)  # (T, Dh/2)


def rotate(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate each pair (x[i], x[i + Dh/2]) of every head vector by its angle (rotary position embedding).

    x is (B, H, T, Dh), angles (T, Dh/2).
    """
    half = x.size(-1) // 2
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, Dh/2)
    x1, x2 = x[..., :half], x[..., half:]  # 2 × (B, H, T, Dh/2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (B, H, T, Dh)


def relative_position_buckets(length: int, n_buckets: int, max_distance: int, device: torch.device) -> Tensor:
    """MPNet's (T5's bidirectional) buckets of the relative distance j − i: exact for small distances,
    logarithmic up to ``max_distance``, one bucket set per direction. (T, T) int64."""
    position = torch.arange(length, device=device)
    relative = position[None, :] - position[:, None]  # (T, T): key j − query i
    half = n_buckets // 2
    bucket = (relative > 0).long() * half  # keys after the query use the upper half
    distance = relative.abs()
    exact = half // 2
    logarithmic = (
        exact
        + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)).long()
    )
    logarithmic = logarithmic.clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, logarithmic)  # (T, T)


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

    def value_norms(self, v: Tensor) -> Tensor:
        """‖f_h(x_j)‖ with f_h(x) = (x W_V^h + b_V^h) W_O^h, the vector head h adds to the output for key j
        when it puts all its weight there (Kobayashi et al. 2020; the output bias excluded).

        v is (B, H, T, Dh), the heads' values x W_V^h + b_V^h; → (B, H, T).
        """
        W_O = self.out.weight.view(self.d_model, self.n_heads, self.head_dim)  # (D, H, Dh): head h's input columns
        transformed = torch.einsum("bhtd,ehd->bhte", v, W_O)  # (B, H, T, D): f_h(x_j) for every head and key
        return torch.linalg.vector_norm(transformed.float(), dim=-1)  # (B, H, T)

    def head_steps(
        self,
        x: Tensor,
        head: int,
        mask: Tensor | None = None,
        position_bias: Tensor | None = None,
        angles: Tensor | None = None,
    ) -> HeadSteps:
        """One head's computation on one text, step by step, as the seeds write it: x (T, D) is the layer's
        attention input; the scores are scale · q kᵀ (+ the position bias), before masking and softmax."""
        Dh = self.head_dim
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)  # 3 × (T, D)
        columns = slice(head * Dh, (head + 1) * Dh)
        q, k, v = q[:, columns], k[:, columns], v[:, columns]  # 3 × (T, Dh): the head's slices
        if angles is not None:
            q, k = rotate(q, angles), rotate(k, angles)  # (T, Dh), rotated by position
        scale = 1.0 / math.sqrt(Dh)
        scores = q @ k.T / math.sqrt(Dh)  # (T, T): omega, scaled (the same arithmetic as the attention path)
        if position_bias is not None:
            scores = scores + position_bias[0, head]  # (T, T)
        masked = scores if mask is None else scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        attention = F.softmax(masked, dim=-1, dtype=torch.float32).to(q.dtype)  # (T, T), rows sum to 1
        return HeadSteps(q, k, v, scale, scores, attention, attention @ v)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        position_bias: Tensor | None = None,
        angles: Tensor | None = None,
        need_value_norms: bool = False,
    ) -> AttentionResult:
        """x is (B, T, D), or with ``packing`` the (N, D) real tokens alone (and so is the result).

        ``position_bias`` (1, H, T, T) is added to the scores; with ``angles`` (T, Dh/2) q and k are rotated.
        With ``need_value_norms`` the result also holds ``value_norms`` (explicit path only).
        """
        qkv = self.qkv(x)  # (B, T, 3D) or (N, 3D)
        if packing is not None:
            qkv = packing.unpack(qkv)  # (B, T, 3D)
        B, T, D = qkv.size(0), qkv.size(1), self.d_model
        q, k, v = qkv.split(D, dim=-1)  # 3 × (B, T, D)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        if angles is not None:
            q, k = rotate(q, angles), rotate(k, angles)  # (B, H, T, Dh)
        if need_weights:
            values, attention = scaled_dot_product_attention(
                q, k, v, mask, position_bias
            )  # (B, H, T, Dh), (B, H, T, T)
        else:
            # The fused kernel: same arithmetic, no (T, T) matrix kept.
            attn_mask = mask
            if position_bias is not None:  # one additive mask: the bias, −∞ where the mask forbids
                attn_mask = position_bias.to(q.dtype)
                if mask is not None:
                    attn_mask = attn_mask.masked_fill(~mask, float("-inf"))  # (B, H, T, T)
            values, attention = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask), None  # (B, H, T, Dh)
        norms = self.value_norms(v) if need_value_norms else None  # (B, H, T) | None
        values = values.transpose(1, 2).reshape(B, T, D)  # (B, T, D): heads concatenated
        if packing is not None:
            values = packing.pack(values)  # (N, D)
        return AttentionResult(self.out(values), attention, norms)  # (B, T, D) or (N, D)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W₂ act(W₁ x + b₁) + b₂, applied to every token alike.

    With ``glu`` W₁ is twice as wide and its second half gates the first: W₂ (act(x W₁ₐ) ⊙ x W₁ᵦ) (GeGLU).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", glu: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.glu = glu
        self.expand = nn.Linear(d_model, 2 * d_ff if glu else d_ff, bias=bias)
        self.contract = nn.Linear(d_ff, d_model, bias=bias)
        if activation == "gelu":
            self.activation: nn.Module = nn.GELU()
        elif activation == "gelu_tanh":
            self.activation = nn.GELU(approximate="tanh")
        elif activation == "relu":
            self.activation = nn.ReLU()
        else:
            raise ValueError(f"activation must be gelu, gelu_tanh or relu, got {activation!r}")

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.expand(x)  # (B, T, F) or (B, T, 2F)
        if self.glu:
            value, gate = hidden.chunk(2, dim=-1)  # 2 × (B, T, F)
            return self.contract(self.activation(value) * gate)  # (B, T, D)
        return self.contract(self.activation(hidden))  # (B, T, F) → (B, T, D)


def layer_norm(config: EncoderConfig, width: int | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(width or config.d_model, eps=config.layer_norm_eps, bias=config.bias)


class EncoderLayer(nn.Module):
    """One encoder block.

    Post-LN, as in BERT and the paper: x = LN(x + Attn(x)); x = LN(x + FFN(x)).
    Pre-LN (``pre_norm``, ModernBERT): x = x + Attn(LN(x)); x = x + FFN(LN(x)); the first layer's input
    is already normalised by the embeddings, so its attention norm is the identity.
    """

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.local = config.is_local(index)  # attends within a sliding window
        self.attention = MultiHeadAttention(config.d_model, config.n_heads, bias=config.bias)
        self.attention_norm: nn.Module = nn.Identity() if config.pre_norm and index == 0 else layer_norm(config)
        self.feed_forward = PositionwiseFeedForward(
            config.d_model, config.d_ff, config.activation, glu=config.glu, bias=config.bias
        )
        self.feed_forward_norm = layer_norm(config)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        position_bias: Tensor | None = None,
        angles: Tensor | None = None,
        need_value_norms: bool = False,
    ) -> AttentionResult:
        if self.pre_norm:
            attended, attention, norms = self.attention(
                self.attention_norm(x), mask, need_weights, packing, position_bias, angles, need_value_norms
            )  # like x, (B, H, T, T) | None, (B, H, T) | None
            x = x + attended  # (B, T, D)
            x = x + self.feed_forward(self.feed_forward_norm(x))  # (B, T, D)
            return AttentionResult(x, attention, norms)
        attended, attention, norms = self.attention(
            x, mask, need_weights, packing, position_bias, angles, need_value_norms
        )
        x = self.attention_norm(x + attended)  # (B, T, D)
        x = self.feed_forward_norm(x + self.feed_forward(x))  # (B, T, D)
        return AttentionResult(x, attention, norms)


class Embeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm: the input of the first layer.

    Positions: a learned table (BERT; RoBERTa and MPNet count real tokens from the padding index + 1),
    the fixed sinusoid, or none here (rotary positions act inside attention). Segments only where the
    family has them. ELECTRA's narrower embeddings are projected up to D at the end.
    """

    sinusoid: Tensor  # (max_positions, D), a buffer, when the positions are the fixed sinusoid

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        E = config.width
        self.token = nn.Embedding(config.vocab_size, E)
        self.segment = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size > 0 else None
        self.norm = layer_norm(config, E)
        self.position: nn.Embedding | None = None
        if config.position_embedding in ("learned", "learned_offset", "relative_buckets"):
            self.position = nn.Embedding(config.max_positions, E)
        elif config.position_embedding == "sinusoidal":
            # Computed once and kept with the module (not a weight: nothing to load).
            sinusoid = sinusoidal_positional_encoding(config.max_positions, E, config.sinusoid_base)
            self.register_buffer("sinusoid", sinusoid, persistent=False)  # (max_positions, E)
        self.project = nn.Linear(E, config.d_model) if config.d_model != E else None
        # Positions count from the padding index + 1 (RoBERTa, MPNet), so fewer of them fit.
        self.offset = config.position_embedding in ("learned_offset", "relative_buckets")
        self.max_length = config.max_positions - (config.pad_token_id + 1 if self.offset else 0)
        self.two_segments = config.type_vocab_size > 1  # else every token takes segment 0 (RoBERTa's one row)

    def position_table(self) -> Tensor | None:
        """The (max_positions, E) position encodings this model adds to its tokens; None for rotary."""
        if self.position is not None:
            return self.position.weight
        if self.config.position_embedding == "sinusoidal":
            return self.sinusoid
        return None

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        T = input_ids.size(1)
        if self.max_length < T:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.max_length} positions")
        x = self.token(input_ids)  # (B, T, E)
        segment = self.segment
        if segment is not None:
            x = x + segment(token_type_ids if self.two_segments else torch.zeros_like(token_type_ids))  # (B, T, E)
        if self.offset:
            assert self.position is not None
            real = attention_mask.long()  # (B, T)
            positions = real.cumsum(dim=1) * real + self.config.pad_token_id  # (B, T): pad, pad + 1, …
            x = x + self.position(positions)  # (B, T, E)
        else:
            table = self.position_table()
            if table is not None:
                x = x + table[:T].to(x.dtype)  # (B, T, E) + (T, E)
        x = self.norm(x)  # (B, T, E)
        return self.project(x) if self.project is not None else x  # (B, T, D)


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, T, D): output of the last layer computed
    hidden_states: list[Tensor] | None = None  # N + 1 × (B, T, D): [0] embeddings, [l] output of layer l
    attentions: list[Tensor] | None = None  # N × (B, H, T, T): attention probabilities of each layer
    value_norms: list[Tensor] | None = None  # N × (B, H, T): ‖f_h(x_j)‖ of each layer (MultiHeadAttention.value_norms)


class Encoder(nn.Module):
    """Embeddings followed by N encoder layers (and, pre-LN, a final norm).

    Where the family has them, what every layer shares is made once per pass here: MPNet's relative
    position bias, ModernBERT's rotation angles (one set per base) and its sliding-window mask.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.n_layers))
        # MPNet: one learned bias per (bucket of relative distance, head), shared by every layer.
        self.relative_bias = (
            nn.Embedding(config.relative_buckets, config.n_heads) if config.relative_buckets > 0 else None
        )
        self.final_norm = layer_norm(config) if config.pre_norm else None
        self.local_layers = [config.is_local(i) for i in range(config.n_layers)]  # which attend within a window

    def position_bias(self, length: int, device: torch.device) -> Tensor | None:
        """MPNet's bias on the scores, (1, H, T, T); None for other families."""
        if self.relative_bias is None:
            return None
        buckets = relative_position_buckets(
            length, self.config.relative_buckets, self.config.relative_max_distance, device
        )  # (T, T)
        return self.relative_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)

    def shared(
        self, attention_mask: Tensor, causal: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, dict[bool, Tensor | None]]:
        """What every layer of a pass shares: the mask, the local layers' mask, the position bias and the
        rotation angles of the global (False) and local (True) layers."""
        config = self.config
        T, device = attention_mask.size(1), attention_mask.device
        mask = padding_mask(attention_mask, causal)  # (B, 1, 1|T, T)
        local_mask = mask & local_window_mask(T, config.local_window, device) if config.local_window else mask
        position_bias = self.position_bias(T, device)  # (1, H, T, T) | None
        angles: dict[bool, Tensor | None] = {False: None, True: None}  # rotation angles of global, local layers
        if config.position_embedding == "rotary":
            angles[False] = rotary_angles(T, config.head_dim, config.rope_theta, device)  # (T, Dh/2)
            angles[True] = rotary_angles(T, config.head_dim, config.local_rope_theta, device)
        return mask, local_mask, position_bias, angles

    def head_steps(self, input_ids: Tensor, token_type_ids: Tensor, layer: int, head: int) -> HeadSteps:
        """One head of one layer on one text (input ids (1, T), no padding), step by step: the layers below run
        as usual, then that layer's attention input goes through MultiHeadAttention.head_steps."""
        attention_mask = torch.ones_like(input_ids)
        below = self(input_ids, attention_mask, token_type_ids, n_layers=layer).last_hidden_state  # (1, T, D)
        block = self.layers[layer]
        assert isinstance(block, EncoderLayer)
        x = block.attention_norm(below) if block.pre_norm else below  # (1, T, D): the attention's input
        mask, local_mask, position_bias, angles = self.shared(attention_mask)
        local = self.local_layers[layer]
        return block.attention.head_steps(
            x[0], head, (local_mask if local else mask)[0, 0], position_bias, angles[local]
        )

    def forward(
        self,
        input_ids: Tensor,  # (B, T) token ids
        attention_mask: Tensor | None = None,  # (B, T) 1 for real tokens, 0 for padding
        token_type_ids: Tensor | None = None,  # (B, T) segment ids
        *,
        return_hidden_states: bool = False,  # keep every layer's output, embeddings first
        return_attentions: bool = False,  # keep every layer's attention probabilities (explicit path)
        return_value_norms: bool = False,  # and the norms of every head's transformed values (with attentions)
        causal: bool = False,  # also hide future positions (the decoder mask of the paper)
        n_layers: int | None = None,  # stop after this many layers (all by default)
        pack: bool = True,  # skip the padding (the fast path); False computes it, masked (what a CUDA graph records)
    ) -> EncoderOutput:
        config = self.config
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        n_layers = config.n_layers if n_layers is None else n_layers
        if not 0 <= n_layers <= config.n_layers:
            raise ValueError(f"n_layers must be between 0 and {config.n_layers}, got {n_layers}")

        mask, local_mask, position_bias, angles = self.shared(attention_mask, causal)

        x = self.embeddings(input_ids, token_type_ids, attention_mask)  # (B, T, D)
        # Fast path with padding: per-token work on the real tokens only (padded rows come back as zeros).
        skip = pack and not return_attentions and not bool(attention_mask.all())
        packing = Packing.from_mask(attention_mask) if skip else None
        if packing is not None:
            x = packing.pack(x)  # (N, D)
        unpack = packing.unpack if packing is not None else (lambda t: t)
        hidden_states = [unpack(x)] if return_hidden_states else None
        attentions: list[Tensor] | None = [] if return_attentions else None
        value_norms: list[Tensor] | None = [] if return_value_norms else None
        if return_value_norms and not return_attentions:
            raise ValueError("return_value_norms needs return_attentions (the explicit attention path)")
        for index, layer in enumerate(self.layers[:n_layers]):
            local = self.local_layers[index]
            x, attention, norms = layer(
                x,
                local_mask if local else mask,
                return_attentions,
                packing,
                position_bias,
                angles[local],
                return_value_norms,
            )  # (B, T, D) | (N, D), (B, H, T, T) | None, (B, H, T) | None
            if hidden_states is not None:
                hidden_states.append(unpack(x))
            if attentions is not None:
                attentions.append(attention)
            if value_norms is not None:
                value_norms.append(norms)
        if self.final_norm is not None and n_layers == config.n_layers:
            x = self.final_norm(x)  # the encoder's output is normalised once more, after the last layer
            if hidden_states is not None:
                hidden_states[-1] = unpack(x)
        return EncoderOutput(unpack(x), hidden_states, attentions, value_norms)
