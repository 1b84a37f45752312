"""A GPU kernel of our own, in Triton: the residual addition and LayerNorm of a post-norm block in one pass.

Why: in a post-norm block (BERT, MiniLM) each sublayer ends with LN(x + sublayer(x)). Run as torch's two kernels,
the sum is written out in half precision, read back by LayerNorm and normed at about a third of the memory's
speed for widths of 384 to 1,024: the additions and norms were a third of a pass of all-MiniLM-L6-v2 in float16
on an H100 once the GELU went into the product (BENCHMARKS.md, "make gpu-check on an H100, again"). Here each
program reads a block of rows of both inputs once, adds them and norms them in float32, and writes the result
once, as text-embeddings-inference's fused residual + LayerNorm does.

Triton comes with PyTorch's CUDA builds on Linux; where it is missing the norm runs as before (``fused_norms``).
On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1), for the tests alone.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch
from torch import Tensor, nn


def triton_available() -> bool:
    """Whether Triton can be imported (PyTorch's CUDA builds bring it on Linux)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _add_layer_norm_kernel() -> Any:
    """The kernel, compiled for the GPU (or, where TRITON_INTERPRET=1 was set before Triton was first imported, run
    by Triton's interpreter on CPU tensors)."""
    import triton
    import triton.language as tl

    def add_layer_norm(  # type: ignore[no-untyped-def]  # Triton reads the parameters' own annotations
        X,  # (rows, width) the sublayer's output
        R,  # (rows, width) the residual
        W,  # (width,) the norm's weight
        B,  # (width,) the norm's bias (unused without HAS_BIAS)
        Y,  # (rows, width) the result
        rows,
        width,
        eps,
        HAS_BIAS: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_WIDTH: tl.constexpr,
    ):
        row = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)[:, None]  # (BLOCK_ROWS, 1)
        column = tl.arange(0, BLOCK_WIDTH)[None, :]  # (1, BLOCK_WIDTH)
        inside = (row < rows) & (column < width)
        offsets = row * width + column
        x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        x += tl.load(R + offsets, mask=inside, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / width  # (BLOCK_ROWS,)
        centred = tl.where(inside, x - mean[:, None], 0.0)
        variance = tl.sum(centred * centred, axis=1) / width
        y = centred * (1.0 / tl.sqrt(variance + eps))[:, None]
        y *= tl.load(W + column, mask=column < width, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + column, mask=column < width, other=0.0).to(tl.float32)
        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=inside)

    return triton.jit(add_layer_norm)


