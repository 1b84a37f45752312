"""The Triton kernel of model/nn/kernels.py (residual + LayerNorm in one pass) against torch's LayerNorm in float64:
on a CPU through Triton's interpreter, on a GPU compiled."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from model import EncoderConfig
from model.nn.encoder import EncoderLayer
from tests.helpers import with_triton

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Widths of the families' post-norm blocks (MiniLM 384, BERT-base 768, BERT-large 1,024), one not a power of two
# and one odd; rows not a multiple of the kernel's block of rows; with and without the norm's bias.
CASES = [(384, True), (768, True), (1024, True), (100, False), (37, True)]


def errors(device: str, dtype: torch.dtype) -> dict[str, list[float]]:
    """For each case: the kernel's largest distance from LN(x + residual) computed in float64, and torch's
    two-kernel path's (the sum rounded to ``dtype``, then LayerNorm), beyond one rounding to ``dtype``."""
    from model.nn.kernels import add_layer_norm

    found: dict[str, list[float]] = {}
    generator = torch.Generator().manual_seed(0)
    for width, bias in CASES:
        norm = torch.nn.LayerNorm(width, eps=1e-12, bias=bias)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(width, generator=generator))
            if norm.bias is not None:
                norm.bias.copy_(torch.randn(width, generator=generator))
        norm = norm.to(device, dtype)
        x = (torch.randn(3, 41, width, generator=generator) * 4).to(device, dtype)
        residual = torch.randn(3, 41, width, generator=generator).to(device, dtype)
        exact = torch.nn.functional.layer_norm(
            x.double() + residual.double(),
            (width,),
            norm.weight.double(),
            norm.bias.double() if norm.bias is not None else None,
            norm.eps,
        )
        with torch.inference_mode():
            fused = add_layer_norm(x, residual, norm)
            assert fused.dtype == dtype and fused.shape == x.shape
            two_kernels = norm(x + residual)
        case = f"{width}{'' if bias else ' no bias'}"
        found[case] = [beyond_rounding(fused, exact), beyond_rounding(two_kernels, exact)]
    return found


def beyond_rounding(found: torch.Tensor, exact: torch.Tensor) -> float:
    """How far ``found`` strays from the exact values beyond rounding them once to its dtype (half the spacing of
    that dtype at each value): 0 where each value is correctly rounded, float32's arithmetic error else."""
    info = torch.finfo(found.dtype)
    spacing = torch.exp2(torch.floor(torch.log2(exact.abs().clamp(min=info.tiny)))) * info.eps
    return ((found.double() - exact).abs() - spacing / 2).clamp(min=0).max().item()


# The families' embeddings a pass fuses: BERT's, RoBERTa's (positions after the padding index, one segment row), a
# sinusoid's without segments
EMBEDDINGS: dict[str, dict[str, Any]] = {
    "learned, two segments": {"position_embedding": "learned", "type_vocab_size": 2},
    "learned_offset, one segment": {"position_embedding": "learned_offset", "type_vocab_size": 1, "pad_token_id": 1},
    "sinusoidal, no segments": {"position_embedding": "sinusoidal", "type_vocab_size": 0},
}


def embedding_errors(device: str, dtype: torch.dtype) -> dict[str, float]:
    """For each of EMBEDDINGS: the largest distance of the fused embeddings (``Embeddings.fuse_norm``) in ``dtype``
    from the module's own float32 forward, on right-padded rows with both segments."""
    from model.nn.encoder import Embeddings

    found = {}
    for name, fields in EMBEDDINGS.items():
        config = EncoderConfig(vocab_size=60, d_model=48, n_heads=4, max_positions=40)
        config = replace(config, **fields)
        torch.manual_seed(0)
        embeddings = Embeddings(config).to(device).eval()
        with torch.no_grad():
            assert isinstance(embeddings.norm, torch.nn.LayerNorm)
            embeddings.norm.weight.normal_()
            embeddings.norm.bias.normal_()
        input_ids = torch.randint(2, 60, (3, 11), device=device)
        mask = torch.ones_like(input_ids)
        mask[1, 7:] = 0
        mask[2, 3:] = 0
        input_ids = input_ids.masked_fill(mask == 0, config.pad_token_id)
        segments = (torch.arange(11, device=device) >= 5).long().expand(3, 11) * mask
        with torch.inference_mode():
            exact = embeddings(input_ids, segments, mask)  # float32, torch's kernels
            half = embeddings.to(dtype)
            assert half.fuse_norm()
            fused = half(input_ids, segments, mask)
        assert fused.dtype == dtype and fused.shape == exact.shape
        found[name] = (fused.float() - exact).abs().max().item()
    return found


