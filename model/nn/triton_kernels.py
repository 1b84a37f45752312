"""The Triton kernels of model/nn/kernels.py, compiled for the GPU at their first call; run by Triton's interpreter on
CPU tensors where TRITON_INTERPRET=1 was set before this module was imported (the tests). Imported only where
Triton is installed (model/nn/kernels.py imports it on first use)."""

import triton
import triton.language as tl


@triton.jit
def normed(x, inside, column, W, B, width, eps, HAS_BIAS: tl.constexpr):
    """LayerNorm of each row of ``x`` (BLOCK_ROWS, BLOCK_WIDTH) in float32, the columns past ``width`` masked off
    (``inside``), times the weight ``W``, plus the bias ``B`` with HAS_BIAS."""
    mean = tl.sum(x, axis=1) / width  # (BLOCK_ROWS,)
    centred = tl.where(inside, x - mean[:, None], 0.0)
    variance = tl.sum(centred * centred, axis=1) / width
    y = centred * (1.0 / tl.sqrt(variance + eps))[:, None]
    y *= tl.load(W + column, mask=column < width, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(B + column, mask=column < width, other=0.0).to(tl.float32)
    return y


@triton.jit
def add_layer_norm(
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
    y = normed(x, inside, column, W, B, width, eps, HAS_BIAS)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=inside)


@triton.jit
def embed_layer_norm(
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
    y = normed(x, inside, column, W, B, width, eps, HAS_BIAS)
    tl.store(Y + row[:, None] * width + column, y.to(Y.dtype.element_ty), mask=inside)
