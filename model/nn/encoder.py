"""The transformer encoder, bottom-up: positions → norms → attention → feed-forward → block → encoder.

Shape key: B batch, T tokens, D model width, H heads, Hkv key/value heads (H under plain multi-head attention,
fewer under grouped-query attention), Dh head width (D = H · Dh unless the checkpoint says otherwise),
F feed-forward width, S DeBERTa's relative span (2S relative embeddings).

Masks are boolean, True where a query may attend to a key, broadcastable to (B, H, T, T).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.nn.kernels import add_layer_norm, embed_layer_norm, triton_available
from model.spec.config import EncoderConfig, RopeScaling
from model.spec.outputs import HEAD_STEP_ARRAYS, HeadSteps

M = TypeVar("M", bound=nn.Module)


class Attended(NamedTuple):
    values: Tensor  # (B, H, T, Dh): the attention-weighted values of each head
    attention: Tensor  # (B, H, T, T): the attention probabilities


assert tuple(name for name in HeadSteps._fields if name != "scale") == HEAD_STEP_ARRAYS  # model/spec/outputs.py


class AttentionResult(NamedTuple):
    values: Tensor  # (B, T, D) (or the (N, D) packed tokens): what a layer or its attention outputs
    attention: Tensor | None  # (B, H, T, T), only when asked for
    value_norms: Tensor | None = None  # (B, H, T): ‖f_h(x_j)‖ of every head and key, only when asked for


class RelativeEmbeddings(NamedTuple):
    """DeBERTa's relative positions, shared by every layer of a pass."""

    embeddings: Tensor  # (2S, D): one vector per relative bucket (normed where the config says)
    rows: Tensor  # (T, T) int64: the row of ``embeddings`` that query i and key j use


