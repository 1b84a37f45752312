"""The embedding pass compiled for the CPU by OpenVINO, from our own encoder.

Why: the pass is more than its matrix products. For a 384-wide model the norms, the softmax, GELU, the packing
and the many small operations around them cost as much as the products, and an inference runtime fuses them.
OpenVINO converts the encoder module itself (``openvino.convert_model`` traces it, as trace_pass does) and
compiles it for the CPU at hand; the pass then runs in OpenVINO's own threads, without the GIL.

Precision: ``f32`` tells the runtime not to lower precision on its own (its default on a CPU with bfloat16 units
is bfloat16), so that the pass equals torch's within float32's rounding; ``bf16`` runs its products in bfloat16.
With ``int8`` the linear layers' weights are kept in int8 (NNCF's weight compression, asymmetric, one scale per
output channel; on AVX-512 without AMX all but the feed-forward's contraction: ``Int8Scheme``), OpenVINO quantizes
the activations meeting them as the pass runs, a scale for each group of a row's values, and the rest of the pass
runs in the precision hint. That scheme was chosen from the trade-off measured on the bundled model
(docs/benchmarks/cpu-runtimes.md, "int8 on the CPU" and the sections after it): the schemes calibrated on texts
(static int8 activations) lost more of the neighbours (top-10 agreement 0.80–0.945) than the 0.95 the service holds
to, or, the feed-forward left out, ran no faster than int8 weights alone and needed calibration texts at start.

Which of OpenVINO and torch serves a model, and whether with one compiled pass or two, is the loader's choice by a
rule of the CPU's kind (model/runtime/loader.py, ``runtime_rule``, ``openvino_passes``): on some CPUs OpenVINO's pass
is the faster, on others torch's (docs/benchmarks/cpu-runtimes.md).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from model.nn.encoder import Encoder
from model.runtime.backends import check_length, length_groups, row_bucket, takes_whole, to_bucket

PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the compute dtype → OpenVINO's precision hint
CACHE_SHAPES = 64  # as app/engine/compute.py bounds oneDNN's per-shape caches; the padded pass's shapes are bucketed
QUANTIZERS = ("int8",)  # what the ``quantize`` argument takes: the linear layers' weights in int8
# What a call of the padded pass costs beyond its tokens, counted in tokens, for cutting a batch into rows of like
# length (``length_groups``): the value that ran all-MiniLM-L6-v2's int8 pass fastest of 48, 128 and 256 on AMD EPYC
# with AVX-512 (docs/benchmarks/cpu-runtimes.md, "Rows of like length (CPU)").
PER_CALL_TOKENS = 128


@dataclass(frozen=True)
class Int8Scheme:
    """How ``quantize="int8"`` quantizes a pass: the linear layers whose weights stay out of int8 (``kept``, fragments
    of their names in the converted pass) and the values of a row OpenVINO quantizes the activations meeting int8
    weights in, one scale a group (``group``, its ``DYNAMIC_QUANTIZATION_GROUP_SIZE``; its default is 32); ``kept_as``:
    the kept layers in words, for the load log."""

    kept: tuple[str, ...] = ()
    group: int = 32
    kept_as: str = ""

    def __str__(self) -> str:
        kept = f" but {self.kept_as}" if self.kept else ""
        return f"the linear layers' weights in int8{kept}, the activations meeting them in groups of {self.group}"


# Every linear layer's weights in int8, the activations meeting them quantized by OpenVINO in its groups of 32.
WEIGHTS_ALONE = Int8Scheme()
# The feed-forward's contraction (whose input, after GELU, holds the widest activations) left in the precision around
# the int8 weights, the coarser groups of 64 elsewhere: on AMD EPYC with AVX-512 and AVX512-BF16, no AMX, 1.09 times
# as fast as bfloat16 in passes of 32 where WEIGHTS_ALONE ran 0.97 times, top-10 agreement 0.957 and 0.954 on two sets
# of 1,100 sentences against 0.950 and 0.966 (docs/benchmarks/cpu-runtimes.md, "int8: the contraction kept, groups of
# 64, on AVX-512 without AMX (CPU)").
CONTRACTION_KEPT = Int8Scheme((".contract/",), 64, "the feed-forward's contraction")


def available() -> bool:
    """Whether OpenVINO's Python package can be imported here."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def quantizer_available() -> bool:
    """Whether NNCF, which compresses the weights to int8, can be imported here (the ``int8`` extra)."""
    try:
        import nncf  # noqa: F401
    except ImportError:
        return False
    return True


class _LastHiddenState(nn.Module):
    def __init__(self, encoder: Encoder, pack: bool = True) -> None:
        super().__init__()
        self.encoder = encoder
        self.pack = pack

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        return self.encoder(input_ids, attention_mask, token_type_ids, pack=self.pack).last_hidden_state


