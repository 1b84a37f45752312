"""Encoder configuration: our own frozen dataclass, built from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PositionEmbedding = Literal["learned", "sinusoidal"]
Activation = Literal["gelu", "gelu_tanh", "relu"]

# Hugging Face `hidden_act` values and the activation each one names here.
HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
SUPPORTED_MODEL_TYPES = ("bert",)


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522  # rows of the token-embedding table
    d_model: int = 384  # D, the width of every token vector (hidden_size)
    n_heads: int = 12  # H, attention heads per layer; each head is Dh = D // H wide
    n_layers: int = 6  # N, encoder layers (blocks)
    d_ff: int = 1536  # width of the position-wise feed-forward layer (intermediate_size)
    max_positions: int = 512  # the longest sequence the position embeddings cover
    type_vocab_size: int = 2  # segment ids: sentence A = 0, sentence B = 1
    position_embedding: PositionEmbedding = "learned"  # BERT's learned table, or the fixed sinusoid
    activation: Activation = "gelu"  # feed-forward non-linearity: GELU for BERT, ReLU as in the paper
    layer_norm_eps: float = 1e-12  # epsilon of every LayerNorm
    pad_token_id: int = 0  # id of [PAD]
    sinusoid_base: float = 10000.0  # wavelength base of the sinusoidal encoding

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"config field 'd_model' ({self.d_model}) must be divisible by 'n_heads' ({self.n_heads})")
        if self.position_embedding not in ("learned", "sinusoidal"):
            raise ValueError(
                f"config field 'position_embedding' must be 'learned' or 'sinusoidal', got {self.position_embedding!r}"
            )
        if self.position_embedding == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"config field 'd_model' must be even for sinusoidal positions, got {self.d_model}")
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"config field 'activation' must be gelu, gelu_tanh or relu, got {self.activation!r}")
        if not (self.layer_norm_eps > 0):
            raise ValueError(f"config field 'layer_norm_eps' must be positive, got {self.layer_norm_eps!r}")
        if not (math.isfinite(self.sinusoid_base) and self.sinusoid_base > 1):
            raise ValueError(f"config field 'sinusoid_base' must be a finite number > 1, got {self.sinusoid_base!r}")

    @property
    def head_dim(self) -> int:
        """Dh, the width of one attention head."""
        return self.d_model // self.n_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> EncoderConfig:
        """Build a config from the dictionary of a Hugging Face BERT-family ``config.json``."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported config field 'model_type': {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        position_type = hf.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"unsupported config field 'position_embedding_type': {position_type!r} (supported: 'absolute')"
            )
        for flag in ("is_decoder", "add_cross_attention"):
            if hf.get(flag):
                raise ValueError(f"unsupported config field {flag!r}: true (only bidirectional encoders are served)")
        hidden_act = hf.get("hidden_act", "gelu")
        if hidden_act not in HF_ACTIVATIONS:
            raise ValueError(
                f"unsupported config field 'hidden_act': {hidden_act!r} (supported: {', '.join(HF_ACTIVATIONS)})"
            )

        def required(name: str) -> Any:
            if name not in hf:
                raise ValueError(f"config.json lacks the required field {name!r}")
            return hf[name]

        return cls(
            vocab_size=required("vocab_size"),
            d_model=required("hidden_size"),
            n_heads=required("num_attention_heads"),
            n_layers=required("num_hidden_layers"),
            d_ff=required("intermediate_size"),
            max_positions=required("max_position_embeddings"),
            type_vocab_size=hf.get("type_vocab_size", 2),
            position_embedding="learned",
            activation=HF_ACTIVATIONS[hidden_act],
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_token_id=hf.get("pad_token_id", 0) or 0,
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
