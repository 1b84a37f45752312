"""The embedding pass behind one narrow interface: the last hidden state of a padded batch.

Every task that runs the pass (embeddings, classification and reranking, sparse and multi-vector vectors) asks
a loaded model's backends for it, in order; a backend that cannot take a batch answers None and the next one is
asked, and the eager torch pass, last, takes any. The explicit paths (/attention, the inspection endpoints)
never come here: they need the attention probabilities, which only the explicit torch path computes.

The backends:

- ``EagerPass``: the encoder operation by operation (autocast where the products run lower than the weights);
- ``TracedPass``: the same pass recorded as a TorchScript graph (``trace_pass`` in model/runtime/loader.py), which runs
  without the GIL;
- ``GraphedPass`` (model/runtime/graphs.py): on a GPU, the pass replayed as CUDA graphs, one per bucket of batch shape;
- ``OpenVINOPass`` (model/runtime/openvino_pass.py): on a CPU, the pass compiled by OpenVINO;
- ``BucketedRows``: around the torch passes of a CPU's bfloat16 products, the batch's real tokens rounded up to
  one of a few dozen counts;
- ``AlignedLength``: around every torch pass on a CPU, a padded batch's length rounded up to a multiple of 16, where
  torch's attention kernel for the CPU runs faster;
- ``OneText``: another backend for passes of one text alone, where it is faster there but not on batches (a
  compiled pass in front of torch's: ``runtime_rule`` in model/runtime/loader.py).

As text-embeddings-inference's ``Backend`` trait (``embed``, ``predict``), one call, whatever computes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from model.nn.encoder import Encoder, windowed


class PassBackend(Protocol):
    """(input ids, attention mask, token type ids), each (B, T) on the model's device → the last hidden state
    (B, T, D) in the pass's precision, or None where this backend cannot take the batch."""

    name: str  # what /info, /metrics and the load log call it

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None: ...


def check_length(encoder: Encoder, length: int) -> None:
    """The embeddings' own length check, for backends that recorded the pass once and left it out."""
    if length > encoder.embeddings.max_length:
        raise ValueError(f"sequence of {length} tokens is longer than the model's positions")


def takes_whole(encoder: Encoder, length: int) -> bool:
    """Whether a pass of ``length`` tokens is the recorded kind: a long input of a model with local layers takes
    them block by block, eagerly (``windowed``)."""
    config = encoder.config
    return not (config.local_layers and windowed(length, config.window_reach))


class EagerPass:
    """The encoder, operation by operation: it takes every batch."""

    name = "torch"

    def __init__(self, encoder: Encoder, autocast: torch.dtype | None = None) -> None:
        self.encoder = encoder
        self.autocast = autocast

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        device = input_ids.device.type
        context = nullcontext() if self.autocast is None else torch.autocast(device, dtype=self.autocast)
        with context:
            return self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state