def add_layer_norm(x: Tensor, residual: Tensor, norm: nn.Module) -> Tensor:
    """``norm(x + residual)`` in one kernel: the sum is kept in float32, not rounded to x's dtype before the norm
    (so in half precision it is nearer the exact value than the two kernels'). Any leading shape, last dimension
    the norm's width; the result has x's dtype."""
    width = x.size(-1)
    if not isinstance(norm, nn.LayerNorm) or norm.normalized_shape != (width,) or norm.weight is None:
        raise ValueError(f"add_layer_norm needs an affine LayerNorm of width {width}")
    if residual.shape != x.shape:
        raise ValueError(f"add_layer_norm needs x and residual of one shape, got {x.shape} and {residual.shape}")
    x2, r2 = x.reshape(-1, width).contiguous(), residual.reshape(-1, width).contiguous()
    y = torch.empty_like(x2)
    rows = x2.size(0)
    block_width = 1 << max(0, (width - 1).bit_length())  # the width, rounded up to a power of two
    block_rows = max(1, min(16, 4096 // block_width))  # about 4,096 values a program
    kernel = _add_layer_norm_kernel()
    bias = norm.bias if norm.bias is not None else norm.weight  # any tensor: not read without HAS_BIAS
    grid = (-(-rows // block_rows),)
    kernel[grid](
        x2,
        r2,
        norm.weight,
        bias,
        y,
        rows,
        width,
        norm.eps,
        HAS_BIAS=norm.bias is not None,
        BLOCK_ROWS=block_rows,
        BLOCK_WIDTH=block_width,
        num_warps=4 if block_width <= 1024 else 8,
    )
    return y.view(x.shape)


@functools.cache
def _embed_layer_norm_kernel() -> Any:
    """The embeddings' kernel: each token's row of the token table, its segment's and its position's, summed and
    normed (as ``_add_layer_norm_kernel``, compiled or interpreted)."""
    import triton
    import triton.language as tl

    def embed_layer_norm(  # type: ignore[no-untyped-def]  # Triton reads the parameters' own annotations
        IDS,  # (rows,) token ids
        TOKENS,  # (vocabulary, width) the token table
        SEGMENT_IDS,  # (rows,) segment ids (read with SEGMENTS == 2)
        SEGMENTS_TABLE,  # (segments, width) (read with SEGMENTS ≥ 1)
        POSITION_IDS,  # (rows,) positions (read with POSITIONS == 2)
        POSITIONS_TABLE,  # (positions, width) (read with POSITIONS ≥ 1)
        W,  # (width,) the norm's weight
        B,  # (width,) the norm's bias (read with HAS_BIAS)
        Y,  # (rows, width) the result
        rows,
        width,
        length,  # tokens a sequence: a token's position is its index in its row (POSITIONS == 1)
        vocabulary,
        segments,
        positions,
        eps,
        SEGMENTS: tl.constexpr,  # 0: none; 1: every token segment 0; 2: SEGMENT_IDS
        POSITIONS: tl.constexpr,  # 0: none; 1: the index in the row; 2: POSITION_IDS
        HAS_BIAS: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_WIDTH: tl.constexpr,
    ):
        row = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)  # (BLOCK_ROWS,)
        column = tl.arange(0, BLOCK_WIDTH)[None, :]  # (1, BLOCK_WIDTH)
        real = row < rows
        inside = real[:, None] & (column < width)
        # Ids outside a table read nothing (zeros), never beyond it; the service checks ids before a pass
        token = tl.load(IDS + row, mask=real, other=0).to(tl.int64)
        found = inside & ((token >= 0) & (token < vocabulary))[:, None]
        x = tl.load(TOKENS + token[:, None] * width + column, mask=found, other=0.0).to(tl.float32)
        if SEGMENTS == 1:
            x += tl.load(SEGMENTS_TABLE + column + row[:, None] * 0, mask=inside, other=0.0).to(tl.float32)
        if SEGMENTS == 2:
            segment = tl.load(SEGMENT_IDS + row, mask=real, other=0).to(tl.int64)
            found = inside & ((segment >= 0) & (segment < segments))[:, None]
            x += tl.load(SEGMENTS_TABLE + segment[:, None] * width + column, mask=found, other=0.0).to(tl.float32)
        if POSITIONS != 0:
            if POSITIONS == 1:  # noqa: SIM108  # a constexpr branch, compiled away
                position = row % length
            else:
                position = tl.load(POSITION_IDS + row, mask=real, other=0).to(tl.int64)
            found = inside & ((position >= 0) & (position < positions))[:, None]
            x += tl.load(POSITIONS_TABLE + position[:, None] * width + column, mask=found, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / width  # (BLOCK_ROWS,)
        centred = tl.where(inside, x - mean[:, None], 0.0)
        variance = tl.sum(centred * centred, axis=1) / width
        y = centred * (1.0 / tl.sqrt(variance + eps))[:, None]
        y *= tl.load(W + column, mask=column < width, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + column, mask=column < width, other=0.0).to(tl.float32)
        tl.store(Y + row[:, None] * width + column, y.to(Y.dtype.element_ty), mask=inside)

    return triton.jit(embed_layer_norm)


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
    if not isinstance(norm, nn.LayerNorm) or norm.normalized_shape != (width,) or norm.weight is None:
        raise ValueError(f"embed_layer_norm needs an affine LayerNorm of width {width}")
    ids = input_ids.contiguous()
    rows, length = ids.numel(), ids.size(-1)
    y = torch.empty(*ids.shape, width, dtype=tokens.dtype, device=tokens.device)
    block_width = 1 << max(0, (width - 1).bit_length())
    block_rows = max(1, min(16, 4096 // block_width))
    segment_mode = 0 if segments is None else 1 if segment_ids is None else 2
    position_mode = 0 if positions is None else 1 if position_ids is None else 2
    _embed_layer_norm_kernel()[(-(-rows // block_rows),)](
        ids,
        tokens,
        segment_ids.contiguous() if segment_ids is not None else ids,  # any tensor where not read
        segments if segments is not None else tokens,
        position_ids.contiguous() if position_ids is not None else ids,
        positions if positions is not None else tokens,
        norm.weight,
        norm.bias if norm.bias is not None else norm.weight,
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
        HAS_BIAS=norm.bias is not None,
        BLOCK_ROWS=block_rows,
        BLOCK_WIDTH=block_width,
        num_warps=4 if block_width <= 1024 else 8,
    )
    return y
