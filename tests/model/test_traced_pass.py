"""The embedding pass as a traced graph equals the eager pass, for every family, shape and precision."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from app.metrics import Metrics
from app.serving.registry import load_registry
from app.settings import Settings
from model import EmbeddingSpec, TextEncoder, load_model, tasks
from tests.families import FAMILIES, FAMILY_SPECS, write_family_model
from tests.helpers import local_model, needs_cpu_bfloat16, write_tiny_model

WORDS = "the quick brown fox jumps over a lazy dog while cats sat on mats and said hello to the world".split()


def random_texts(rng: random.Random, n: int, longest: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]


@pytest.fixture(scope="module", params=["bert", *FAMILIES])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(f"traced-{request.param}")
    if request.param == "bert":
        return write_tiny_model(directory, head="sequence-classification", num_labels=3)
    heads = FAMILY_SPECS[request.param].heads
    return write_family_model(
        directory, request.param, head="sequence-classification" if "sequence-classification" in heads else heads[0]
    )


def test_the_traced_pass_equals_the_eager_pass_on_any_batch(model_dir: Path) -> None:
    traced = load_model(model_dir, device="cpu", dtype="float32")
    eager = load_model(model_dir, device="cpu", dtype="float32", traced=False)
    assert traced.graph is not None and eager.graph is None
    rng = random.Random(0)
    spec = EmbeddingSpec(traced.card.config.n_layers, "mean", True, token_vectors=True)
    # One text (no padding), many, pairs, and lengths other than the traced example's.
    batches = [random_texts(rng, 1, 3), random_texts(rng, 1, 40), random_texts(rng, 7, 25), random_texts(rng, 3, 2)]
    for texts in batches:
        ours = tasks.embed_texts(traced, traced.card.tokenizer.encode(texts), [spec] * len(texts))
        theirs = tasks.embed_texts(eager, eager.card.tokenizer.encode(texts), [spec] * len(texts))
        for mine, reference in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(mine.sentence, reference.sentence, atol=1e-6)
            assert mine.tokens is not None and reference.tokens is not None
            np.testing.assert_allclose(mine.tokens, reference.tokens, atol=1e-5)
    if traced.card.scores_method is None and traced.classifier is None:  # an embedder alone (EmbeddingGemma)
        return
    texts, pairs = random_texts(rng, 4, 12), [*random_texts(rng, 3, 9), None]
    np.testing.assert_allclose(
        tasks.logits(traced, traced.card.tokenizer.encode(texts, pairs)).numpy(),
        tasks.logits(eager, eager.card.tokenizer.encode(texts, pairs)).numpy(),
        atol=1e-5,
    )


@needs_cpu_bfloat16
def test_the_traced_pass_keeps_bfloat16_products(tiny_model_dir: Path) -> None:
    """Traced under autocast, the graph holds the casts: it equals the eager bfloat16 pass, not float32's."""
    traced = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    eager = load_model(tiny_model_dir, device="cpu", dtype="bfloat16", traced=False)
    full = load_model(tiny_model_dir, device="cpu", dtype="float32", traced=False)
    texts = random_texts(random.Random(1), 5, 20)
    ours = traced.embed(texts)
    torch.testing.assert_close(ours, eager.embed(texts), atol=1e-6, rtol=0)
    assert not torch.equal(ours, full.embed(texts))


def test_too_long_a_batch_is_refused_before_the_graph(tiny_model: TextEncoder) -> None:
    assert tiny_model.graph is not None
    positions = tiny_model.encoder.embeddings.max_length
    ids = torch.ones(1, positions + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="longer than the model's positions"):
        tiny_model.last_hidden_state(ids, torch.ones_like(ids), torch.zeros_like(ids))


@pytest.mark.parametrize("traced", [True, False])
def test_the_setting_chooses_the_traced_or_the_eager_pass(tiny_model_dir: Path, traced: bool) -> None:
    registry = load_registry(Settings(model_dir=tiny_model_dir, traced_pass=traced), Metrics())
    try:
        assert (local_model(registry.get()).graph is not None) is traced
    finally:
        registry.close()
