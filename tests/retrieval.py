"""Retrieval checkpoints that the tests build with sentence-transformers itself (tiny, random weights): SPLADE
models (SparseEncoder) and ColBERT models (MultiVectorEncoder)."""

from __future__ import annotations

import shutil
import string
from pathlib import Path
from typing import Any

import torch

from tests.families import write_family_model
from tests.helpers import write_tiny_model

COLBERT_WIDTH = 8  # the ColBERT models' projection


def write_splade(directory: Path, family: str, pooling: str, seed: int) -> Path:
    """A tiny random ``...ForMaskedLM`` of ``family`` with SpladePooling, saved by sentence-transformers itself."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    if family == "bert":  # the tiny BERT of the other tests, with its masked-LM head
        from transformers import BertConfig, BertForMaskedLM

        base = write_tiny_model(directory / "base")
        torch.manual_seed(seed)
        mlm = directory / "mlm"
        BertForMaskedLM(BertConfig.from_pretrained(base)).save_pretrained(mlm)
        shutil.copy(base / "tokenizer.json", mlm / "tokenizer.json")
    else:
        mlm = write_family_model(directory / "mlm", family, head="masked-lm", seed=seed)
    transformer = Transformer(str(mlm), transformer_task="fill-mask")
    splade = SpladePooling(pooling)  # type: ignore[arg-type]
    SparseEncoder(modules=[transformer, splade], device="cpu").save(str(directory / "splade"))
    return directory / "splade"


def write_colbert(directory: Path, base: Path, expansion: dict | None, **options: Any) -> Path:
    """A MultiVectorEncoder saved by sentence-transformers itself over ``base``: Transformer (with the query
    expansion and the document length), a Dense projection to COLBERT_WIDTH, a MultiVectorMask, and Normalize unless
    ``normalize`` is false."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    transformer = Transformer(str(base), document_length=options.get("document_length", 20), query_expansion=expansion)
    torch.manual_seed(5)
    dense = Dense(
        transformer.get_embedding_dimension(),
        COLBERT_WIDTH,
        bias=bool(options.get("bias", False)),
        activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings",
    )
    mask = MultiVectorMask(
        skiplist_words=list(string.punctuation), skiplist_tasks=options.get("skiplist_tasks", ["document"])
    )
    modules = [transformer, dense, mask]
    if options.get("normalize", True):
        modules.append(Normalize(module_input_name="token_embeddings"))
    model = MultiVectorEncoder(
        modules=modules,
        prompts={"query": "query: ", "document": "passage: "},
        similarity_fn_name=options.get("similarity", "maxsim"),
        device="cpu",
    )
    model.save(str(directory))
    return directory