def convert(encoder: Encoder, example: tuple[Tensor, Tensor, Tensor], pack: bool = True) -> Any:
    """The encoder's pass (input ids, mask, segments) → last hidden state as an OpenVINO model, any batch shape;
    ``pack``: the padding skipped (the real tokens gathered, their count known only when the pass runs), else
    computed and masked (every shape inside follows the batch's)."""
    import openvino as ov

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's warnings: the checks recorded as constants, as trace_pass
        return ov.convert_model(
            _LastHiddenState(encoder, pack).eval(), example_input=example, input=[ov.PartialShape([-1, -1])] * 3
        )


def batch_bucket(rows: int, length: int, longest: int) -> tuple[int, int]:
    """The batch shape a padded pass of ``rows`` × ``length`` runs as: both rounded up to a few buckets
    (``row_bucket``: at most an eighth more above 64), the length no further than the model's ``longest``."""
    return (rows if rows <= 2 else row_bucket(rows, least=4)), max(length, min(row_bucket(length), longest))


def compile_for_cpu(converted: Any, precision: str, threads: int, streams: int = 1, **properties: Any) -> Any:
    """A converted pass compiled for this CPU, running in ``precision`` (f32, bf16) outside any int8 weights, on
    ``threads`` threads: one stream (one pass at a time, on all of them, as a wide torch pass), or ``streams`` (as
    many passes side by side, the threads shared out between them); ``properties``: more of OpenVINO's CPU
    properties, or others for these (bench/int8.py tries some)."""
    import openvino as ov

    streaming = (
        {"PERFORMANCE_HINT": "LATENCY"} if streams <= 1 else {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": streams}
    )
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": precision,
        **streaming,
        "INFERENCE_NUM_THREADS": max(1, threads),
        # What it prepares for each batch shape, kept for CACHE_SHAPES shapes rather than its default 5,000:
        # a service meets a new shape in nearly every pass (docs/benchmarks/cpu-runtimes.md, "Runtimes and precisions
        # (CPU)").
        "CPU_RUNTIME_CACHE_CAPACITY": CACHE_SHAPES,
        **properties,
    }
    return ov.Core().compile_model(converted, "CPU", config)


