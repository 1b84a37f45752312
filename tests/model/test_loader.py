"""Device, dtype and layer choices of the loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import EncoderConfig, TextEncoder, load_model
from model.runtime import loader
from model.runtime.loader import resolve_device, resolve_precision
from tests.helpers import needs_cpu_bfloat16, with_triton


def test_bundled_config_is_read_from_config_json(bundled_model: TextEncoder) -> None:
    assert bundled_model.card.config == EncoderConfig(
        vocab_size=30522,
        d_model=384,
        n_heads=12,
        n_layers=6,
        d_ff=1536,
        max_positions=512,
        type_vocab_size=2,
        position_embedding="learned",
        activation="gelu",
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )
    assert bundled_model.card.name == "all-MiniLM-L6-v2"


def test_auto_device_is_cuda_only_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@pytest.mark.parametrize(
    ("dtype", "device", "bf16_units", "weights", "compute"),
    [
        ("auto", "cuda", False, torch.float16, torch.float16),  # half precision by default on the GPU
        ("auto", "cpu", False, torch.float32, torch.float32),  # exact on a CPU
        ("auto", "cpu", True, torch.float32, torch.float32),  # exact even where AMX is there (API.md, part four)
        ("float32", "cpu", True, torch.float32, torch.float32),  # an explicit choice wins
        ("float32", "cuda", False, torch.float32, torch.float32),  # float32 selectable on the GPU
        ("bfloat16", "cpu", True, torch.float32, torch.bfloat16),  # CPU: float32 weights, bf16 products
        ("bfloat16", "cuda", False, torch.bfloat16, torch.bfloat16),  # GPU: weights in the dtype
    ],
)
def test_precision_choice(monkeypatch, dtype, device, bf16_units, weights, compute) -> None:
    monkeypatch.setattr(loader, "cpu_bfloat16", lambda: bf16_units)
    precision = resolve_precision(dtype, torch.device(device))
    assert (precision.weights, precision.compute) == (weights, compute)
    assert precision.autocast == (weights != compute)


def test_unknown_dtype_and_device_are_rejected() -> None:
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_precision("float8", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("abacus")


def test_model_is_in_eval_mode_without_gradients(bundled_model: TextEncoder) -> None:
    assert not bundled_model.encoder.training
    assert not any(p.requires_grad for p in bundled_model.encoder.parameters())


@pytest.mark.parametrize(("layer", "index"), [(-1, 6), (0, 0), (3, 3), (-7, 0), (6, 6)])
def test_layer_indices_count_from_the_end_when_negative(bundled_model: TextEncoder, layer: int, index: int) -> None:
    assert bundled_model.card.resolve_layer(layer) == index


@pytest.mark.parametrize("layer", [7, -8])
def test_layer_out_of_range_is_rejected(bundled_model: TextEncoder, layer: int) -> None:
    with pytest.raises(ValueError, match="layer must be between -7 and 6"):
        bundled_model.card.resolve_layer(layer)


@needs_cpu_bfloat16
def test_half_precision_model_runs_and_stays_close_to_float32(tiny_model_dir, tiny_model: TextEncoder) -> None:
    half = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    texts = ["the quick brown fox", "hello world"]
    torch.testing.assert_close(half.embed(texts), tiny_model.embed(texts), atol=5e-2, rtol=0)


FALLBACK = """
import json, logging, sys, torch
from model import load_model
from model.runtime import loader
from model.nn.encoder import Embeddings, EncoderLayer
from model.nn.kernels import triton_available
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
model = load_model(sys.argv[1], device="cpu", dtype="float32", runtime="torch", traced=False)
batch = loader.example_batch(model)
with torch.inference_mode():
    before = model.passes(*batch).last_hidden_state
loader.fuse_kernels(model, "tiny")
modules = list(model.passes.modules())
with torch.inference_mode():
    after = model.passes(*batch).last_hidden_state
print(json.dumps({
    "triton": triton_available(),
    "blocks": sum(isinstance(m, EncoderLayer) for m in modules),
    "embeddings": sum(isinstance(m, Embeddings) for m in modules),
    "fused": sum(bool(getattr(m, "norms_fused", False)) for m in modules),
    "difference": (after - before).abs().max().item(),
}))
"""


def test_fused_norms_that_cannot_run_give_way_to_torchs(tiny_model_dir: Path) -> None:
    """``fuse_kernels`` tries Triton's kernels once before the pass relies on them: where they cannot run (here on
    CPU tensors without Triton's interpreter, as on a GPU host without a C compiler) the norms go back to torch's,
    a warning says why, and the pass gives what it gave before. In a process of its own, which has Triton."""
    found, stderr = with_triton(FALLBACK, str(tiny_model_dir), interpret=False)
    assert found["triton"]  # a dev dependency on Linux x86-64
    assert found["blocks"] > 0 and found["embeddings"] == 1
    assert "the fused norms of tiny could not run here, torch's kernels instead" in stderr
    assert found["fused"] == 0
    assert found["difference"] < 1e-5  # the GELU in the product: the same maths


def test_the_score_heads_are_kept_in_the_explicit_paths_dtype(tmp_path: Path) -> None:
    """Under float16 on a GPU over a float32 checkpoint (weights and products float16, explicit paths float32) the
    classifier and a yes/no reranker's rows stay float32: explanations' gradients run through them, exactly; the
    pass's hidden state is widened to them. Their values are the checkpoint's, not float16's rounding of them."""
    from model.spec.card import read_card
    from tests.app.test_tasks import classifier_dir
    from tests.families import write_family_model

    half_over_float32 = loader.Precision(torch.float16, torch.float16, torch.float32)
    assert resolve_precision("auto", torch.device("cuda")) == half_over_float32
    for directory in (
        classifier_dir(tmp_path, "bert"),
        write_family_model(tmp_path / "r", "qwen3-reranker", head="causal-lm"),
    ):
        card = read_card(directory, None, None)
        heads = loader.load_heads(card, directory / "model.safetensors", torch.device("cpu"), half_over_float32)
        exact = loader.load_heads(
            card,
            directory / "model.safetensors",
            torch.device("cpu"),
            loader.Precision(torch.float32, torch.float32, torch.float32),
        )
        head = heads.get("classifier", heads.get("reranker"))
        reference = exact.get("classifier", exact.get("reranker"))
        assert head is not None and reference is not None
        for mine, theirs in zip(head.parameters(), reference.parameters(), strict=True):
            assert mine.dtype == torch.float32
            assert torch.equal(mine, theirs)
