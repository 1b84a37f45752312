"""Pooling against straightforward per-sentence loops; the model's pooling config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model import PoolingConfig, TextEncoder, normalize, pool
from model.spec.checkpoint import Pooling


@pytest.fixture
def padded():
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4)
    lengths = [5, 2, 1]
    mask = torch.tensor([[1] * n + [0] * (5 - n) for n in lengths])
    return hidden, mask, lengths


def test_mean_pooling_averages_real_tokens_only(padded) -> None:
    hidden, mask, lengths = padded
    expected = torch.stack([hidden[i, :n].mean(0) for i, n in enumerate(lengths)])
    torch.testing.assert_close(pool(hidden, mask, "mean"), expected)


def test_max_pooling_ignores_padding(padded) -> None:
    hidden, mask, lengths = padded
    hidden = hidden.clone()
    hidden[mask == 0] = 100.0  # padding would win every max if it were counted
    expected = torch.stack([hidden[i, :n].max(0).values for i, n in enumerate(lengths)])
    torch.testing.assert_close(pool(hidden, mask, "max"), expected)


def test_cls_pooling_takes_the_first_token(padded) -> None:
    hidden, mask, _ = padded
    torch.testing.assert_close(pool(hidden, mask, "cls"), hidden[:, 0])


def test_normalize_gives_unit_rows(padded) -> None:
    hidden, _, _ = padded
    rows = normalize(hidden[:, 0])
    torch.testing.assert_close(rows.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(rows * hidden[:, 0].norm(dim=-1, keepdim=True), hidden[:, 0])


def test_unknown_pooling_is_rejected(padded) -> None:
    hidden, mask, _ = padded
    with pytest.raises(ValueError, match="pooling must be one of mean, cls, max"):
        pool(hidden, mask, "median")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
        ({"pooling_mode_max_tokens": True}, "max"),
        ({"pooling_mode_lasttoken": True}, "lasttoken"),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len_tokens"),
        ({"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        ({"pooling_mode": "lasttoken", "include_prompt": True}, "lasttoken"),  # sentence-transformers ≥ 5 writes this
    ],
)
def test_pooling_config_is_read_from_sentence_transformers_file(tmp_path: Path, flags: dict, mode: str) -> None:
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 4, **flags}))
    assert PoolingConfig.from_model_dir(tmp_path).mode == mode


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (
            {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
            "exactly one pooling mode",
        ),  # concatenated
        ({"pooling_mode_median_tokens": True}, "pooling_mode_median_tokens"),  # no such mode
        ({"pooling_mode": "median"}, "median"),
    ],
)
def test_pooling_config_defaults_to_mean_and_rejects_unsupported_modes(
    tmp_path: Path, flags: dict, problem: str
) -> None:
    assert PoolingConfig.from_model_dir(tmp_path).mode == "mean"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    with pytest.raises(ValueError, match=problem):
        PoolingConfig.from_model_dir(tmp_path)


def test_bundled_model_pools_by_mean(bundled_model: TextEncoder) -> None:
    assert bundled_model.card.pooling.mode == "mean"


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_embed_with_each_pooling_equals_pooling_the_hidden_states(bundled_model: TextEncoder, mode: Pooling) -> None:
    texts = ["pooling one", "and pooling a second, longer text"]
    batch = bundled_model.card.tokenizer.pad(bundled_model.card.tokenizer.encode(texts))
    hidden = bundled_model.forward(batch).last_hidden_state
    for row, text in enumerate(texts):
        n = int(batch.attention_mask[row].sum())
        tokens = hidden[row, :n]
        expected = {"mean": tokens.mean(0), "cls": tokens[0], "max": tokens.max(0).values}[mode]
        got = bundled_model.embed([text], pooling=mode, normalize_embeddings=False)[0]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "activation", [torch.nn.Identity, torch.nn.Tanh, torch.nn.ReLU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Sigmoid]
)
def test_a_dense_module_computes_what_sentence_transformers_saved(tmp_path: Path, activation: type) -> None:
    """Each activation_function a Dense module may name runs as sentence-transformers runs it."""
    from sentence_transformers.sentence_transformer.modules import Dense as STDense

    from model.nn.pooling import Dense
    from model.spec.checkpoint import DenseSpec

    torch.manual_seed(0)
    reference = STDense(8, 5, bias=True, activation_function=activation())
    reference.save(str(tmp_path))
    spec = DenseSpec.read(tmp_path)
    assert spec.affine == (activation is torch.nn.Identity)
    x = torch.randn(4, 8) * 3
    expected = reference({"sentence_embedding": x})["sentence_embedding"]
    torch.testing.assert_close(Dense.load(spec)(x), expected)
