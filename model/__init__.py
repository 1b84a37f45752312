"""A transformer encoder in PyTorch: BERT-family encoders, DeBERTa, decoder embedders (all-MiniLM-L6-v2 by default).

The package face: every name the service uses, each loaded from its module on first use, so that a process
that only reads model cards (a front end) never imports torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model.card import DEFAULT_MODEL_NAME, ModelCard, default_model_path
    from model.checkpoint import YES_NO, HeadConfig, Pooling, PoolingConfig
    from model.config import EncoderConfig
    from model.encoder import (
        Encoder,
        EncoderLayer,
        EncoderOutput,
        MultiHeadAttention,
        PositionwiseFeedForward,
        scaled_dot_product_attention,
        sinusoidal_positional_encoding,
    )
    from model.heads import SequenceClassificationHead
    from model.inspection import attention_rollout, select_attention
    from model.late_interaction import maxsim
    from model.loader import load_model, resolve_device
    from model.outputs import (
        GPU_PASS_TOKENS,
        HEAD_STATISTICS,
        HEAD_STEP_ARRAYS,
        AttentionSelection,
        EmbeddingSpec,
        IndexOutOfRange,
        MultiVectorOptions,
        MultiVectors,
        PositionQuery,
        Scores,
        SparseOptions,
        SparseVector,
        TextEmbedding,
        keep_dimensions,
        resolve_indices,
        unit_rows,
    )
    from model.pooling import normalize, pool, sentence_embeddings
    from model.text_encoder import TextEncoder
    from model.tokenizer import (
        Batch,
        TextTokenizer,
        Token,
        TokenIdOutOfRange,
        TokenIds,
        TokenSequence,
        TooManyTokensError,
    )
    from model.weights import load_weights

WHERE = {
    "AttentionSelection": "model.outputs",
    "Batch": "model.tokenizer",
    "DEFAULT_MODEL_NAME": "model.card",
    "EmbeddingSpec": "model.outputs",
    "Encoder": "model.encoder",
    "EncoderConfig": "model.config",
    "EncoderLayer": "model.encoder",
    "EncoderOutput": "model.encoder",
    "GPU_PASS_TOKENS": "model.outputs",
    "HEAD_STATISTICS": "model.outputs",
    "HEAD_STEP_ARRAYS": "model.outputs",
    "HeadConfig": "model.checkpoint",
    "IndexOutOfRange": "model.outputs",
    "ModelCard": "model.card",
    "MultiHeadAttention": "model.encoder",
    "MultiVectorOptions": "model.outputs",
    "MultiVectors": "model.outputs",
    "Pooling": "model.checkpoint",
    "PoolingConfig": "model.checkpoint",
    "PositionQuery": "model.outputs",
    "PositionwiseFeedForward": "model.encoder",
    "Scores": "model.outputs",
    "SequenceClassificationHead": "model.heads",
    "SparseOptions": "model.outputs",
    "SparseVector": "model.outputs",
    "TextEmbedding": "model.outputs",
    "TextEncoder": "model.text_encoder",
    "TextTokenizer": "model.tokenizer",
    "Token": "model.tokenizer",
    "TokenIdOutOfRange": "model.tokenizer",
    "TokenIds": "model.tokenizer",
    "TokenSequence": "model.tokenizer",
    "TooManyTokensError": "model.tokenizer",
    "YES_NO": "model.checkpoint",
    "attention_rollout": "model.inspection",
    "default_model_path": "model.card",
    "keep_dimensions": "model.outputs",
    "load_model": "model.loader",
    "load_weights": "model.weights",
    "maxsim": "model.late_interaction",
    "normalize": "model.pooling",
    "pool": "model.pooling",
    "resolve_device": "model.loader",
    "resolve_indices": "model.outputs",
    "scaled_dot_product_attention": "model.encoder",
    "select_attention": "model.inspection",
    "sentence_embeddings": "model.pooling",
    "sinusoidal_positional_encoding": "model.encoder",
    "unit_rows": "model.outputs",
}
__all__ = [
    "AttentionSelection",
    "Batch",
    "DEFAULT_MODEL_NAME",
    "EmbeddingSpec",
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "GPU_PASS_TOKENS",
    "HEAD_STATISTICS",
    "HEAD_STEP_ARRAYS",
    "HeadConfig",
    "IndexOutOfRange",
    "ModelCard",
    "MultiHeadAttention",
    "MultiVectorOptions",
    "MultiVectors",
    "Pooling",
    "PoolingConfig",
    "PositionQuery",
    "PositionwiseFeedForward",
    "Scores",
    "SequenceClassificationHead",
    "SparseOptions",
    "SparseVector",
    "TextEmbedding",
    "TextEncoder",
    "TextTokenizer",
    "Token",
    "TokenIdOutOfRange",
    "TokenIds",
    "TokenSequence",
    "TooManyTokensError",
    "YES_NO",
    "attention_rollout",
    "default_model_path",
    "keep_dimensions",
    "load_model",
    "load_weights",
    "maxsim",
    "normalize",
    "pool",
    "resolve_device",
    "resolve_indices",
    "scaled_dot_product_attention",
    "select_attention",
    "sentence_embeddings",
    "sinusoidal_positional_encoding",
    "unit_rows",
]


def __getattr__(name: str) -> Any:
    """A name of the package face, imported from its module the first time it is asked for."""
    if name not in WHERE:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(WHERE[name]), name)
    globals()[name] = value
    return value