def sinusoidal_positional_encoding(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d_model)), PE[pos, 2i+1] = cos(pos / base^(2i/d_model))."""
    if length < 1:
        raise ValueError(f"length must be at least 1, got {length}")
    if d_model < 2 or d_model % 2 != 0:
        raise ValueError(f"d_model must be a positive even number, got {d_model}")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite number greater than 1, got {base}")
    # float64 for the angles: positions in the thousands lose digits in float32. On the CPU, whatever the default
    # device (an encoder is built on the meta device before its weights arrive).
    cpu = torch.device("cpu")
    position = torch.arange(length, dtype=torch.float64, device=cpu).unsqueeze(1)  # (T, 1)
    denominator = torch.pow(base, torch.arange(0, d_model, 2, dtype=torch.float64, device=cpu) / d_model)  # (D/2,)
    pe = torch.zeros(length, d_model, dtype=torch.float64, device=cpu)  # (T, D)
    pe[:, 0::2] = torch.sin(position / denominator)  # even columns: sine
    pe[:, 1::2] = torch.cos(position / denominator)  # odd columns: cosine
    return pe.to(torch.float32)


def window_block(reach: int) -> int:
    """The queries a block of windowed_attention holds."""
    return max(2 * reach, 64)


def windowed(length: int, reach: int) -> bool:
    """Whether a local layer takes ``length`` tokens block by block (windowed_attention): where the window is
    a small part of the sequence."""
    return length > 4 * window_block(reach)


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, reach: int, scale: float | None) -> Tensor:
    """Attention within a sliding window, block by block: each block of queries against the keys within
    ``reach`` of it alone, so T · (block + 2 · reach) scores rather than T². ``mask`` (…, T, T), boolean or
    additive, allows no key further than ``reach`` from its query (the local layers' mask); the result equals
    one fused call under it. q, k, v (B, H, T, Dh) → (B, H, T, Dh)."""
    T = q.size(-2)
    block = window_block(reach)
    out = torch.empty_like(q)
    for start in range(0, T, block):
        end = min(start + block, T)
        low, high = max(start - reach, 0), min(end + reach, T)
        out[..., start:end, :] = F.scaled_dot_product_attention(
            q[..., start:end, :],
            k[..., low:high, :],
            v[..., low:high, :],
            attn_mask=mask[..., start:end, low:high],
            scale=scale,
        )
    return out


def window_mask(length: int, reach: int, device: torch.device) -> Tensor:
    """A sliding window: query i sees key j when |i − j| ≤ reach. (1, 1, T, T) boolean."""
    position = torch.arange(length, device=device)
    return ((position[None, :] - position[:, None]).abs() <= reach)[None, None]  # (1, 1, T, T)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, sequences: Sequences, scale: float | None) -> Tensor:
    """Attention within each sequence of packed tokens: q (N, H, Dh), k and v (N, Hkv, Dh) → (N, H, Dh).

    On a GPU in float16 or bfloat16, flash attention's variable-length kernel (head widths that are multiples of 8,
    up to 256): no padding computed, no mask read. Elsewhere each sequence through scaled_dot_product_attention in
    turn (the same arithmetic, for checking).

    Rows of one length (a batch without padding) with as many key heads as query heads go through
    scaled_dot_product_attention as one (B, H, T, Dh) batch instead, no mask, where it picks its fastest kernel:
    on an H100 cuDNN's flash attention, 2.2 ms a pass of all-MiniLM-L6-v2 at 2,048 × 128 against 4.0 ms for the
    variable-length kernel (docs/benchmarks/cuda.md, "make gpu-check on an H100, again: the CUDA tests, profiled
    passes, cuDNN's attention and the GELU in the product (CUDA)").
    """
    rows = sequences.offsets.numel() - 1
    if sequences.uniform and k.size(1) == q.size(1):
        q_, k_, v_ = (t.view(rows, sequences.longest, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=sequences.causal, scale=scale)  # (B, H, T, Dh)
        return out.transpose(1, 2).reshape(q.shape)  # (N, H, Dh)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) % 8 == 0 and q.size(-1) <= 256:
        # The kernel reads rows and heads by their strides: views of the fused projection's output need no copy,
        # only a contiguous last dimension.
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        longest = sequences.longest
        offsets = sequences.offsets
        return torch.ops.aten._flash_attention_forward(
            q, k, v, offsets, offsets, longest, longest, 0.0, sequences.causal, False, scale=scale
        )[0]
    group = q.size(1) // k.size(1)
    bounds = sequences.offsets.tolist()
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        q_, k_, v_ = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, n, Dh), 2 × (Hkv, n, Dh)
        if group > 1:
            k_, v_ = k_.repeat_interleave(group, dim=0), v_.repeat_interleave(group, dim=0)
        out[start:end] = F.scaled_dot_product_attention(q_, k_, v_, is_causal=sequences.causal, scale=scale).transpose(
            0, 1
        )
    return out


def padding_mask(attention_mask: Tensor, causal: bool = False) -> Tensor:
    """Boolean attention mask from a (B, T) 0/1 padding mask: keys that are padding get no weight."""
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        T = attention_mask.size(1)
        future = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()  # (T, T)
        mask = mask & future  # (B, 1, T, T): query i sees keys j ≤ i
    return mask


def attention_scores(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """q kᵀ scaled: by ``scale``, or divided by √Dh (the paper's, and BERT's). (…, T, Dh) → (…, T, T)."""
    scores = q @ k.transpose(-2, -1)
    return scores / math.sqrt(q.size(-1)) if scale is None else scores * scale


def masked_softmax(scores: Tensor, mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """softmax over the keys of scores where ``mask`` lets a query see a key (computed in float32, returned in
    ``dtype``): each row sums to 1."""
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, scale: float | None = None
) -> Attended:
    """softmax(q kᵀ / √Dh + bias, masked) v, returning the weighted values and the attention probabilities.

    ``scale`` replaces 1/√Dh where the model has its own (Gemma's query_pre_attn_scalar, DeBERTa's 1/√(3 Dh)).
    """
    scores = attention_scores(q, k, scale)  # (B, H, T, T)
    if bias is not None:
        scores = scores + bias  # (1|B, H, T, T): a position bias (MPNet, DeBERTa)
    attention = masked_softmax(scores, mask, q.dtype)  # (B, H, T, T)
    return Attended(attention @ v, attention)  # (B, H, T, Dh), (B, H, T, T)


def rotary_frequencies(head_dim: int, base: float, scaling: RopeScaling | None = None) -> Tensor:
    """1 / base^(2i/Dh), the seeds' sinusoid frequencies, computed as transformers computes them (float32), and
    scaled where the config declares a scaling. (Dh/2,)"""
    frequency = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    if scaling is None:
        return frequency
    if scaling.kind == "linear":
        return frequency / scaling.factor
    # llama3: long wavelengths divided by the factor, short ones kept, the ones between blended
    low_wavelength = scaling.original_max_positions / scaling.low_freq_factor
    high_wavelength = scaling.original_max_positions / scaling.high_freq_factor
    wavelength = 2 * math.pi / frequency
    scaled = torch.where(wavelength > low_wavelength, frequency / scaling.factor, frequency)
    smooth = (scaling.original_max_positions / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    middle = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(middle, blended, scaled)


@functools.lru_cache(maxsize=64)
def frequencies_on(
    device: torch.device | None, head_dim: int, base: float, scaling: RopeScaling | None = None
) -> Tensor:
    """rotary_frequencies, computed on the CPU as transformers computes them and copied to ``device`` once: a
    pass recorded as a CUDA graph may copy nothing from the host (its warm-up run fills this cache)."""
    return rotary_frequencies(head_dim, base, scaling).to(device)  # (Dh/2,)


def rotary_angles(
    length: int, head_dim: int, base: float, device: torch.device | None = None, scaling: RopeScaling | None = None
) -> Tensor:
    """θ[pos, i] = pos / base^(2i/Dh) (scaled where the config says): the rotation angles. (T, Dh/2), float32."""
    frequency = frequencies_on(None if device is None else torch.device(device), head_dim, base, scaling)
    position = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    return position * frequency  # (T, Dh/2)


def rotate(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate each pair (x[i], x[i + Dh/2]) of every head vector by its angle (rotary position embedding).

    x is (…, T, Dh), angles (T, Dh/2).
    """
    half = x.size(-1) // 2
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, Dh/2)
    x1, x2 = x[..., :half], x[..., half:]  # 2 × (…, T, Dh/2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (…, T, Dh)


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


def log_bucket_positions(length: int, buckets: int, max_position: int, device: torch.device) -> Tensor:
    """DeBERTa's relative position δ(i, j) of query i to key j: i − j itself within ``buckets // 2``, beyond it
    log-bucketed up to ``max_position`` (transformers' ``make_log_bucket_position``, the same float32 steps).
    (T, T) int64, odd in i − j."""
    position = torch.arange(length, dtype=torch.long, device=device)
    relative = position[:, None] - position[None, :]  # (T, T): query i − key j
    if buckets <= 0 or max_position <= 0:
        return relative
    sign = torch.sign(relative)
    middle = buckets // 2
    inside = (relative < middle) & (relative > -middle)
    distance = torch.where(inside, torch.tensor(middle - 1).type_as(relative), relative.abs())
    scale = torch.log(torch.tensor((max_position - 1) / middle))
    logarithmic = torch.ceil(torch.log(distance / middle) / scale * (middle - 1)) + middle
    return torch.where(distance <= middle, relative.type_as(logarithmic), logarithmic * sign).long()


def relative_embedding_rows(length: int, span: int, max_position: int, device: torch.device) -> Tensor:
    """DeBERTa's row of its 2S relative embeddings for query i and key j: δ(i, j) + S, clamped. (T, T) int64."""
    delta = log_bucket_positions(length, span, max_position, device)  # (T, T)
    return (delta + span).clamp(0, 2 * span - 1)


