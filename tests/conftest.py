"""Shared fixtures: a tiny random-weight BERT written to a temporary directory, and the bundled model."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from model import TextEncoder, default_model_path

TINY_WORDS = (
    "the quick brown fox jumps over lazy dog a cat sat on mat hello world attention is all you need "
    "what does this head look at token embedding layer norm model"
).split()
TINY_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
}


def tiny_tokenizer() -> Tokenizer:
    """A BERT-style WordPiece tokenizer over a few dozen words, letters and suffix pieces."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = TINY_SPECIALS + TINY_WORDS + letters + [f"##{c}" for c in letters] + list(".,!?")
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def write_tiny_model(directory: Path, seed: int = 0, **config_overrides: object) -> Path:
    """A random-weight BERT in Hugging Face layout: config.json, model.safetensors, tokenizer.json."""
    from transformers import BertConfig, BertModel

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    config = {**TINY_CONFIG, "vocab_size": tokenizer.get_vocab_size(), **config_overrides}
    torch.manual_seed(seed)
    bert = BertModel(BertConfig(**config), add_pooling_layer=True)
    with torch.no_grad():
        for parameter in bert.parameters():  # not the initialiser's ones and zeros: every weight matters
            parameter.normal_(0.0, 0.5)
    bert.save_pretrained(directory, safe_serialization=True)
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> TextEncoder:
    return TextEncoder.load(tiny_model_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def bundled_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def bundled_model() -> TextEncoder:
    return TextEncoder.load(device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def hf_bert(bundled_path: Path):
    """transformers' BertModel on the bundled checkpoint, eager attention so it can return probabilities."""
    from transformers import BertModel

    return BertModel.from_pretrained(bundled_path, attn_implementation="eager").eval()


def hf_forward(bert, batch, **outputs: bool):
    """transformers' BertModel on one of our padded batches (numpy arrays), without gradients."""
    with torch.inference_mode():
        return bert(
            input_ids=torch.from_numpy(batch.input_ids),
            attention_mask=torch.from_numpy(batch.attention_mask),
            token_type_ids=torch.from_numpy(batch.token_type_ids),
            **outputs,
        )


@pytest.fixture(scope="session")
def hf_tokenizer(bundled_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_path)


@pytest.fixture(scope="session")
def sentence_transformer(bundled_path: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_path), device="cpu")
