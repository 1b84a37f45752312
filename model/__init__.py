"""A transformer encoder in PyTorch: BERT-family encoders, DeBERTa, decoder embedders (all-MiniLM-L6-v2 by default).

The package face: every name the service uses, each loaded from its module on first use, so that a process
that only reads model cards (a front end) never imports torch."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# Intel MKL, torch's float32 products on a CPU, computes a small product (a text of a few tokens: 5-9 rows) in another
# order on two threads than on one, so the same pass gave bits that differ by thread count, and the service's thread
# count for a pass follows its load (app/engine/compute.py). Its strict reproducible mode makes a product's bits
# independent of the thread count (for outputs of any width but 16 and 17 columns, measured on AMD EPYC with AVX2), at
# no measured cost (docs/operations.md, "The same numbers"). MKL reads it once, at its first product: set here, before
# any, unless the environment chooses.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

if TYPE_CHECKING:
    from model.nn.encoder import (
        Encoder,
        EncoderLayer,
        EncoderOutput,
        MultiHeadAttention,
        PositionwiseFeedForward,
        scaled_dot_product_attention,
        sinusoidal_positional_encoding,
    )
    from model.nn.heads import SequenceClassificationHead
    from model.nn.inspection import attention_rollout, select_attention
    from model.nn.pooling import normalize, pool, sentence_embeddings
    from model.runtime import tasks
    from model.runtime.loader import load_model, resolve_device
    from model.runtime.text_encoder import TextEncoder
    from model.runtime.weights import load_weights
    from model.spec.card import DEFAULT_MODEL_NAME, ModelCard, default_model_path
    from model.spec.checkpoint import YES_NO, HeadConfig, Pooling, PoolingConfig
    from model.spec.config import EncoderConfig
    from model.spec.late_interaction import maxsim
    from model.spec.outputs import (
        GPU_PASS_TOKENS,
        HEAD_STATISTICS,
        HEAD_STEP_ARRAYS,
        AttentionSelection,
        Attribution,
        AttributionOptions,
        EmbeddedTexts,
        EmbeddingSpec,
        HeadSteps,
        IndexOutOfRange,
        MultiVectorOptions,
        MultiVectors,
        PositionQuery,
        ScoredTexts,
        Scores,
        SparseOptions,
        SparseVector,
        TextEmbedding,
        joined_results,
        keep_dimensions,
        resolve_indices,
        score_rows,
        sentence_rows,
        token_rows,
        unit_rows,
    )
    from model.spec.tokenizer import (
        Batch,
        PackedTokens,
        TextTokenizer,
        Token,
        TokenIdOutOfRange,
        TokenIds,
        TokenSequence,
        TooManyTokensError,
        Word,
    )

# The package face: each name and the module it lives in. __all__ is derived from it; the imports above are the type
# checker's view of the same names (a test holds the two equal).
WHERE = {
    "AttentionSelection": "model.spec.outputs",
    "Attribution": "model.spec.outputs",
    "AttributionOptions": "model.spec.outputs",
    "Batch": "model.spec.tokenizer",
    "DEFAULT_MODEL_NAME": "model.spec.card",
    "EmbeddedTexts": "model.spec.outputs",
    "EmbeddingSpec": "model.spec.outputs",
    "Encoder": "model.nn.encoder",
    "EncoderConfig": "model.spec.config",
    "EncoderLayer": "model.nn.encoder",
    "EncoderOutput": "model.nn.encoder",
    "GPU_PASS_TOKENS": "model.spec.outputs",
    "HEAD_STATISTICS": "model.spec.outputs",
    "HEAD_STEP_ARRAYS": "model.spec.outputs",
    "HeadConfig": "model.spec.checkpoint",
    "HeadSteps": "model.spec.outputs",
    "IndexOutOfRange": "model.spec.outputs",
    "ModelCard": "model.spec.card",
    "MultiHeadAttention": "model.nn.encoder",
    "MultiVectorOptions": "model.spec.outputs",
    "MultiVectors": "model.spec.outputs",
    "PackedTokens": "model.spec.tokenizer",
    "Pooling": "model.spec.checkpoint",
    "PoolingConfig": "model.spec.checkpoint",
    "PositionQuery": "model.spec.outputs",
    "PositionwiseFeedForward": "model.nn.encoder",
    "ScoredTexts": "model.spec.outputs",
    "Scores": "model.spec.outputs",
    "SequenceClassificationHead": "model.nn.heads",
    "SparseOptions": "model.spec.outputs",
    "SparseVector": "model.spec.outputs",
    "TextEmbedding": "model.spec.outputs",
    "TextEncoder": "model.runtime.text_encoder",
    "TextTokenizer": "model.spec.tokenizer",
    "Token": "model.spec.tokenizer",
    "TokenIdOutOfRange": "model.spec.tokenizer",
    "TokenIds": "model.spec.tokenizer",
    "TokenSequence": "model.spec.tokenizer",
    "TooManyTokensError": "model.spec.tokenizer",
    "Word": "model.spec.tokenizer",
    "YES_NO": "model.spec.checkpoint",
    "attention_rollout": "model.nn.inspection",
    "default_model_path": "model.spec.card",
    "joined_results": "model.spec.outputs",
    "keep_dimensions": "model.spec.outputs",
    "load_model": "model.runtime.loader",
    "load_weights": "model.runtime.weights",
    "maxsim": "model.spec.late_interaction",
    "normalize": "model.nn.pooling",
    "pool": "model.nn.pooling",
    "resolve_device": "model.runtime.loader",
    "resolve_indices": "model.spec.outputs",
    "scaled_dot_product_attention": "model.nn.encoder",
    "select_attention": "model.nn.inspection",
    "sentence_embeddings": "model.nn.pooling",
    "tasks": "model.runtime",  # what each kind of task computes with a loaded model, one function per kind
    "score_rows": "model.spec.outputs",
    "sentence_rows": "model.spec.outputs",
    "token_rows": "model.spec.outputs",
    "sinusoidal_positional_encoding": "model.nn.encoder",
    "unit_rows": "model.spec.outputs",
}
__all__ = list(WHERE)
MODULES = {"tasks"}  # the names of WHERE that are modules rather than names defined in one


def __getattr__(name: str) -> Any:
    """A name of the package face, imported from its module the first time it is asked for."""
    if name not in WHERE:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    module = importlib.import_module(WHERE[name])
    if name in MODULES:  # a module of the package: its parent's attribute once imported
        importlib.import_module(f"{WHERE[name]}.{name}")
    value = getattr(module, name)
    globals()[name] = value
    return value
