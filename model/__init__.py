"""A transformer encoder in PyTorch: BERT-family encoders, DeBERTa, decoder embedders (all-MiniLM-L6-v2 by default)."""

from model.card import DEFAULT_MODEL_NAME, ModelCard, default_model_path
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
from model.heads import HeadConfig, SequenceClassificationHead
from model.inspection import AttentionSelection, IndexOutOfRange, attention_rollout, resolve_indices, select_attention
from model.loader import (
    EmbeddingSpec,
    MultiVectorOptions,
    MultiVectors,
    PositionQuery,
    Scores,
    SparseOptions,
    SparseVector,
    TextEmbedding,
    TextEncoder,
)
from model.pooling import PoolingConfig, normalize, pool, sentence_embeddings
from model.tokenizer import Batch, TextTokenizer, Token, TooManyTokensError
from model.weights import load_weights

__all__ = [
    "HeadConfig",
    "SequenceClassificationHead",
    "AttentionSelection",
    "EmbeddingSpec",
    "ModelCard",
    "MultiVectorOptions",
    "MultiVectors",
    "PositionQuery",
    "Scores",
    "SparseOptions",
    "SparseVector",
    "IndexOutOfRange",
    "TextEmbedding",
    "attention_rollout",
    "resolve_indices",
    "select_attention",
    "sentence_embeddings",
    "DEFAULT_MODEL_NAME",
    "Batch",
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "MultiHeadAttention",
    "PoolingConfig",
    "PositionwiseFeedForward",
    "TextEncoder",
    "TextTokenizer",
    "Token",
    "TooManyTokensError",
    "default_model_path",
    "load_weights",
    "normalize",
    "pool",
    "scaled_dot_product_attention",
    "sinusoidal_positional_encoding",
]
