"""The embedding pass on a GPU as CUDA graphs: one per bucket of batch shape, replayed for any batch that fits.

Why: on a GPU a pass of a small encoder is bound by the host, not the device. Each of the pass's ~150 kernels
costs the host a launch (tens of microseconds through the traced graph), while the device runs it in a few: a
one-text pass of all-MiniLM-L6-v2 took about 5 ms on an H100, of which the device worked well under one. A
CUDA graph launches the whole recorded pass at once.

A graph records fixed shapes and addresses, so each bucket (rows, length) has its own static inputs; a batch
of B rows of T tokens is copied into the smallest bucket with rows ≥ B and length ≥ T, the rest filled as
padding, and the bucket's graph replayed. The recorded pass is the padded one (no packing: packing needs the
host to count the real tokens), so padding is computed and masked, as transformers does. Batches larger than
every bucket return None and take the traced pass instead.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from model.nn.encoder import Encoder
from model.spec.outputs import GPU_PASS_TOKENS

logger = logging.getLogger(__name__)


def bucket_sizes(limit: int, first: int) -> list[int]:
    """Powers of two from ``first`` up to ``limit``, and ``limit`` itself."""
    sizes, size = [], first
    while size < limit:
        sizes.append(size)
        size *= 2
    return [*sizes, limit]


@dataclass
class Bucket:
    """One recorded pass: its static inputs, (rows, length) each."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    graph: torch.cuda.CUDAGraph


class GraphedPass:
    """The pass (input ids, mask, segments) → last hidden state, as CUDA graphs over buckets of shape.

    Buckets: lengths are powers of two from 16 up to ``max_length`` (and ``max_length`` itself), rows powers of
    two from 1, while rows × length ≤ ``max_tokens`` and rows ≤ ``max_rows``. All graphs share one memory pool
    for their scratch memory and write their result into one output buffer; replays are serialised (a lock),
    so they never overwrite each other's.
    """

    name = "torch (CUDA graphs)"

    def __init__(
        self,
        encoder: Encoder,
        pad_token_id: int,
        max_length: int,
        max_tokens: int = GPU_PASS_TOKENS,
        max_rows: int = 256,
    ) -> None:
        self.encoder = encoder
        self.pad_token_id = pad_token_id
        weight = next(encoder.parameters())
        self.device = weight.device
        self.output = torch.empty(max_tokens, encoder.config.d_model, dtype=weight.dtype, device=self.device)
        self.pool = torch.cuda.graph_pool_handle()
        # One side stream for every warm-up and capture: cuBLAS keeps a workspace (32 MiB on a Hopper GPU) for
        # each stream it runs on, and a stream per capture held over 1 GiB for 42 buckets.
        self.stream = torch.cuda.Stream(self.device)
        self.lock = threading.Lock()
        self.buckets: dict[tuple[int, int], Bucket] = {}
        started = time.perf_counter()
        shapes = [
            (rows, length)
            for length in bucket_sizes(max_length, min(16, max_length))
            for rows in bucket_sizes(max_rows, 1)
            if rows * length <= max_tokens
        ]
        # The largest first: the pool grows to its scratch memory once, and the smaller ones reuse it.
        for rows, length in sorted(shapes, key=lambda shape: shape[0] * shape[1], reverse=True):
            self.buckets[(rows, length)] = self.record(rows, length)
        logger.info(
            "recorded the embedding pass as %d CUDA graphs (up to %d rows, %d tokens) in %.2f s",
            len(self.buckets),
            max(rows for rows, _ in self.buckets),
            max(length for _, length in self.buckets),
            time.perf_counter() - started,
        )

    @torch.inference_mode()
    def record(self, rows: int, length: int) -> Bucket:
        device = self.device
        input_ids = torch.full((rows, length), self.pad_token_id, dtype=torch.long, device=device)
        attention_mask = torch.ones((rows, length), dtype=torch.long, device=device)
        token_type_ids = torch.zeros((rows, length), dtype=torch.long, device=device)
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # a warm-up run off the default stream, as torch asks before a capture
            self.encoder(input_ids, attention_mask, token_type_ids, pack=False)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
            hidden = self.encoder(input_ids, attention_mask, token_type_ids, pack=False).last_hidden_state
            self.output[: rows * length].view(rows, length, -1).copy_(hidden)  # (rows, length, D)
        return Bucket(input_ids, attention_mask, token_type_ids, graph)

    def bucket(self, rows: int, length: int) -> Bucket | None:
        """The smallest bucket that holds a (rows, length) batch, if any."""
        fitting = [shape for shape in self.buckets if shape[0] >= rows and shape[1] >= length]
        if not fitting:
            return None
        return self.buckets[min(fitting, key=lambda shape: (shape[0] * shape[1], shape[1]))]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        """The last hidden state (B, T, D) of a padded batch on the device, or None when no bucket holds it."""
        B, T = input_ids.shape
        bucket = self.bucket(B, T)
        if bucket is None:
            return None
        rows, length = bucket.input_ids.shape
        with self.lock:
            bucket.input_ids.fill_(self.pad_token_id)
            bucket.input_ids[:B, :T].copy_(input_ids)
            bucket.attention_mask.zero_()
            bucket.attention_mask[:B, :T].copy_(attention_mask)
            bucket.attention_mask[B:, 0] = 1  # rows beyond the batch: one real token each, so no row is all masked
            bucket.token_type_ids.zero_()
            bucket.token_type_ids[:B, :T].copy_(token_type_ids)
            bucket.graph.replay()
            output = self.output[: rows * length].view(rows, length, -1)  # (rows, length, D)
            return output[:B, :T].clone()  # the next replay overwrites the buffer