def test_the_fused_add_and_norm_equals_layer_norm_in_tritons_interpreter() -> None:
    """The kernel's arithmetic on a CPU: Triton's interpreter runs it on CPU tensors when TRITON_INTERPRET=1 was
    set before Triton was first imported, hence a process of its own. In float32 it is LayerNorm to float32's
    rounding; in float16 each value is the exact one correctly rounded, nearer than torch's two kernels, which
    round the sum first. (The interpreter truncates to bfloat16 where the GPU rounds, so bfloat16 is the GPU
    test's.)"""
    script = (
        "import json, torch; from tests.model.test_kernels import errors; "
        "print(json.dumps({str(d): errors('cpu', d) for d in (torch.float32, torch.float16)}))"
    )
    found, _ = with_triton(script, interpret=True)
    assert set(found["torch.float32"]) == {"384", "768", "1024", "100 no bias", "37"}
    for case, (fused, two_kernels) in found["torch.float32"].items():
        assert fused < 1e-5, (case, fused)
        assert two_kernels < 1e-5, (case, two_kernels)  # the reference itself: float32 LayerNorm
    for case, (fused, two_kernels) in found["torch.float16"].items():
        assert fused < 1e-5, (case, fused)
        assert two_kernels > 1e-4, (case, two_kernels)


def test_the_fused_embeddings_equal_the_modules_in_tritons_interpreter() -> None:
    """``Embeddings.fuse_norm``'s kernel on a CPU: the rows of three families' tables summed and normed as the
    module does, to float32's rounding; in float16 within its rounding of values up to about ±8."""
    script = (
        "import json, torch; from tests.model.test_kernels import embedding_errors; "
        "print(json.dumps({str(d): embedding_errors('cpu', d) for d in (torch.float32, torch.float16)}))"
    )
    found, _ = with_triton(script, interpret=True)
    assert set(found["torch.float32"]) == set(EMBEDDINGS)
    for case, error in found["torch.float32"].items():
        assert error < 1e-5, (case, error)
    for case, error in found["torch.float16"].items():
        assert error < 8e-3, (case, error)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_fused_embeddings_on_cuda(dtype: torch.dtype) -> None:
    """The embeddings' kernel compiled for the GPU: as in the interpreter."""
    for case, error in embedding_errors("cuda", dtype).items():
        assert error < (1e-5 if dtype == torch.float32 else 8e-3), (case, error)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_fused_add_and_norm_on_cuda(dtype: torch.dtype) -> None:
    """Compiled for the GPU: each value the exact one correctly rounded to the dtype (to float32's arithmetic),
    in half precision nearer than torch's two kernels."""
    for case, (fused, two_kernels) in errors("cuda", dtype).items():
        assert fused < 1e-5, (case, fused)
        if dtype != torch.float32:
            assert two_kernels > fused, (case, fused, two_kernels)


def post_norm_layer(device: str) -> EncoderLayer:
    config = EncoderConfig(vocab_size=50, d_model=64, n_heads=4, d_ff=128, n_layers=1, max_positions=64)
    torch.manual_seed(0)
    layer = EncoderLayer(config).to(device).eval()
    with torch.no_grad():
        for module in (layer.attention_norm, layer.feed_forward_norm):
            assert isinstance(module, torch.nn.LayerNorm)
            module.weight.normal_()
            module.bias.normal_()
    return layer


@CUDA
def test_a_post_norm_block_with_its_norms_fused_on_cuda() -> None:
    """``EncoderLayer.fuse_norms`` on a GPU in float16: the block as before within float16's rounding, on padded
    (B, T, D) and packed-shaped inputs alike; pre-norm blocks and the explicit path keep torch's norms."""
    layer = post_norm_layer("cuda").half()
    x = torch.randn(2, 9, 64, device="cuda").half()
    with torch.inference_mode():
        before = layer(x).values.float()
        explicit_before = layer(x, need_weights=True).values
        assert layer.fuse_norms()
        after = layer(x).values.float()
        explicit_after = layer(x, need_weights=True).values  # the explicit path: torch's kernels, as before
    torch.testing.assert_close(after, before, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(explicit_after, explicit_before, atol=0, rtol=0)
    pre_norm = EncoderConfig(vocab_size=50, d_model=64, n_heads=4, d_ff=128, n_layers=1, pre_norm=True)
    assert not EncoderLayer(pre_norm).fuse_norms()


def test_fusing_the_norms_of_a_block_takes_only_where_triton_is() -> None:
    """``fuse_norms`` takes a post-norm block of LayerNorms where Triton can be imported (the loader asks only on a
    GPU) and never a pre-norm block; ``fuse_norm`` the embeddings where they end in a LayerNorm, unprojected. In a
    process with Triton and in the suite's own, without it."""
    script = "import json; from tests.model.test_kernels import fusions; print(json.dumps(fusions()))"
    found, _ = with_triton(script, interpret=False)
    assert found == [True, True, False, True, False]
    assert fusions() == [False, False, False, False, False]  # no Triton here: torch's norms


def fusions() -> list[bool]:
    """Whether Triton is there, then whether each takes its fusion: a post-norm block, a pre-norm block, BERT's
    embeddings, ELECTRA-like projected embeddings."""
    from model.nn.encoder import Embeddings
    from model.nn.kernels import triton_available

    pre_norm = EncoderConfig(vocab_size=50, d_model=64, n_heads=4, d_ff=128, pre_norm=True)
    bert = EncoderConfig(vocab_size=50, d_model=64, n_heads=4, d_ff=128)
    projected = replace(bert, embedding_size=32)
    return [
        triton_available(),
        post_norm_layer("cpu").fuse_norms(),
        EncoderLayer(pre_norm).fuse_norms(),
        Embeddings(bert).fuse_norm(),
        Embeddings(projected).fuse_norm(),
    ]
