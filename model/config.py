"""Encoder configuration: our own frozen dataclass, built from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PositionEmbedding = Literal["learned", "learned_offset", "sinusoidal", "relative_buckets", "rotary"]
POSITION_EMBEDDINGS: tuple[PositionEmbedding, ...] = (
    "learned",  # BERT: a learned table, position t at row t
    "learned_offset",  # RoBERTa, MPNet: a learned table, real tokens counted from the padding index + 1
    "sinusoidal",  # the paper's (and the seeds') fixed sinusoid
    "relative_buckets",  # MPNet's bias on the scores, besides its learned table (reported as such)
    "rotary",  # ModernBERT: q and k rotated by position-dependent angles, no table
)
Activation = Literal["gelu", "gelu_tanh", "relu"]
Family = Literal["bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "electra", "modernbert"]

# Hugging Face `hidden_act` values and the activation each one names here.
HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
SUPPORTED_MODEL_TYPES: tuple[Family, ...] = (
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "electra",
    "modernbert",
)
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522  # rows of the token-embedding table
    d_model: int = 384  # D, the width of every token vector (hidden_size)
    n_heads: int = 12  # H, attention heads per layer; each head is Dh = D // H wide
    n_layers: int = 6  # N, encoder layers (blocks)
    d_ff: int = 1536  # width of the position-wise feed-forward layer (intermediate_size)
    max_positions: int = 512  # the longest sequence the position embeddings cover
    type_vocab_size: int = 2  # segment ids: sentence A = 0, sentence B = 1; 0 = no segment embeddings
    position_embedding: PositionEmbedding = "learned"  # how positions enter: see POSITION_EMBEDDINGS
    activation: Activation = "gelu"  # feed-forward non-linearity: GELU for BERT, ReLU as in the paper
    layer_norm_eps: float = 1e-12  # epsilon of every LayerNorm
    pad_token_id: int = 0  # id of the padding token ([PAD], <pad>)
    sinusoid_base: float = 10000.0  # wavelength base of the sinusoidal encoding
    family: Family = "bert"  # the checkpoint's model_type: which tensor names its weights have
    embedding_size: int | None = None  # ELECTRA: embeddings narrower than D, projected up to D
    pre_norm: bool = False  # LayerNorm before attention and feed-forward (and a final norm), not after
    glu: bool = False  # gated feed-forward: act(x W₁ₐ) ⊙ (x W₁ᵦ), then W₂ (ModernBERT's GeGLU)
    bias: bool = True  # biases in the projections and the norms (ModernBERT has none)
    relative_buckets: int = 0  # MPNet: buckets of relative distance with a learned bias per head, shared by all layers
    relative_max_distance: int = 128  # MPNet: distances from this on share the last bucket
    rope_theta: float = 10000.0  # rotary base of the global layers
    local_rope_theta: float = 10000.0  # rotary base of the local (sliding-window) layers
    local_window: int = 0  # ModernBERT: a local layer's query sees keys within local_window // 2; 0 = none
    global_every: int = 1  # layer l is global when l % global_every == 0, local otherwise (if local_window)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions", "global_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        for name in ("type_vocab_size", "relative_buckets", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"config field {name!r} must be a non-negative integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"config field 'd_model' ({self.d_model}) must be divisible by 'n_heads' ({self.n_heads})")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"config field 'position_embedding' must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                f"got {self.position_embedding!r}"
            )
        if self.position_embedding == "sinusoidal" and self.width % 2 != 0:
            raise ValueError(f"config field 'd_model' must be even for sinusoidal positions, got {self.d_model}")
        if self.position_embedding == "rotary" and self.head_dim % 2 != 0:
            raise ValueError(f"rotary positions need an even head width, got {self.head_dim}")
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"config field 'activation' must be gelu, gelu_tanh or relu, got {self.activation!r}")
        if not (self.layer_norm_eps > 0):
            raise ValueError(f"config field 'layer_norm_eps' must be positive, got {self.layer_norm_eps!r}")
        for name in ("sinusoid_base", "rope_theta", "local_rope_theta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 1):
                raise ValueError(f"config field {name!r} must be a finite number > 1, got {value!r}")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ValueError(f"config field 'embedding_size' must be positive, got {self.embedding_size!r}")

    @property
    def head_dim(self) -> int:
        """Dh, the width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def width(self) -> int:
        """The width of the embedding tables (ELECTRA's embedding_size, D otherwise)."""
        return self.embedding_size or self.d_model

    def is_local(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends within a sliding window."""
        return self.local_window > 0 and layer % self.global_every != 0

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> EncoderConfig:
        """Build a config from the dictionary of a Hugging Face encoder ``config.json``."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported config field 'model_type': {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for flag in ("is_decoder", "add_cross_attention"):
            if hf.get(flag):
                raise ValueError(f"unsupported config field {flag!r}: true (only bidirectional encoders are served)")

        def required(name: str) -> Any:
            if name not in hf:
                raise ValueError(f"config.json lacks the required field {name!r}")
            return hf[name]

        def activation(field: str) -> Activation:
            value = hf.get(field, "gelu")
            if value not in HF_ACTIVATIONS:
                raise ValueError(
                    f"unsupported config field {field!r}: {value!r} (supported: {', '.join(HF_ACTIVATIONS)})"
                )
            return HF_ACTIVATIONS[value]

        if model_type == "distilbert":
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
                activation=activation("activation"),
                layer_norm_eps=1e-12,  # fixed in DistilBERT's code
                pad_token_id=hf.get("pad_token_id", 0) or 0,
            )
        if model_type == "modernbert":
            return cls._modernbert(hf, required, activation("hidden_activation"))

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
            "activation": activation("hidden_act"),
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
        n_layers = required("num_hidden_layers")
        layer_types = hf.get("layer_types")
        if layer_types is not None:  # written by newer transformers: one entry per layer
            local = [kind == "sliding_attention" for kind in layer_types]
            global_every = next((i for i in range(1, n_layers) if not local[i]), n_layers)
            if local != [i % global_every != 0 for i in range(n_layers)]:
                raise ValueError(f"unsupported ModernBERT layer_types: {layer_types} (a global layer every n layers)")
        else:
            global_every = hf.get("global_attn_every_n_layers", 3)
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
            glu=True,
            bias=biases["attention_bias"],
            rope_theta=float(rope_theta),
            local_rope_theta=float(local_rope_theta),
            local_window=hf.get("local_attention", 128),
            global_every=global_every,
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
