"""A model's card: everything the services need of a model (config, tokenizer, limits, pooling, prompts, heads),
read from its directory without its weights, and the same as the loaded model's."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from model import ModelCard, default_model_path, load_model
from tests.families import write_family_model

SAME = ("name", "max_tokens", "prompts", "default_prompt_name", "head", "answers", "pooling")


def card_without_weights(directory: Path, tmp_path: Path) -> ModelCard:
    """The card of a copy of ``directory`` whose main weights file is gone: reading it must not need them."""
    copy = tmp_path / directory.name
    shutil.copytree(directory, copy)
    (copy / "model.safetensors").unlink()
    return ModelCard.read(copy, name=directory.name)


@pytest.mark.parametrize(
    ("family", "head", "method", "dimension"),
    [
        ("embeddinggemma", None, None, 16),  # prompts, two Dense modules, bidirectional
        ("qwen3-reranker", "causal-lm", "yes-no", 16),
        ("qwen3", "sequence-classification", "cross-encoder", 16),
    ],
)
def test_a_card_read_without_weights_equals_the_loaded_models(
    tmp_path: Path, family: str, head: str | None, method: str | None, dimension: int
) -> None:
    overrides: dict[str, Any] = {"num_labels": 1} if head == "sequence-classification" else {}
    directory = write_family_model(tmp_path / "models" / family, family, head=head, **overrides)
    card = card_without_weights(directory, tmp_path / "cards")
    loaded = load_model(directory, device="cpu", dtype="float32")
    held = loaded.card  # a loaded model holds its card, the weights beside it
    for name in SAME:
        assert getattr(card, name) == getattr(held, name), name
    assert card.config == held.config
    assert (card.scores_method, card.dimension) == (method, dimension) == (held.scores_method, held.dimension)
    assert card.template_ids == held.template_ids
    assert card.tokenizer.encode(["a text"])[0].ids == held.tokenizer.encode(["a text"])[0].ids
    assert type(held) is ModelCard and not hasattr(held, "encoder")


def test_the_bundled_models_card_says_what_its_positions_and_limits_are(tmp_path: Path) -> None:
    card = card_without_weights(default_model_path(), tmp_path)
    assert (card.max_tokens, card.config.position_limit, card.position_table) == (256, 512, (512, 384))
    assert (card.dimension, card.pooling.mode, card.scores_method, card.relative_buckets) == (384, "mean", None, None)
    assert card.resolve_layer(-1) == 6 and card.prompt() is None


def test_a_card_says_which_positions_a_model_has(tmp_path: Path) -> None:
    """A rotary decoder has no table to add; DeBERTa has its relative buckets and, by default, no table."""
    qwen = ModelCard.read(write_family_model(tmp_path / "qwen3", "qwen3"))
    deberta = ModelCard.read(write_family_model(tmp_path / "deberta", "deberta-v2"))
    assert qwen.position_table is None and qwen.relative_buckets is None
    assert deberta.position_table is None and deberta.relative_buckets == 2 * deberta.config.relative_buckets