@dataclass(frozen=True)
class Sequences:
    """The rows of a packed batch as variable-length sequences, for attention over the packed tokens themselves
    (``varlen_attention``): no padding in the attention core either."""

    offsets: Tensor  # (B + 1,) int32: row b's tokens are packed[offsets[b] : offsets[b + 1]]
    longest: int  # the longest row's real tokens
    positions: Tensor  # (N,) each packed token's position in its row
    causal: bool  # whether a token sees only the tokens before it
    uniform: bool = False  # whether every row is ``longest`` tokens long (a batch without padding)


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a padded (B, T) batch sit, so that per-token work skips the padding.

    Everything in a layer but the attention core acts on each token alone, so the fast path runs it on
    the (N, D) real tokens only, N = number of real tokens, and scatters into the (B, T) layout just
    around the attention core — or, with ``sequences``, runs the attention core on the packed tokens too.
    """

    index: Tensor  # (N,) flat positions b·T + t of the real tokens
    batch: int  # B
    length: int  # T
    sequences: Sequences | None = None
    source: Tensor | None = None  # (B·T,) for each position, the packed row it reads in ``spread``

    @classmethod
    def from_mask(cls, attention_mask: Tensor, varlen: bool = False, causal: bool = False) -> Packing:
        """``varlen``: also the rows as sequences, where every row's real tokens come first (right padding)."""
        B, T = attention_mask.shape
        index = attention_mask.flatten().nonzero().squeeze(1)
        sequences = None
        if varlen:
            lengths = attention_mask.sum(1)  # (B,)
            positions = torch.arange(T, device=attention_mask.device)
            if bool(((positions[None, :] < lengths[:, None]) == attention_mask.bool()).all()):
                offsets = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # (B + 1,)
                sequences = Sequences(offsets, int(lengths.max()), index % T, causal, index.numel() == B * T)
        source = (attention_mask.flatten().cumsum(0) - 1).clamp(min=0)  # a real token's row; padding, a neighbour's
        return cls(index, B, T, sequences, source)

    @property
    def full(self) -> bool:
        """Whether every position is a real token (no padding): then packing is a view, not a copy."""
        return self.index.numel() == self.batch * self.length

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) → (N, ...)"""
        if self.full:
            return x.flatten(0, 1)
        return x.flatten(0, 1).index_select(0, self.index)

    def spread(self, x: Tensor) -> Tensor:
        """(N, ...) → (B, T, ...) for the attention core, which masks the padding: every real token in its place, each
        padding position a copy of a real token's row (finite, never attended to, dropped by ``pack``). A gather
        rather than ``unpack``'s scatter into zeros: OpenVINO's scatter ran 7 % of its float32 pass of
        all-MiniLM-L6-v2 (docs/benchmarks/cpu-runtimes.md, "The attention's gather (CPU)")."""
        if self.full or self.source is None:
            return self.unpack(x)
        return x.index_select(0, self.source).view(self.batch, self.length, *x.shape[1:])

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) → (B, T, ...), zeros where the padding is."""
        if self.full:
            return x.view(self.batch, self.length, *x.shape[1:])
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out.index_copy_(0, self.index, x)
        return out.view(self.batch, self.length, *x.shape[1:])


class RMSNorm(nn.Module):
    """x / √(mean(x²) + ε) · (offset + w), in float32 whatever the input's dtype (Llama's norm; Gemma stores
    its weights as w − 1, so its offset is 1)."""

    def __init__(self, width: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (…, width)
        return (normed * (self.offset + self.weight.float())).to(x.dtype)


def norm(config: EncoderConfig, width: int | None = None) -> nn.Module:
    """The family's norm: LayerNorm (with a bias unless the family has none), or RMSNorm."""
    width = width or config.d_model
    if config.norm == "rmsnorm":
        return RMSNorm(width, config.layer_norm_eps, config.norm_offset)
    return nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)


