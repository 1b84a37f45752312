"""A GPU kernel of our own, in Triton: the residual addition and LayerNorm of a post-norm block in one pass.

Why: in a post-norm block (BERT, MiniLM) each sublayer ends with LN(x + sublayer(x)). Run as torch's two kernels,
the sum is written out in half precision, read back by LayerNorm and normed at about a third of the memory's
speed for widths of 384 to 1,024: the additions and norms were a third of a pass of all-MiniLM-L6-v2 in float16
on an H100 once the GELU went into the product (docs/benchmarks/cuda.md, "make gpu-check on an H100, again: the
CUDA tests, profiled passes, cuDNN's attention and the GELU in the product (CUDA)"). Here each program reads a block
of rows of both inputs once, adds them and norms them in float32, and writes the result once, as
text-embeddings-inference's fused residual + LayerNorm does.

Triton comes with PyTorch's CUDA builds on Linux; where it is missing the norm runs as before (``fused_norms``).
On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1), for the tests alone.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import Tensor, nn


def triton_available() -> bool:
    """Whether Triton can be imported (PyTorch's CUDA builds bring it on Linux)."""
    return importlib.util.find_spec("triton") is not None


def _triton_kernels() -> Any:
    """model/nn/triton_kernels.py, imported on first use (it needs Triton)."""
    from model.nn import triton_kernels

    return triton_kernels


def _launch(norm: nn.Module, width: int, rows: int, kernel: str) -> tuple[tuple[int], Tensor, dict[str, Any]]:
    """What both kernels launch with for a LayerNorm of ``width`` over ``rows`` rows: the grid, the bias (any
    tensor where there is none: not read without HAS_BIAS) and the constants: the width rounded up to a power of
    two, about 4,096 values a program."""
    if not isinstance(norm, nn.LayerNorm) or norm.normalized_shape != (width,) or norm.weight is None:
        raise ValueError(f"{kernel} needs an affine LayerNorm of width {width}")
    block_width = 1 << max(0, (width - 1).bit_length())
    block_rows = max(1, min(16, 4096 // block_width))
    constants = {
        "HAS_BIAS": norm.bias is not None,
        "BLOCK_ROWS": block_rows,
        "BLOCK_WIDTH": block_width,
        "num_warps": 4 if block_width <= 1024 else 8,
    }
    return (-(-rows // block_rows),), norm.bias if norm.bias is not None else norm.weight, constants


def add_layer_norm(x: Tensor, residual: Tensor, norm: nn.Module) -> Tensor:
    """``norm(x + residual)`` in one kernel: the sum is kept in float32, not rounded to x's dtype before the norm
    (so in half precision it is nearer the exact value than the two kernels'). Any leading shape, last dimension
    the norm's width; the result has x's dtype."""
    width = x.size(-1)
    if residual.shape != x.shape:
        raise ValueError(f"add_layer_norm needs x and residual of one shape, got {x.shape} and {residual.shape}")
    x2, r2 = x.reshape(-1, width).contiguous(), residual.reshape(-1, width).contiguous()
    y = torch.empty_like(x2)
    rows = x2.size(0)
    grid, bias, constants = _launch(norm, width, rows, "add_layer_norm")
    _triton_kernels().add_layer_norm[grid](x2, r2, norm.weight, bias, y, rows, width, norm.eps, **constants)
    return y.view(x.shape)


def embed_layer_norm(
    input_ids: Tensor,
    tokens: Tensor,
    norm: nn.Module,
    segment_ids: Tensor | None = None,
    segments: Tensor | None = None,
    position_ids: Tensor | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """``norm(tokens[input_ids] + segments[segment_ids] + positions[position_ids])`` in one kernel, summed in
    float32: (B, T) ids → (B, T, width) in the token table's dtype. ``segments`` without ids: every token takes
    segment 0; ``positions`` without ids: a token's position is its index in its row (0 to T - 1)."""
    width = tokens.size(1)
    ids = input_ids.contiguous()
    rows, length = ids.numel(), ids.size(-1)
    grid, bias, constants = _launch(norm, width, rows, "embed_layer_norm")
    y = torch.empty(*ids.shape, width, dtype=tokens.dtype, device=tokens.device)
    segment_mode = 0 if segments is None else 1 if segment_ids is None else 2
    position_mode = 0 if positions is None else 1 if position_ids is None else 2
    _triton_kernels().embed_layer_norm[grid](
        ids,
        tokens,
        segment_ids.contiguous() if segment_ids is not None else ids,  # any tensor where not read
        segments if segments is not None else tokens,
        position_ids.contiguous() if position_ids is not None else ids,
        positions if positions is not None else tokens,
        norm.weight,
        bias,
        y,
        rows,
        width,
        length,
        tokens.size(0),
        segments.size(0) if segments is not None else 0,
        positions.size(0) if positions is not None else 0,
        norm.eps,
        SEGMENTS=segment_mode,
        POSITIONS=position_mode,
        **constants,
    )
    return y
