"""A transformer encoder in PyTorch: BERT-family encoders, DeBERTa, decoder embedders (all-MiniLM-L6-v2 by default)."""

from model.card import DEFAULT_MODEL_NAME, ModelCard, default_model_path
from model.config import EncoderConfig
from model.encoder import (
    HEAD_STEP_ARRAYS,
    Encoder,
    EncoderLayer,
    EncoderOutput,
    MultiHeadAttention,
    PositionwiseFeedForward,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)
from model.graphs import GPU_PASS_TOKENS
from model.heads import YES_NO, HeadConfig, SequenceClassificationHead
from model.inspection import (
    HEAD_STATISTICS,
    AttentionSelection,
    IndexOutOfRange,
    attention_rollout,
    resolve_indices,
    select_attention,
)
from model.late_interaction import maxsim
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
    resolve_device,
)
from model.pooling import PoolingConfig, keep_dimensions, normalize, pool, sentence_embeddings, unit_rows
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
    "GPU_PASS_TOKENS",
    "HEAD_STATISTICS",
    "HEAD_STEP_ARRAYS",
    "YES_NO",
    "TokenIdOutOfRange",
    "TokenIds",
    "TokenSequence",
    "keep_dimensions",
    "maxsim",
    "resolve_device",
    "unit_rows",
]