class TracedPass:
    """The pass as a TorchScript graph (``trace_pass``): every batch but a long one of a model with local layers."""

    name = "torch (traced)"

    def __init__(self, encoder: Encoder, graph: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        self.encoder = encoder
        self.graph = graph

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        length = input_ids.size(1)
        if not takes_whole(self.encoder, length):
            return None
        check_length(self.encoder, length)  # ran once, at tracing, and is not in the graph
        with torch.jit.optimized_execution(False):  # as recorded: no re-optimisation for each new shape
            return self.graph(input_ids, attention_mask, token_type_ids)


def unwrapped(backend: PassBackend) -> PassBackend:
    """The backend that ``AlignedLength`` and ``BucketedRows`` wrap (through both), or the backend itself."""
    while isinstance(backend, AlignedLength | BucketedRows):
        backend = backend.inner
    return backend


def release_memory(backend: PassBackend) -> None:
    """Hand back what a backend holds for the shapes it has met (OpenVINO's buffers), where it holds any."""
    release = getattr(unwrapped(backend), "release_memory", None)
    if release is not None:
        release()


def row_bucket(tokens: int, least: int = 16, per_octave: int = 8) -> int:
    """The smallest bucket of at least ``tokens`` rows: ``least``, then multiples of ``least`` // 2 up to 64, then
    ``per_octave`` buckets an octave (72, 80, …, 128, 144, …): at most an eighth more rows than asked for above
    64, 55 buckets from 16 to 4,096."""
    if tokens <= least:
        return least
    step = max(least // 2, 1 << max(0, tokens.bit_length() - 1 - (per_octave.bit_length() - 1)))
    return -(-tokens // step) * step


class BucketedRows:
    """Another backend's pass with the batch's real tokens rounded up to a ``row_bucket``: rows of filler tokens
    are appended (their outputs dropped), so that the products see a few dozen row counts rather than a new one
    almost every pass.

    Why: the pass packs the real tokens (model/nn/encoder.py, ``Packing``), so each product has as many rows as the
    batch has real tokens. oneDNN, which computes bfloat16 products on a CPU, prepares a kernel for every count
    of rows it meets (a primitive, cached): on an Intel Xeon with AMX that took about 3 ms a product shape, four
    shapes a pass, against a 1.5-ms product (docs/benchmarks/cpu-runtimes.md, "bfloat16 on the CPU: weights cast
    once, rows in buckets (CPU)"). The filler rows are attended by nothing else: each row attends within itself.
    float32's products (MKL) prepare nothing per count and are not bucketed."""

    def __init__(self, inner: PassBackend, filler_id: int = 0) -> None:
        self.inner = inner
        self.name = inner.name
        self.filler_id = filler_id

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        B, T = input_ids.shape
        tokens = int(attention_mask.sum())
        missing = row_bucket(tokens) - tokens
        if missing == 0:
            return self.inner(input_ids, attention_mask, token_type_ids)
        rows = -(-missing // T)
        filler = attention_mask.new_zeros(rows * T)
        filler[:missing] = 1
        hidden = self.inner(
            torch.cat([input_ids, input_ids.new_full((rows, T), self.filler_id)]),
            torch.cat([attention_mask, filler.view(rows, T)]),
            torch.cat([token_type_ids, token_type_ids.new_zeros(rows, T)]),
        )
        return None if hidden is None else hidden[:B]


def length_groups(lengths: Sequence[int], per_call: int) -> list[list[int]]:
    """The rows of a padded batch (their real lengths ``lengths``) cut into groups of like length, each computed as
    a batch of its own padded to its longest: the cut that computes the fewest tokens, padding included, each group
    counted ``per_call`` tokens more (what a call costs beyond its tokens). Rows by increasing length; one group
    where cutting saves nothing.

    Why: a pass that computes its padding pays for every row at its longest row's length. Passes of 32 generated
    sentences of 8 to 40 words (all-MiniLM-L6-v2) computed 1.68 tokens a real one on their buckets' shapes; cut
    so, 1.36, and OpenVINO's int8 pass ran 1.18 times as many texts a second on AMD EPYC with AVX-512
    (docs/benchmarks/cpu-runtimes.md, "Rows of like length (CPU)"). sentence-transformers sorts the texts of an
    ``encode`` call by length for the same reason; a service's pass holds what its requests sent, so it is cut here.
    A dynamic programme over the rows by length: O(rows²), about a millisecond for 256 rows."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    ordered = np.asarray(lengths)[order]
    n = len(ordered)
    best = np.zeros(n + 1)
    start = np.zeros(n + 1, dtype=np.int64)  # where the last group of the best cut of the first j rows starts
    for j in range(1, n + 1):
        costs = best[:j] + (j - np.arange(j)) * ordered[j - 1] + per_call
        start[j] = int(costs.argmin())
        best[j] = costs[start[j]]
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[start[j] : j].tolist())
        j = int(start[j])
    return groups[::-1]


def to_bucket(
    input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, shape: tuple[int, int]
) -> list[Tensor]:
    """The batch padded to ``shape``: padding columns, and rows of one real token each (a row of none has no
    softmax)."""
    B, T = input_ids.shape
    grow = (0, shape[1] - T, 0, shape[0] - B)
    mask = F.pad(attention_mask, grow)
    mask[B:, 0] = 1
    return [F.pad(input_ids, grow), mask, F.pad(token_type_ids, grow)]


ALIGNMENT = 16  # the lengths torch's CPU attention kernel runs fastest at: multiples of this
ALIGNED_UP_TO = 128  # and the longest padded batch whose length is rounded up (where that was measured to pay)


def aligned_length(length: int, longest: int) -> int:
    """A padded batch's length rounded up to a multiple of ALIGNMENT, where that is at most ALIGNED_UP_TO and
    ``longest`` (the model's positions); ``length`` itself otherwise."""
    rounded = -(-length // ALIGNMENT) * ALIGNMENT
    return rounded if rounded <= min(ALIGNED_UP_TO, longest) else length


class AlignedLength:
    """Another backend's pass with a padded batch's length rounded up to a multiple of 16 tokens (``aligned_length``):
    columns of padding are appended, their outputs dropped. A batch of one text (no padding) passes as it is.

    Why: the pass computes every product on the real tokens alone, but the attention core on the padded (B, T)
    layout, through torch's flash attention kernel for the CPU, which takes its keys in blocks and is much slower on
    a length that is not a multiple of 16: on an Intel Xeon with AMX, one thread, 32 rows × 12 heads, 5.7 ms at 60
    tokens against 3.6 ms at 64 (float32), 5.9 against 3.0 (bfloat16). The appended columns are padding like any
    other: masked as keys, skipped by every product, their rows dropped. Passes of 32 generated sentences of
    all-MiniLM-L6-v2 ran 1.02 to 1.05 times as fast in float32 and 1.04 to 1.13 times in bfloat16
    (docs/benchmarks/cpu-passes.md, "Attention at aligned lengths (CPU)")."""

    def __init__(self, inner: PassBackend, longest: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.longest = longest

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        B, T = input_ids.shape
        length = aligned_length(T, self.longest)
        if B == 1 or length == T:
            return self.inner(input_ids, attention_mask, token_type_ids)
        hidden = self.inner(*to_bucket(input_ids, attention_mask, token_type_ids, (B, length)))  # (B, length, D)
        return None if hidden is None else hidden[:, :T].contiguous()


class OneText:
    """Another backend's pass for batches of one text; a larger batch answers None, and the next backend takes it.

    Why: on an Intel Xeon with AMX, OpenVINO's bfloat16 pass of one text took 0.69 times torch's for
    all-MiniLM-L6-v2, while passes of 4, 8 and 32 texts took 1.03 to 1.14 times (16 texts 0.84); a lone text is
    what an idle service computes, so its latency is this pass's: make bench's idle p50 7.2 → 5.5 ms
    (docs/benchmarks/cpu-runtimes.md, "One text on OpenVINO, more on torch; decoders against optimum-intel (CPU)").
    ``choose_runtime`` puts it first where the runtime rule says so."""

    def __init__(self, inner: PassBackend, rest: str) -> None:
        self.inner = inner
        self.name = f"{inner.name} for one text, {rest} for more"

    def release_memory(self) -> None:
        release_memory(self.inner)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        return self.inner(input_ids, attention_mask, token_type_ids) if input_ids.size(0) == 1 else None