def in_dtype(module: M, dtype: torch.dtype | None) -> M:
    """The module, or a copy of it in ``dtype`` where its weights are in another: the explicit path's float32
    over weights kept in a lower precision, made one layer at a time."""
    weight = next(module.parameters(), None)
    if dtype is None or weight is None or weight.dtype == dtype:
        return module
    return copy.deepcopy(module).to(dtype)


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    ``qkv`` holds [W_q; W_k; W_v] stacked along the output axis (as torch.nn.MultiheadAttention's
    ``in_proj_weight``), so ``qkv(x)`` splits into q (H heads) and k, v (Hkv heads each). Under grouped-query
    attention (Hkv < H) query head h attends with key/value head h // (H / Hkv), as transformers' ``repeat_kv``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: bool = True,
        *,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        out_bias: bool | None = None,
        scale: float | None = None,
        qk_norm: Callable[[], nn.Module] | None = None,
        disentangled: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        if head_dim is None and d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model = d_model
        self.n_heads = n_heads
        self.kv_heads = kv_heads or n_heads
        if n_heads % self.kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        self.group = n_heads // self.kv_heads  # query heads per key/value head
        self.head_dim = head_dim or d_model // n_heads
        self.widths = (n_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim)
        self.scale = scale  # None: 1/√Dh (``softmax_scale``)
        self.reach: int | None = None  # a local layer's window reach (Encoder sets it): long inputs go by blocks
        self.qkv = nn.Linear(d_model, sum(self.widths), bias=bias)
        self.out = nn.Linear(self.widths[0], d_model, bias=bias if out_bias is None else out_bias)
        # Qwen3 and Gemma 3 norm each head's query and key (over Dh) before the rotation.
        self.query_norm = qk_norm() if qk_norm is not None else None
        self.key_norm = qk_norm() if qk_norm is not None else None
        self.disentangled = disentangled  # DeBERTa's position terms, c2p and p2c

    @property
    def softmax_scale(self) -> float:
        """What q kᵀ is multiplied by before the softmax: the model's own scale, or 1/√Dh (the paper's)."""
        return self.scale if self.scale is not None else 1 / math.sqrt(self.head_dim)

    @classmethod
    def from_config(cls, config: EncoderConfig) -> MultiHeadAttention:
        return cls(
            config.d_model,
            config.n_heads,
            config.qkv_bias,
            kv_heads=config.kv_heads,
            head_dim=config.head_dim,
            out_bias=config.out_bias,
            scale=config.attention_scale,
            qk_norm=(lambda: norm(config, config.head_dim)) if config.qk_norm else None,
            disentangled=config.disentangled,
        )

    def project(self, x: Tensor, separately: bool = False) -> Tensor:
        """x [W_q; W_k; W_v]ᵀ (+ b): (…, D) → (…, 3D). ``separately``: as three products, one each for q, k and v,
        as transformers computes them (the explicit path: then its values equal transformers' to the bit, where
        the one fused product, faster, rounds a few of them differently)."""
        if not separately:
            return self.qkv(x)
        weights = self.qkv.weight.split(self.widths)
        biases = self.qkv.bias.split(self.widths) if self.qkv.bias is not None else (None, None, None)
        return torch.cat([F.linear(x, weight, bias) for weight, bias in zip(weights, biases)], dim=-1)

    def heads(self, qkv: Tensor, angles: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection's output (…, T, 3D) cut into heads: q (…, H, T, Dh), k and v (…, Hkv, T, Dh);
        q and k normed per head and rotated by position where the model does."""
        q, k, v = qkv.split(self.widths, dim=-1)  # (…, T, H·Dh), 2 × (…, T, Hkv·Dh)
        q = q.unflatten(-1, (self.n_heads, self.head_dim)).transpose(-3, -2)  # (…, H, T, Dh)
        k = k.unflatten(-1, (self.kv_heads, self.head_dim)).transpose(-3, -2)  # (…, Hkv, T, Dh)
        v = v.unflatten(-1, (self.kv_heads, self.head_dim)).transpose(-3, -2)  # (…, Hkv, T, Dh)
        if self.query_norm is not None and self.key_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        if angles is not None:
            q, k = rotate(q, angles), rotate(k, angles)
        return q, k, v

    def packed_attention(self, qkv: Tensor, sequences: Sequences, angles: Tensor | None) -> Tensor:
        """The attention core on packed tokens (``varlen_attention``): the fused projection's output (N, 3D) →
        the heads' values concatenated, (N, H·Dh); q and k normed and rotated as ``heads`` does, each token by
        its position in its row."""
        q, k, v = qkv.split(self.widths, dim=-1)  # (N, H·Dh), 2 × (N, Hkv·Dh)
        q = q.unflatten(-1, (self.n_heads, self.head_dim))  # (N, H, Dh)
        k = k.unflatten(-1, (self.kv_heads, self.head_dim))  # (N, Hkv, Dh)
        v = v.unflatten(-1, (self.kv_heads, self.head_dim))  # (N, Hkv, Dh)
        if self.query_norm is not None and self.key_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        if angles is not None:
            each = angles[sequences.positions].unsqueeze(1)  # (N, 1, Dh/2)
            q, k = rotate(q, each), rotate(k, each)
        values = varlen_attention(q, k, v, sequences, self.scale)  # views of qkv: no copies
        return values.flatten(1)  # (N, H·Dh)

    def shared_heads(self, x: Tensor) -> Tensor:
        """(…, Hkv, T, Dh) → (…, H, T, Dh): each key/value head repeated for the query heads of its group."""
        return x if self.group == 1 else x.repeat_interleave(self.group, dim=-3)

    def disentangled_bias(self, q: Tensor, k: Tensor, relative: RelativeEmbeddings) -> Tensor:
        """DeBERTa's position terms, scaled as the scores are: c2p[i, j] = q_i · k_r[δ(i, j)] and
        p2c[i, j] = k_j · q_r[δ(i, j)], where q_r and k_r are this layer's query and key projections of the shared
        relative embeddings and δ(i, j) the row of query i and key j. q and k (B, H, T, Dh) → (B, H, T, T)."""
        W_q, W_k, _ = self.qkv.weight.split(self.widths)
        b_q, b_k = self.qkv.bias.split(self.widths)[:2] if self.qkv.bias is not None else (None, None)
        B, H, T, _ = q.shape
        index = relative.rows.expand(B, H, T, T)
        bias = torch.zeros(B, H, T, T, dtype=q.dtype, device=q.device)
        if "c2p" in self.disentangled:  # the query's content against the key's relative position
            key_r = F.linear(relative.embeddings, W_k, b_k).unflatten(-1, (H, -1)).transpose(0, 1)  # (H, 2S, Dh)
            bias = bias + (q @ key_r.transpose(-2, -1)).gather(-1, index)  # (B, H, T, T)
        if "p2c" in self.disentangled:  # the key's content against the query's relative position
            query_r = F.linear(relative.embeddings, W_q, b_q).unflatten(-1, (H, -1)).transpose(0, 1)  # (H, 2S, Dh)
            by_key = k @ query_r.transpose(-2, -1)  # (B, H, T, 2S): key j against every relative row
            bias = bias + by_key.gather(-1, index.transpose(-2, -1)).transpose(-2, -1)  # (B, H, T, T)
        return bias * self.softmax_scale

    def value_norms(self, v: Tensor) -> Tensor:
        """‖f_h(x_j)‖ with f_h(x) = (x W_V^h + b_V^h) W_O^h, the vector head h adds to the output for key j
        when it puts all its weight there (Kobayashi et al. 2020; the output bias excluded).

        v is (B, H, T, Dh), the heads' values x W_V^h + b_V^h (each query head's, under grouped-query
        attention); → (B, H, T).
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
        relative: RelativeEmbeddings | None = None,
    ) -> HeadSteps:
        """One head's computation on one text, step by step, as the seeds write it: x (T, D) is the layer's
        attention input; the scores are scale · q kᵀ (+ the position bias), before masking and softmax."""
        q, k, v = self.heads(self.project(x[None], separately=True), angles)  # (1, H, T, Dh), 2 × (1, Hkv, T, Dh)
        bias = None
        if relative is not None:
            bias = self.disentangled_bias(q, self.shared_heads(k), relative)[0, head]  # (T, T)
        elif position_bias is not None:
            bias = position_bias[0, head]  # (T, T)
        q, k, v = q[0, head], k[0, head // self.group], v[0, head // self.group]  # 3 × (T, Dh): the head's own
        scores = attention_scores(q, k, self.scale)  # (T, T): omega, scaled (as the attention path does)
        if bias is not None:
            scores = scores + bias
        attention = masked_softmax(scores, mask, q.dtype)  # (T, T)
        return HeadSteps(q, k, v, self.softmax_scale, scores, attention, attention @ v)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        position_bias: Tensor | None = None,
        angles: Tensor | None = None,
        need_value_norms: bool = False,
        relative: RelativeEmbeddings | None = None,
    ) -> AttentionResult:
        """x is (B, T, D), or with ``packing`` the (N, D) real tokens alone (and so is the result).

        ``position_bias`` (1, H, T, T) is added to the scores; with ``angles`` (T, Dh/2) q and k are rotated;
        with ``relative`` DeBERTa's position terms are added. With ``need_value_norms`` the result also holds
        ``value_norms`` (explicit path only).
        """
        qkv = self.project(x, separately=need_weights)  # (B, T, 3D) or (N, 3D)
        sequences = packing.sequences if packing is not None else None
        if (
            sequences is not None
            and position_bias is None
            and relative is None
            and self.reach is None
            and not need_weights
        ):
            return AttentionResult(self.out(self.packed_attention(qkv, sequences, angles)), None, None)  # (N, D)
        if packing is not None:
            qkv = packing.spread(qkv)  # (B, T, 3D)
        B, T = qkv.size(0), qkv.size(1)
        q, k, v = self.heads(qkv, angles)  # (B, H, T, Dh), 2 × (B, Hkv, T, Dh)
        k, v = self.shared_heads(k), self.shared_heads(v)  # 2 × (B, H, T, Dh)
        bias = self.disentangled_bias(q, k, relative) if relative is not None else position_bias
        if need_weights:
            values, attention = scaled_dot_product_attention(q, k, v, mask, bias, self.scale)
        else:
            # The fused kernel: same arithmetic, no (T, T) matrix kept.
            attn_mask = mask
            if bias is not None:  # one additive mask: the bias, −∞ where the mask forbids
                attn_mask = bias.to(q.dtype)
                if mask is not None:
                    attn_mask = attn_mask.masked_fill(~mask, float("-inf"))  # (B, H, T, T)
            if self.reach is not None and attn_mask is not None and windowed(T, self.reach):
                values = windowed_attention(q, k, v, attn_mask, self.reach, self.scale)  # (B, H, T, Dh)
            else:
                values = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
            attention = None
        norms = self.value_norms(v) if need_value_norms else None  # (B, H, T) | None
        values = values.transpose(1, 2).reshape(B, T, self.widths[0])  # (B, T, H·Dh): heads concatenated
        if packing is not None:
            values = packing.pack(values)  # (N, H·Dh)
        return AttentionResult(self.out(values), attention, norms)  # (B, T, D) or (N, D)