class OpenVINOPass:
    """The pass (input ids, mask, segments) → last hidden state, compiled by OpenVINO for this CPU.

    ``example`` must hold padding, so that the packed path (padding skipped) is the one converted; any batch
    shape is taken then (both dimensions dynamic). Each thread that calls it has an infer request of its own.
    ``quantize="int8"`` keeps the linear layers' weights in int8 as ``int8`` says, the rest in ``dtype``. With
    ``streams`` above one,
    that many threads' passes compute side by side, ``threads`` shared out between them (``compile_for_cpu``).

    In float32 the pass skips the padding, as torch's does (``padded`` False; any precision where the caller says so,
    and then it takes the rows and lengths it is given). Under bfloat16 or int8 it computes the padding, masked,
    on a batch whose rows and length are rounded up to buckets (``batch_bucket``): OpenVINO prepares each
    operation again for every shape it has not met, which cost more than the products there (a one-text pass of
    all-MiniLM-L6-v2 about 6 ms on a shape met before, 16 ms on a new one), and the packed pass has a shape inside
    that no bucket fixes (its count of real tokens). Measured on an Intel Xeon with AMX, texts/s in process: int8
    one text 69–104 → 155–163, passes of 32 272–293 → 388–397; bfloat16 74–109 → 183–269 and 339–381 →
    430–493; float32 passes of 32 200–253 packed against 159–175 so (docs/benchmarks/cpu-runtimes.md, "bfloat16 on
    the CPU: weights cast once, rows in buckets (CPU)"). A batch of texts of unlike lengths is first cut into
    groups of like length (``length_groups``), each a call of its own on its bucket's shape.
    """

    name = "openvino"

    def __init__(
        self,
        encoder: Encoder,
        example: tuple[Tensor, Tensor, Tensor],
        dtype: torch.dtype,
        threads: int,
        quantize: str | None = None,
        padded: bool | None = None,
        streams: int = 1,
        int8: Int8Scheme = WEIGHTS_ALONE,
    ):
        if dtype not in PRECISIONS:
            raise ValueError(f"OpenVINO's pass runs in {', '.join(map(str, PRECISIONS))}, not {dtype}")
        if quantize is not None and quantize not in QUANTIZERS:
            raise ValueError(f"OpenVINO's pass quantizes to {', '.join(QUANTIZERS)}, not {quantize}")
        import openvino

        assert bool((example[1] == 0).any()), "the example batch must hold padding"
        self.encoder = encoder
        self.precision = PRECISIONS[dtype]
        self.quantize = quantize
        self.padded = (self.precision != "f32" or quantize is not None) if padded is None else padded
        if not self.padded and (self.precision != "f32" or quantize is not None):
            self.name = "openvino (packed)"  # beside a padded one (model/runtime/loader.py, ``openvino_passes``)
        converted = convert(encoder, example, pack=not self.padded)
        properties: dict[str, Any] = {}
        if quantize == "int8":
            converted = int8_weights(converted, int8.kept)
            properties = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": int8.group}
        self.compiled = compile_for_cpu(converted, self.precision, threads, streams, **properties)
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))  # what OpenVINO made of ``streams`` here
        # A module whose weights are bfloat16 (a checkpoint stored so, under bfloat16) answers in bfloat16, which
        # OpenVINO hands to numpy as float16 of the same bits (numpy has no bfloat16): read back as bfloat16.
        self.bfloat16_out = self.compiled.output(0).get_element_type() == openvino.Type.bf16
        self._requests = threading.local()

    def release_memory(self) -> None:
        """Hand back the buffers and caches the compiled pass keeps for the shapes it has met, 100-140 MiB for
        all-MiniLM-L6-v2 after a burst of new shapes (docs/benchmarks/memory.md, "The allocator bounded (CPU)"); the
        next pass prepares its shape again (a pass of 16 texts 81 ms instead of 56, once). Nothing where a pass is
        running: OpenVINO refuses while its graph is busy."""
        try:
            self.compiled.release_memory()
        except RuntimeError:
            pass

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor | None:
        length = input_ids.size(1)
        if input_ids.device.type != "cpu" or not takes_whole(self.encoder, length):
            return None
        check_length(self.encoder, length)  # recorded once, at conversion
        if not self.padded:
            return self._infer(input_ids, attention_mask, token_type_ids)
        B = input_ids.size(0)
        extents = (attention_mask * torch.arange(1, length + 1)).amax(1).tolist()  # each row's last real token + 1
        groups = length_groups(extents, PER_CALL_TOKENS) if B > 1 else [[0]]
        if len(groups) == 1:
            return self._bucketed(input_ids, attention_mask, token_type_ids)
        hidden: Tensor | None = None
        for rows in groups:
            index, longest = torch.tensor(rows), max(extents[row] for row in rows)
            part = self._bucketed(*(t[index, :longest] for t in (input_ids, attention_mask, token_type_ids)))
            if hidden is None:
                hidden = part.new_zeros(B, length, part.size(-1))
            hidden[index, :longest] = part
        return hidden

    def _bucketed(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        """The padded pass of a batch on its bucket's shape (``batch_bucket``), the rows and positions added
        dropped again."""
        B, length = input_ids.shape
        shape = batch_bucket(B, length, self.encoder.embeddings.max_length)
        if shape == (B, length) or not takes_whole(self.encoder, shape[1]):
            return self._infer(input_ids, attention_mask, token_type_ids)
        hidden = self._infer(*to_bucket(input_ids, attention_mask, token_type_ids, shape))
        return hidden[:B, :length].contiguous()

    def _infer(self, *batch: Tensor) -> Tensor:
        """The compiled pass of a batch as it is, on this thread's infer request: (B, T, D).

        The inputs are handed over as tensors over the arrays' own memory and the one output read back, rather than
        through ``infer(arrays)``, whose Python helpers find each input's kind and wrap every output: 84 µs of a
        call against 12 on AMD EPYC, a one-text pass of all-MiniLM-L6-v2 in int8 1.75 → 1.57 ms
        (docs/benchmarks/cpu-runtimes.md, "One text over HTTP: where the time goes (CPU)")."""
        from openvino import Tensor  # loaded with the pass: a lookup

        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        arrays = [np.ascontiguousarray(t.numpy()) for t in batch]  # alive until the pass has read them
        for index, array in enumerate(arrays):
            request.set_input_tensor(index, Tensor(array, shared_memory=True))
        request.infer()
        output = request.get_output_tensor(0).data.copy()  # (B, T, D), out of the buffer the next pass writes
        if self.bfloat16_out:  # two bytes an element, whatever numpy type carries them
            assert output.itemsize == 2, output.dtype
            return torch.from_numpy(output.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(output)


def int8_weights(converted: Any, kept: tuple[str, ...] = ()) -> Any:
    """The converted pass with its linear layers' weights in int8 (but those whose names hold one of ``kept``): NNCF's
    weight compression, asymmetric, one scale and zero point per output channel; about a second for
    all-MiniLM-L6-v2, no calibration text needed. It changes ``converted`` itself (and returns it). On the CPU,
    OpenVINO then quantizes the activations that meet these weights to int8 as it goes, a scale for each group of
    ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` values (``Int8Scheme.group``; the choices measured in
    docs/benchmarks/cpu-runtimes.md, "int8: the activations' dynamic quantization")."""
    import contextlib
    import io
    import logging

    import nncf

    nncf.set_log_level(logging.ERROR)  # its per-layer table, on every load
    names = [op.get_friendly_name() for op in converted.get_ordered_ops() if op.get_type_name() == "MatMul"]
    left = [name for name in names if any(part in name for part in kept)]
    scope = nncf.IgnoredScope(names=left) if left else None
    with contextlib.redirect_stdout(io.StringIO()):  # and its progress bar, which no setting turns off
        return nncf.compress_weights(converted, mode=nncf.CompressWeightsMode.INT8_ASYM, ignored_scope=scope)
