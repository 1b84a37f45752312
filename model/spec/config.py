"""Encoder configuration: our own frozen dataclass, built from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

PositionEmbedding = Literal["learned", "learned_offset", "sinusoidal", "relative_buckets", "rotary", "disentangled"]
POSITION_EMBEDDINGS: tuple[PositionEmbedding, ...] = (
    "learned",  # BERT: a learned table, position t at row t
    "learned_offset",  # RoBERTa, MPNet: a learned table, real tokens counted from the padding index + 1
    "sinusoidal",  # the paper's (and the seeds') fixed sinusoid
    "relative_buckets",  # MPNet's bias on the scores, besides its learned table (reported as such)
    "rotary",  # ModernBERT and the decoders: q and k rotated by position-dependent angles, no table
    "disentangled",  # DeBERTa: content-to-position and position-to-content terms over log-bucketed distances
)
Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]
AttentionKind = Literal["bidirectional", "causal"]
Norm = Literal["layernorm", "rmsnorm"]
Family = Literal[
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "electra",
    "modernbert",
    "deberta-v2",
    "qwen2",
    "qwen3",
    "llama",
    "mistral",
    "gemma3_text",
]

# Hugging Face `hidden_act` values and the activation each one names here.
HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
SUPPORTED_MODEL_TYPES: tuple[Family, ...] = get_args(Family)  # the model types read, in Family's order
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
DISENTANGLED_TERMS = ("c2p", "p2c")  # DeBERTa's content-to-position and position-to-content terms
# The decoder families (read as transformers reads them: causal), each with what transformers assumes for a config
# that omits a field: (num_key_value_heads, head_dim); None is the number of query heads, and
# hidden_size // num_attention_heads.
DECODER_DEFAULTS: dict[Family, tuple[int | None, int | None]] = {
    "qwen2": (32, None),
    "qwen3": (32, 128),
    "llama": (None, None),
    "mistral": (8, None),
    "gemma3_text": (4, 256),
}
DECODERS: tuple[Family, ...] = tuple(DECODER_DEFAULTS)


@dataclass(frozen=True)
class RopeScaling:
    """A rotary scaling the config declares: ``linear`` divides every frequency by ``factor``; ``llama3`` divides
    the low frequencies by it and blends the middle ones (transformers' ``_compute_llama3_parameters``)."""

    kind: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522  # rows of the token-embedding table
    d_model: int = 384  # D, the width of every token vector (hidden_size)
    n_heads: int = 12  # H, attention (query) heads per layer
    n_layers: int = 6  # N, encoder layers (blocks)
    d_ff: int = 1536  # width of the position-wise feed-forward layer (intermediate_size)
    max_positions: int = 512  # the longest sequence the position embeddings cover
    type_vocab_size: int = 2  # segment ids: sentence A = 0, sentence B = 1; 0 = no segment embeddings
    position_embedding: PositionEmbedding = "learned"  # how positions enter: see POSITION_EMBEDDINGS
    activation: Activation = "gelu"  # feed-forward non-linearity: GELU for BERT, SiLU for Llama, ReLU in the paper
    layer_norm_eps: float = 1e-12  # epsilon of every LayerNorm (or RMSNorm)
    pad_token_id: int = 0  # id of the padding token ([PAD], <pad>)
    sinusoid_base: float = 10000.0  # wavelength base of the sinusoidal encoding
    family: Family = "bert"  # the checkpoint's model_type: which tensor names its weights have
    embedding_size: int | None = None  # ELECTRA: embeddings narrower than D, projected up to D
    pre_norm: bool = False  # the norm before attention and feed-forward (and a final norm), not after
    glu: bool = False  # gated feed-forward: act(x W₁ₐ) ⊙ (x W₁ᵦ), then W₂ (GeGLU, SwiGLU)
    qkv_bias: bool = True  # a bias in the query, key and value projections (Qwen2 has it, Llama not)
    out_bias: bool = True  # a bias in the attention's output projection
    ffn_bias: bool = True  # biases in the feed-forward layer
    norm_bias: bool = True  # a bias (shift) in every LayerNorm; an RMSNorm never has one
    relative_buckets: int = 0  # MPNet: buckets of relative distance; DeBERTa: its position_buckets (the span)
    relative_max_distance: int = 128  # MPNet: distances from here share one bucket; DeBERTa: max_relative_positions
    rope_theta: float = 10000.0  # rotary base of the global layers
    local_rope_theta: float = 10000.0  # rotary base of the local (sliding-window) layers
    local_window: int = 0  # the config's sliding window W (see window_reach); 0 = none
    local_layers: tuple[int, ...] = ()  # which layers (0-based) attend within the sliding window
    # the decoder families
    attention: AttentionKind = "bidirectional"  # causal: query i sees keys j ≤ i (the seeds' triangular mask)
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); n_heads when None
    head_width: int | None = None  # Dh when the checkpoint sets it apart from D // H (Qwen3, Gemma)
    norm: Norm = "layernorm"  # LayerNorm, or RMSNorm (Llama and its descendants)
    norm_offset: float = 0.0  # an RMSNorm scales by (offset + weight): Gemma's weights are stored as w − 1
    qk_norm: bool = False  # an RMSNorm over each head's query and key before the rotation (Qwen3, Gemma 3)
    attention_scale: float | None = None  # what q · k is multiplied by; 1/√Dh when None
    embedding_scale: float = 1.0  # Gemma multiplies the token embeddings by √D
    embedding_norm: bool = True  # a norm over the embeddings (none in the decoders)
    first_attention_norm: bool = True  # pre-norm: ModernBERT's first layer has none (its embeddings are normed)
    sandwich_norm: bool = False  # Gemma 3: a norm over the attention's and the feed-forward's outputs too
    rope_scaling: RopeScaling | None = None  # the global layers' rotary scaling, when the config declares one
    local_rope_scaling: RopeScaling | None = None  # the local layers'
    final_logit_softcapping: float | None = None  # Gemma: tanh(logits / c) · c on the LM head's logits
    # DeBERTa
    disentangled: tuple[str, ...] = ()  # which of c2p, p2c the scores add
    relative_norm: bool = False  # the relative-position embeddings go through a LayerNorm (norm_rel_ebd)
    absolute_positions: bool = False  # a learned absolute table as well (position_biased_input)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        for name in ("type_vocab_size", "relative_buckets", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"config field {name!r} must be a non-negative integer, got {value!r}")
        for name in ("n_kv_heads", "head_width"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.head_width is None and self.d_model % self.n_heads != 0:
            raise ValueError(f"config field 'd_model' ({self.d_model}) must be divisible by 'n_heads' ({self.n_heads})")
        if self.n_heads % self.kv_heads != 0:
            raise ValueError(
                f"config field 'num_attention_heads' ({self.n_heads}) must be a multiple of "
                f"'num_key_value_heads' ({self.kv_heads})"
            )
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"config field 'position_embedding' must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                f"got {self.position_embedding!r}"
            )
        if self.position_embedding == "sinusoidal" and self.width % 2 != 0:
            raise ValueError(f"config field 'd_model' must be even for sinusoidal positions, got {self.d_model}")
        if self.position_embedding == "rotary" and self.head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head width, got {self.head_dim}")
        for name, kind in (("activation", Activation), ("attention", AttentionKind), ("norm", Norm)):
            if getattr(self, name) not in get_args(kind):
                known = ", ".join(get_args(kind))
                raise ValueError(f"config field {name!r} must be one of {known}, got {getattr(self, name)!r}")
        if not (self.layer_norm_eps > 0):
            raise ValueError(f"config field 'layer_norm_eps' must be positive, got {self.layer_norm_eps!r}")
        for name in ("sinusoid_base", "rope_theta", "local_rope_theta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 1):
                raise ValueError(f"config field {name!r} must be a finite number > 1, got {value!r}")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ValueError(f"config field 'embedding_size' must be positive, got {self.embedding_size!r}")
        if any(not 0 <= layer < self.n_layers for layer in self.local_layers):
            raise ValueError(f"local layers {self.local_layers} outside the model's {self.n_layers} layers")
        if self.local_layers and self.local_window < 1:
            raise ValueError("local layers need a sliding window ('sliding_window' or 'local_attention')")
        if self.position_embedding == "disentangled" and (
            self.relative_buckets < 1 or not set(self.disentangled) <= set(DISENTANGLED_TERMS)
        ):
            raise ValueError(
                f"DeBERTa's relative attention needs a positive span and terms among c2p, p2c, got "
                f"{self.relative_buckets} and {self.disentangled}"
            )

    @property
    def head_dim(self) -> int:
        """Dh, the width of one attention head."""
        return self.head_width or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: fewer than the query heads under grouped-query attention (each serves a group)."""
        return self.n_kv_heads or self.n_heads

    @property
    def qkv_widths(self) -> tuple[int, int, int]:
        """The widths of q, k and v in the fused projection: H · Dh, then Hkv · Dh twice."""
        return self.n_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim

    @property
    def width(self) -> int:
        """The width of the embedding tables (ELECTRA's embedding_size, D otherwise)."""
        return self.embedding_size or self.d_model

    @property
    def learned_positions(self) -> bool:
        """Whether a learned position table is added to the tokens (BERT, RoBERTa, MPNet; DeBERTa's optional one)."""
        learned = self.position_embedding in ("learned", "learned_offset", "relative_buckets")
        return learned or (self.position_embedding == "disentangled" and self.absolute_positions)

    @property
    def position_limit(self) -> int:
        """The longest text the positions allow: the table's length, less the padding index + 1 where positions
        count from there (RoBERTa, MPNet)."""
        offset = self.position_embedding in ("learned_offset", "relative_buckets")
        return self.max_positions - (self.pad_token_id + 1 if offset else 0)

    @property
    def causal(self) -> bool:
        return self.attention == "causal"

    @property
    def window_reach(self) -> int:
        """How far a local layer's query sees: keys j with |i − j| ≤ reach (and j ≤ i when causal).

        Causal (Mistral, Qwen, Gemma): the window W holds the query and the W − 1 keys before it (transformers'
        ``kv_idx > q_idx - W``). Bidirectional: W // 2 each side (ModernBERT's |i − j| ≤ W // 2; a bidirectional
        Gemma's ``abs(i − j) < W // 2 + 1``, the same keys)."""
        return self.local_window - 1 if self.causal else self.local_window // 2

    def is_local(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends within a sliding window."""
        return layer in self.local_layers

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> EncoderConfig:
        """Build a config from the dictionary of a Hugging Face ``config.json``."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported config field 'model_type': {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if model_type not in DECODERS:
            for flag in ("is_decoder", "add_cross_attention"):
                if hf.get(flag):
                    raise ValueError(f"unsupported config field {flag!r}: true (encoders are served bidirectional)")

        def required(name: str) -> Any:
            if name not in hf:
                raise ValueError(f"config.json lacks the required field {name!r}")
            return hf[name]

        def activation(field: str, default: str = "gelu") -> Activation:
            value = hf.get(field, default)
            if value not in HF_ACTIVATIONS:
                raise ValueError(
                    f"unsupported config field {field!r}: {value!r} (supported: {', '.join(HF_ACTIVATIONS)})"
                )
            return HF_ACTIVATIONS[value]

        if model_type == "distilbert":
            return cls._distilbert(hf, required, activation("activation"))
        if model_type == "modernbert":
            return cls._modernbert(hf, required, activation("hidden_activation"))
        if model_type in DECODERS:
            return cls._decoder(hf, required, activation)
        if model_type == "deberta-v2":
            return cls._deberta(hf, required, activation("hidden_act"))
        return cls._bert_like(hf, required, activation("hidden_act"))

    @classmethod
    def _distilbert(cls, hf: dict[str, Any], required: Any, activation: Activation) -> EncoderConfig:
        return cls(
            family="distilbert",
            vocab_size=required("vocab_size"),
            d_model=required("dim"),
            n_heads=required("n_heads"),
            n_layers=required("n_layers"),
            d_ff=required("hidden_dim"),
            max_positions=required("max_position_embeddings"),
            type_vocab_size=0,
            position_embedding="sinusoidal" if hf.get("sinusoidal_pos_embds") else "learned",
            activation=activation,
            layer_norm_eps=1e-12,  # fixed in DistilBERT's code
            pad_token_id=hf.get("pad_token_id", 0) or 0,
        )

    @classmethod
    def _bert_like(cls, hf: dict[str, Any], required: Any, activation: Activation) -> EncoderConfig:
        """BERT and the families that share its layers: RoBERTa's kin, MPNet, ELECTRA."""
        model_type = hf["model_type"]
        position_type = hf.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"unsupported config field 'position_embedding_type': {position_type!r} (supported: 'absolute')"
            )
        common = {
            "family": model_type,
            "vocab_size": required("vocab_size"),
            "d_model": required("hidden_size"),
            "n_heads": required("num_attention_heads"),
            "n_layers": required("num_hidden_layers"),
            "d_ff": required("intermediate_size"),
            "max_positions": required("max_position_embeddings"),
            "activation": activation,
            "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-12)),
        }
        if model_type == "mpnet":
            return cls(
                **common,
                type_vocab_size=0,
                position_embedding="relative_buckets",
                pad_token_id=1,  # MPNet's padding index is fixed at 1 in its code
                relative_buckets=hf.get("relative_attention_num_buckets", 32),
            )
        if model_type in ROBERTA_LIKE:
            return cls(
                **common,
                type_vocab_size=hf.get("type_vocab_size", 1),
                position_embedding="learned_offset",
                pad_token_id=hf.get("pad_token_id", 1),
            )
        embedding_size = hf.get("embedding_size") if model_type == "electra" else None
        return cls(
            **common,
            type_vocab_size=hf.get("type_vocab_size", 2),
            position_embedding="learned",
            pad_token_id=hf.get("pad_token_id", 0) or 0,
            embedding_size=embedding_size if embedding_size != common["d_model"] else None,
        )

    @classmethod
    def _modernbert(cls, hf: dict[str, Any], required: Any, activation: Activation) -> EncoderConfig:
        biases = {name: bool(hf.get(name, False)) for name in ("attention_bias", "mlp_bias", "norm_bias")}
        if len(set(biases.values())) != 1:
            raise ValueError(f"unsupported ModernBERT config: biases must be all on or all off, got {biases}")
        bias = biases["attention_bias"]
        n_layers = required("num_hidden_layers")
        layer_types = hf.get("layer_types")
        if layer_types is not None:  # written by newer transformers: one entry per layer
            local_layers = _local_layers(layer_types, n_layers)
        else:
            every = hf.get("global_attn_every_n_layers", 3)
            local_layers = tuple(i for i in range(n_layers) if i % every != 0)
        rope = hf.get("rope_parameters") or {}
        rope_theta = rope.get("full_attention", {}).get("rope_theta", hf.get("global_rope_theta", 160000.0))
        local_rope_theta = rope.get("sliding_attention", {}).get("rope_theta", hf.get("local_rope_theta", 10000.0))
        return cls(
            family="modernbert",
            vocab_size=required("vocab_size"),
            d_model=required("hidden_size"),
            n_heads=required("num_attention_heads"),
            n_layers=n_layers,
            d_ff=required("intermediate_size"),
            max_positions=required("max_position_embeddings"),
            type_vocab_size=0,
            position_embedding="rotary",
            activation=activation,
            layer_norm_eps=float(hf.get("norm_eps", 1e-5)),
            pad_token_id=hf.get("pad_token_id", 0) or 0,
            pre_norm=True,
            first_attention_norm=False,
            glu=True,
            qkv_bias=bias,
            out_bias=bias,
            ffn_bias=bias,
            norm_bias=bias,
            rope_theta=float(rope_theta),
            local_rope_theta=float(local_rope_theta),
            local_window=hf.get("local_attention", 128),
            local_layers=local_layers,
        )

    @classmethod
    def _decoder(cls, hf: dict[str, Any], required: Any, activation: Callable[..., Activation]) -> EncoderConfig:
        """Qwen2, Qwen3, Llama, Mistral and Gemma 3 (text), as transformers reads their configs."""
        model_type = hf["model_type"]
        gemma = model_type == "gemma3_text"
        n_layers = required("num_hidden_layers")
        d_model = required("hidden_size")
        n_heads = required("num_attention_heads")
        for field in ("attn_logit_softcapping", "partial_rotary_factor"):
            if hf.get(field) not in (None, 1, 1.0):
                raise ValueError(f"unsupported config field {field!r}: {hf[field]!r}")

        window, local_layers = _decoder_windows(hf, n_layers)
        full, sliding = _decoder_rope(hf)

        attention_bias = bool(hf.get("attention_bias", False))
        default_kv_heads, default_head_dim = DECODER_DEFAULTS[model_type]
        kv_heads = hf.get("num_key_value_heads", default_kv_heads) or n_heads
        head_dim = hf.get("head_dim", default_head_dim) or d_model // n_heads
        d_ff = required("intermediate_size")
        return cls(
            family=model_type,
            vocab_size=required("vocab_size"),
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            d_ff=d_ff,
            max_positions=required("max_position_embeddings"),
            type_vocab_size=0,
            position_embedding="rotary",
            activation=activation("hidden_activation" if gemma else "hidden_act", "silu"),
            layer_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            pad_token_id=hf.get("pad_token_id") or 0,
            pre_norm=True,
            glu=True,
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            out_bias=False if model_type == "qwen2" else attention_bias,
            ffn_bias=bool(hf.get("mlp_bias", False)),
            norm_bias=False,
            rope_theta=float(full["rope_theta"]),
            local_rope_theta=float(sliding["rope_theta"]),
            rope_scaling=_rope_scaling(full),
            local_rope_scaling=_rope_scaling(sliding),
            local_window=window or 0,
            local_layers=local_layers,
            attention="bidirectional" if gemma and hf.get("use_bidirectional_attention") else "causal",
            n_kv_heads=kv_heads,
            head_width=head_dim,
            norm="rmsnorm",
            norm_offset=1.0 if gemma else 0.0,
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            attention_scale=hf.get("query_pre_attn_scalar", 256) ** -0.5 if gemma else None,
            embedding_scale=d_model**0.5 if gemma else 1.0,
            embedding_norm=False,
            sandwich_norm=gemma,
            final_logit_softcapping=hf.get("final_logit_softcapping"),
        )

    @classmethod
    def _deberta(cls, hf: dict[str, Any], required: Any, activation: Activation) -> EncoderConfig:
        """DeBERTa-v2 and v3: BERT's post-norm layers with disentangled relative attention."""
        d_model = required("hidden_size")
        n_heads = required("num_attention_heads")
        unsupported = {
            "conv_kernel_size": hf.get("conv_kernel_size", 0) not in (0, None),
            "share_att_key": not hf.get("share_att_key", False),
            "embedding_size": hf.get("embedding_size", d_model) != d_model,
            "attention_head_size": hf.get("attention_head_size", d_model // n_heads) != d_model // n_heads,
        }
        for field, refused in unsupported.items():
            if refused:
                raise ValueError(f"unsupported DeBERTa config field {field!r}: {hf.get(field)!r}")
        terms = hf.get("pos_att_type") or []
        if isinstance(terms, str):  # older configs: "p2c|c2p"
            terms = [term.strip() for term in terms.lower().split("|")]
        if not set(terms) <= set(DISENTANGLED_TERMS):
            raise ValueError(f"unsupported config field 'pos_att_type': {terms!r} (supported: c2p, p2c)")
        absolute = bool(hf.get("position_biased_input", True))
        relative = bool(hf.get("relative_attention", False))
        if not relative and not absolute:
            raise ValueError("a DeBERTa config without relative attention needs position_biased_input")
        max_positions = required("max_position_embeddings")
        max_relative = hf.get("max_relative_positions", -1)
        max_relative = max_positions if max_relative < 1 else max_relative
        buckets = hf.get("position_buckets", -1)
        head_dim = d_model // n_heads
        return cls(
            family="deberta-v2",
            vocab_size=required("vocab_size"),
            d_model=d_model,
            n_heads=n_heads,
            n_layers=required("num_hidden_layers"),
            d_ff=required("intermediate_size"),
            max_positions=max_positions,
            type_vocab_size=hf.get("type_vocab_size", 0),
            position_embedding="disentangled" if relative else "learned",
            activation=activation,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-7)),
            pad_token_id=hf.get("pad_token_id", 0) or 0,
            relative_buckets=(buckets if buckets > 0 else max_relative) if relative else 0,
            relative_max_distance=max_relative,
            disentangled=tuple(terms) if relative else (),
            relative_norm="layer_norm" in str(hf.get("norm_rel_ebd", "none")).lower(),
            absolute_positions=absolute,
            # the scores are divided by √(Dh · (1 + the number of position terms)), whether or not they are added
            attention_scale=1.0 / math.sqrt(head_dim * (1 + len(terms))),
        )

    @classmethod
    def from_json_file(cls, path: Path) -> EncoderConfig:
        """Read a Hugging Face ``config.json``."""
        try:
            hf = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        if not isinstance(hf, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return cls.from_hf(hf)


def _local_layers(layer_types: list[str], n_layers: int) -> tuple[int, ...]:
    """The indices of the ``sliding_attention`` entries of a config's ``layer_types``."""
    kinds = {"full_attention", "sliding_attention"}
    if len(layer_types) != n_layers or not set(layer_types) <= kinds:
        raise ValueError(
            f"unsupported config field 'layer_types': {layer_types} (one of {', '.join(sorted(kinds))} per layer)"
        )
    return tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")


def _decoder_windows(hf: dict[str, Any], n_layers: int) -> tuple[int | None, tuple[int, ...]]:
    """A decoder's sliding window (None without one) and the layers that attend within it, as transformers reads
    them for each family."""
    model_type = hf["model_type"]
    window = hf.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        window = None  # transformers reads the window only with use_sliding_window
    layer_types = hf.get("layer_types")
    if layer_types is None:
        if model_type in ("qwen2", "qwen3"):
            first = hf.get("max_window_layers", 28)
            layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
        elif model_type == "gemma3_text":
            pattern = hf.get("sliding_window_pattern", 6)
            layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
        else:  # Mistral: every layer within the window, when there is one; Llama: none
            layer_types = ["sliding_attention"] * n_layers
    return window, _local_layers(layer_types, n_layers) if window else ()


def _decoder_rope(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A decoder's rotary parameters for its full-attention and its sliding-window layers. transformers 5 writes
    rope_parameters (one dict, or one per layer type for Gemma 3), older versions rope_theta, rope_scaling and
    Gemma's rope_local_base_freq."""
    parameters = hf.get("rope_parameters") or {}
    if hf["model_type"] == "gemma3_text":
        full = dict(parameters.get("full_attention") or {})
        sliding = dict(parameters.get("sliding_attention") or {})
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        sliding.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
        if hf.get("rope_scaling"):
            full.update(hf["rope_scaling"])
        return full, sliding
    full = dict(parameters)
    full.setdefault("rope_theta", hf.get("rope_theta", 10_000.0))
    if hf.get("rope_scaling"):
        full.update(hf["rope_scaling"])
    return full, full


def _rope_scaling(parameters: dict[str, Any]) -> RopeScaling | None:
    """The scaling of one rope_parameters (or rope_scaling) dict; a clear refusal for a kind not implemented."""
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", float(parameters["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            float(parameters["factor"]),
            float(parameters["low_freq_factor"]),
            float(parameters["high_freq_factor"]),
            int(parameters["original_max_position_embeddings"]),
        )
    raise ValueError(f"unsupported rope scaling in config field 'rope_scaling': {kind!r} (supported: linear, llama3)")