# Every non-linearity the models run, by the name the configs use here (model/spec/config.py's HF_ACTIVATIONS reads
# Hugging Face's names into these; model/nn/pooling.py's DENSE_ACTIVATIONS, sentence-transformers' class paths).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}


def activation_module(name: str) -> nn.Module:
    """The activation of that name (the config's, a head's or a Dense module's)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W₂ act(W₁ x + b₁) + b₂, applied to every token alike.

    With ``glu`` W₁ is twice as wide and its first half, activated, gates the second: W₂ (act(x W₁ₐ) ⊙ x W₁ᵦ)
    (GeGLU, SwiGLU: Llama's gate_proj is W₁ₐ, its up_proj W₁ᵦ).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", glu: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.glu = glu
        self.expand = nn.Linear(d_model, 2 * d_ff if glu else d_ff, bias=bias)
        self.contract = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation_module(activation)
        self.gelu_in_product = False  # see fuse_gelu

    def fuse_gelu(self) -> bool:
        """Compute the GELU in the first product's epilogue (cuBLASLt's bias + GELU, as text-embeddings-inference
        does) where the activation is a GELU after a biased product: no separate pass over the (N, F) hidden
        values, 13 % of a pass of all-MiniLM-L6-v2 on an H100. On a GPU that GELU is the tanh form (a CPU computes
        the exact one), whose values differ from the exact GELU's by at most 4.7 · 10⁻⁴ (near |x| = 2), within
        float16's rounding there: for the half-precision passes on a GPU only (model/runtime/loader.py). Whether it
        took."""
        self.gelu_in_product = isinstance(self.activation, nn.GELU) and not self.glu and self.expand.bias is not None
        return self.gelu_in_product

    def forward(self, x: Tensor) -> Tensor:
        if self.gelu_in_product:  # on the tokens as rows: (N, D) packed, or (B, T, D) as (B·T, D)
            rows = x.reshape(-1, x.size(-1))  # (N, D)
            hidden = torch._addmm_activation(self.expand.bias, rows, self.expand.weight.t(), use_gelu=True)  # (N, F)
            return self.contract(hidden).view(*x.shape[:-1], -1)  # like x
        hidden = self.expand(x)  # (B, T, F) or (B, T, 2F)
        if self.glu:
            value, gate = hidden.chunk(2, dim=-1)  # 2 × (B, T, F)
            return self.contract(self.activation(value) * gate)  # (B, T, D)
        return self.contract(self.activation(hidden))  # (B, T, F) → (B, T, D)


class EncoderLayer(nn.Module):
    """One encoder block.

    Post-norm, as in BERT and the paper: x = LN(x + Attn(x)); x = LN(x + FFN(x)).
    Pre-norm (``pre_norm``, ModernBERT and the decoders): x = x + Attn(LN(x)); x = x + FFN(LN(x)); ModernBERT's
    first layer has no attention norm (its embeddings are normed). Gemma 3 norms the sublayers' outputs too
    (``sandwich_norm``): x = x + LN(Attn(LN(x))); x = x + LN(FFN(LN(x))).
    """

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.local = config.is_local(index)  # attends within a sliding window
        self.attention = MultiHeadAttention.from_config(config)
        if self.local:
            self.attention.reach = config.window_reach
        first_without = config.pre_norm and index == 0 and not config.first_attention_norm
        self.attention_norm: nn.Module = nn.Identity() if first_without else norm(config)
        self.feed_forward = PositionwiseFeedForward(
            config.d_model, config.d_ff, config.activation, glu=config.glu, bias=config.ffn_bias
        )
        self.feed_forward_norm = norm(config)
        self.attention_output_norm = norm(config) if config.sandwich_norm else None
        self.feed_forward_output_norm = norm(config) if config.sandwich_norm else None
        self.norms_fused = False  # see fuse_norms

    def fuse_norms(self) -> bool:
        """Add the residual and norm the sum in one kernel (model/nn/kernels.py) in a post-norm block whose norms are
        LayerNorms: one pass over the tokens instead of two, each LN(x + sublayer(x)). For the half-precision
        passes on a GPU only (model/runtime/loader.py), where Triton is there. Whether it took."""
        self.norms_fused = (
            not self.pre_norm
            and all(isinstance(n, nn.LayerNorm) for n in (self.attention_norm, self.feed_forward_norm))
            and triton_available()
        )
        return self.norms_fused

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        position_bias: Tensor | None = None,
        angles: Tensor | None = None,
        need_value_norms: bool = False,
        relative: RelativeEmbeddings | None = None,
    ) -> AttentionResult:
        if self.pre_norm:
            attended, attention, norms = self.attention(
                self.attention_norm(x), mask, need_weights, packing, position_bias, angles, need_value_norms, relative
            )  # like x, (B, H, T, T) | None, (B, H, T) | None
            if self.attention_output_norm is not None:
                attended = self.attention_output_norm(attended)
            x = x + attended  # (B, T, D)
            fed = self.feed_forward(self.feed_forward_norm(x))  # (B, T, D)
            if self.feed_forward_output_norm is not None:
                fed = self.feed_forward_output_norm(fed)
            return AttentionResult(x + fed, attention, norms)
        attended, attention, norms = self.attention(
            x, mask, need_weights, packing, position_bias, angles, need_value_norms, relative
        )
        if self.norms_fused and not need_weights:
            x = add_layer_norm(attended, x, self.attention_norm)  # (B, T, D) | (N, D)
            x = add_layer_norm(self.feed_forward(x), x, self.feed_forward_norm)
            return AttentionResult(x, attention, norms)
        x = self.attention_norm(x + attended)  # (B, T, D)
        x = self.feed_forward_norm(x + self.feed_forward(x))  # (B, T, D)
        return AttentionResult(x, attention, norms)


class Embeddings(nn.Module):
    """Token + position + segment embeddings, then a norm: the input of the first layer.

    Positions: a learned table (BERT; RoBERTa and MPNet count real tokens from the padding index + 1; DeBERTa's
    optional absolute table), the fixed sinusoid, or none here (rotary and relative positions act inside
    attention). Segments only where the family has them. ELECTRA's narrower embeddings are projected up to D at
    the end. Gemma scales the token embeddings by √D; the decoders have no norm here.
    """

    sinusoid: Tensor  # (max_positions, D), a buffer, when the positions are the fixed sinusoid

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        E = config.width
        self.token = nn.Embedding(config.vocab_size, E)
        self.segment = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size > 0 else None
        self.norm = norm(config, E) if config.embedding_norm else None
        self.position: nn.Embedding | None = None
        if config.learned_positions:
            self.position = nn.Embedding(config.max_positions, E)
        elif config.position_embedding == "sinusoidal":
            # Computed once and kept with the module (not a weight: nothing to load).
            sinusoid = sinusoidal_positional_encoding(config.max_positions, E, config.sinusoid_base)
            self.register_buffer("sinusoid", sinusoid, persistent=False)  # (max_positions, E)
        self.project = nn.Linear(E, config.d_model) if config.d_model != E else None
        # Positions count from the padding index + 1 (RoBERTa, MPNet), so fewer of them fit.
        self.offset = config.position_embedding in ("learned_offset", "relative_buckets")
        self.max_length = config.position_limit
        self.two_segments = config.type_vocab_size > 1  # else every token takes segment 0 (RoBERTa's one row)
        self.norms_fused = False  # see fuse_norm

    def fuse_norm(self) -> bool:
        """Look the rows up, add them and norm the sum in one kernel (model/nn/kernels.py) where the embeddings end
        in a LayerNorm and are neither scaled nor projected: one pass over the tokens instead of five or six. For
        the half-precision passes on a GPU only (model/runtime/loader.py), where Triton is there. Whether it took."""
        self.norms_fused = (
            isinstance(self.norm, nn.LayerNorm)
            and self.project is None
            and self.config.embedding_scale == 1.0
            and triton_available()
        )
        return self.norms_fused

    def position_table(self) -> Tensor | None:
        """The (max_positions, E) position encodings this model adds to its tokens; None for rotary."""
        if self.position is not None:
            return self.position.weight
        if self.config.position_embedding == "sinusoidal":
            return self.sinusoid
        return None

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor,
        attention_mask: Tensor,
        dtype: torch.dtype | None = None,
        projected: bool = True,
    ) -> Tensor:
        """(B, T) ids → (B, T, D), in ``dtype`` where given (the explicit path's float32), else the weights'. Without
        ``projected``, ELECTRA's narrower embeddings (B, T, E) before their projection up to D (``up``): the output
        of transformers' embedding block, where attributions are taken."""
        T = input_ids.size(1)
        if self.max_length < T:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.max_length} positions")
        if self.norms_fused and dtype is None and projected:
            return self.fused(input_ids, token_type_ids, attention_mask)
        x = self.token(input_ids)  # (B, T, E)
        if dtype is not None:
            x = x.to(dtype)
        if self.config.embedding_scale != 1.0:  # as transformers: the scale in the embeddings' own dtype
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)
        segment = self.segment
        if segment is not None:
            segments = token_type_ids if self.two_segments else torch.zeros_like(token_type_ids)
            x = x + segment(segments).to(x.dtype)  # (B, T, E)
        if self.offset:
            assert self.position is not None
            x = x + self.position(self.offset_positions(attention_mask)).to(x.dtype)  # (B, T, E)
        else:
            table = self.position_table()
            if table is not None:
                x = x + table[:T].to(x.dtype)  # (B, T, E) + (T, E)
        if self.norm is not None:
            x = in_dtype(self.norm, x.dtype)(x)  # (B, T, E)
        return self.up(x) if projected else x  # (B, T, D)

    def up(self, x: Tensor) -> Tensor:
        """(…, E) → (…, D): ELECTRA's projection of its narrower embeddings; the identity elsewhere."""
        return in_dtype(self.project, x.dtype)(x) if self.project is not None else x

    def offset_positions(self, attention_mask: Tensor) -> Tensor:
        """(B, T) positions counted from the padding index + 1 over the real tokens (RoBERTa, MPNet): pad, pad + 1,
        …; padding takes the padding index."""
        real = attention_mask.long()  # (B, T)
        return real.cumsum(dim=1) * real + self.config.pad_token_id  # (B, T)

    def fused(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The same rows summed and normed by one kernel (``fuse_norm``), the sum kept in float32."""
        assert self.norm is not None
        segments = self.segment.weight if self.segment is not None else None
        segment_ids = token_type_ids if self.two_segments else None
        position_ids = self.offset_positions(attention_mask) if self.offset else None
        table = self.position_table()
        return embed_layer_norm(input_ids, self.token.weight, self.norm, segment_ids, segments, position_ids, table)


@dataclass(frozen=True)
class Keep:
    """What a pass keeps beside its last hidden state: every layer's output, every layer's attention probabilities
    (the explicit attention path), and the norms of every head's transformed values (with the attentions)."""

    hidden_states: bool = False
    attentions: bool = False
    value_norms: bool = False

    def __post_init__(self) -> None:
        if self.value_norms and not self.attentions:
            raise ValueError("value norms need the attentions (the explicit attention path)")


LAST_ONLY = Keep()  # the last hidden state alone


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, T, D): output of the last layer computed
    hidden_states: list[Tensor] | None = None  # N + 1 × (B, T, D): [0] embeddings, [l] output of layer l
    attentions: list[Tensor] | None = None  # N × (B, H, T, T): attention probabilities of each layer
    value_norms: list[Tensor] | None = None  # N × (B, H, T): ‖f_h(x_j)‖ of each layer (MultiHeadAttention.value_norms)


class Shared(NamedTuple):
    """What every layer of one pass shares."""

    mask: Tensor  # (B, 1, 1|T, T): the global layers' mask
    local_mask: Tensor  # the local layers': the mask within the sliding window
    position_bias: Tensor | None  # MPNet's (1, H, T, T)
    angles: dict[bool, Tensor | None]  # rotation angles of the global (False) and local (True) layers, (T, Dh/2)
    relative: RelativeEmbeddings | None  # DeBERTa's

    def for_layer(self, local: bool) -> tuple[Tensor, Tensor | None, Tensor | None, RelativeEmbeddings | None]:
        """(mask, position bias, angles, relative embeddings) of a global or local layer."""
        return (self.local_mask if local else self.mask), self.position_bias, self.angles[local], self.relative


class Encoder(nn.Module):
    """Embeddings followed by N encoder layers (and, pre-norm, a final norm).

    Where the family has them, what every layer shares is made once per pass here: MPNet's relative
    position bias, DeBERTa's relative embeddings, the rotation angles (one set per base) and the masks.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.n_layers))
        # MPNet: one learned bias per (bucket of relative distance, head), shared by every layer.
        mpnet = config.position_embedding == "relative_buckets"
        self.relative_bias = nn.Embedding(config.relative_buckets, config.n_heads) if mpnet else None
        # DeBERTa: one vector per relative bucket, 2S of them, shared by every layer (each projects them itself).
        deberta = config.position_embedding == "disentangled"
        self.relative_embeddings = nn.Embedding(2 * config.relative_buckets, config.d_model) if deberta else None
        self.relative_norm = norm(config) if deberta and config.relative_norm else None
        self.final_norm = norm(config) if config.pre_norm else None
        self.local_layers = [config.is_local(i) for i in range(config.n_layers)]  # which attend within a window
        # The packed pass's attention core on the packed tokens too (Sequences, varlen_attention), where every
        # layer can: no position bias, no relative embeddings, no windows.
        self.varlen = False

    def position_bias(self, length: int, device: torch.device, dtype: torch.dtype | None = None) -> Tensor | None:
        """MPNet's bias on the scores, (1, H, T, T); None for other families."""
        if self.relative_bias is None:
            return None
        buckets = relative_position_buckets(
            length, self.config.relative_buckets, self.config.relative_max_distance, device
        )  # (T, T)
        return in_dtype(self.relative_bias, dtype)(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)

    def relative_index(self, length: int, device: torch.device) -> Tensor:
        """DeBERTa's row of the relative embeddings for query i and key j (relative_embedding_rows). (T, T)"""
        return relative_embedding_rows(length, self.config.relative_buckets, self.config.relative_max_distance, device)

    def shared(self, attention_mask: Tensor, causal: bool = False, dtype: torch.dtype | None = None) -> Shared:
        """What every layer of a pass shares (``Shared``), for a (B, T) padding mask."""
        config = self.config
        T, device = attention_mask.size(1), attention_mask.device
        mask = padding_mask(attention_mask, causal or config.causal)  # (B, 1, 1|T, T)
        local_mask = mask
        if config.local_layers:
            # A padding query far from every real token sees no key in its window: it sees itself, so that no
            # row is empty (an empty row is NaN in the fused kernel, and 0 · NaN spreads).
            itself = torch.eye(T, dtype=torch.bool, device=device)[None, None]  # (1, 1, T, T)
            local_mask = (mask & window_mask(T, config.window_reach, device)) | itself  # (B, 1, T, T)
        angles: dict[bool, Tensor | None] = {False: None, True: None}  # rotation angles of global, local layers
        if config.position_embedding == "rotary":
            angles[False] = rotary_angles(T, config.head_dim, config.rope_theta, device, config.rope_scaling)
            angles[True] = rotary_angles(T, config.head_dim, config.local_rope_theta, device, config.local_rope_scaling)
        relative = None
        if self.relative_embeddings is not None:
            embeddings = in_dtype(self.relative_embeddings, dtype).weight  # (2S, D)
            if self.relative_norm is not None:
                embeddings = in_dtype(self.relative_norm, dtype)(embeddings)
            relative = RelativeEmbeddings(embeddings, self.relative_index(T, device))
        return Shared(mask, local_mask, self.position_bias(T, device, dtype), angles, relative)

    def head_steps(
        self, input_ids: Tensor, token_type_ids: Tensor, layer: int, head: int, dtype: torch.dtype | None = None
    ) -> HeadSteps:
        """One head of one layer on one text (input ids (1, T), no padding), step by step: the layers below run
        as usual, then that layer's attention input goes through MultiHeadAttention.head_steps."""
        attention_mask = torch.ones_like(input_ids)
        below = self(input_ids, attention_mask, token_type_ids, n_layers=layer, dtype=dtype).last_hidden_state
        block = in_dtype(self.layers[layer], dtype)
        assert isinstance(block, EncoderLayer)
        x = block.attention_norm(below) if block.pre_norm else below  # (1, T, D): the attention's input
        mask, position_bias, angles, relative = self.shared(attention_mask, dtype=dtype).for_layer(
            self.local_layers[layer]
        )
        return block.attention.head_steps(x[0], head, mask[0, 0], position_bias, angles, relative)

    def forward(
        self,
        input_ids: Tensor,  # (B, T) token ids
        attention_mask: Tensor | None = None,  # (B, T) 1 for real tokens, 0 for padding
        token_type_ids: Tensor | None = None,  # (B, T) segment ids
        keep: Keep = LAST_ONLY,  # what to keep beside the last hidden state (the layers' outputs: embeddings first)
        *,
        causal: bool = False,  # also hide future positions (the decoder mask of the paper; the config's own too)
        n_layers: int | None = None,  # stop after this many layers (all by default)
        pack: bool = True,  # skip the padding (the fast path); False computes it, masked (what a CUDA graph records)
        dtype: torch.dtype | None = None,  # compute in this dtype, each layer copied to it where its weights are not
        # (B, T) the positions computed, where more than the keys of ``attention_mask``: ColBERT's query expansion
        # tokens, which no token attends to but which have outputs (and positions) of their own
        computed: Tensor | None = None,
        # (B, T, D) the embedding block's output given rather than computed from the ids: the point at which
        # attributions are taken (model/nn/attribution.py)
        embedded: Tensor | None = None,
    ) -> EncoderOutput:
        config = self.config
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if computed is None:
            computed = attention_mask
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        n_layers = config.n_layers if n_layers is None else n_layers
        if not 0 <= n_layers <= config.n_layers:
            raise ValueError(f"n_layers must be between 0 and {config.n_layers}, got {n_layers}")

        shared = self.shared(attention_mask, causal, dtype)

        x = self.embeddings(input_ids, token_type_ids, computed, dtype) if embedded is None else embedded  # (B, T, D)
        # Fast path with padding: per-token work on the real tokens only (padded rows come back as zeros).
        varlen = self.varlen and dtype is None and computed is attention_mask  # the pass, not the explicit paths
        skip = pack and not keep.attentions and (varlen or not bool(computed.all()))
        packing = Packing.from_mask(computed, varlen, causal or config.causal) if skip else None
        if packing is not None:
            x = packing.pack(x)  # (N, D)
        unpack = packing.unpack if packing is not None else (lambda t: t)
        hidden_states = [unpack(x)] if keep.hidden_states else None
        attentions: list[Tensor] | None = [] if keep.attentions else None
        value_norms: list[Tensor] | None = [] if keep.value_norms else None
        for index, layer in enumerate(self.layers[:n_layers]):
            mask, position_bias, angles, relative = shared.for_layer(self.local_layers[index])
            x, attention, norms = in_dtype(layer, dtype)(
                x, mask, keep.attentions, packing, position_bias, angles, keep.value_norms, relative
            )  # (B, T, D) | (N, D), (B, H, T, T) | None, (B, H, T) | None
            if hidden_states is not None:
                hidden_states.append(unpack(x))
            if attentions is not None:
                attentions.append(attention)
            if value_norms is not None:
                value_norms.append(norms)
        if self.final_norm is not None and n_layers == config.n_layers:
            x = in_dtype(self.final_norm, dtype)(x)  # the encoder's output is normed once more, after the last layer
            if hidden_states is not None:
                hidden_states[-1] = unpack(x)
        return EncoderOutput(unpack(x), hidden_states, attentions, value_norms)
