"""Loading a model: its card and weights from one Hugging Face-layout directory onto a device, in a precision,
with its embedding pass traced (and on a GPU recorded as CUDA graphs). What a loaded model computes is
model/runtime/text_encoder.py's."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from model.nn.encoder import Embeddings, Encoder, EncoderLayer, PositionwiseFeedForward
from model.nn.heads import SequenceClassificationHead
from model.nn.pooling import Dense
from model.runtime.backends import AlignedLength, BucketedRows, EagerPass, OneText, PassBackend, TracedPass, unwrapped
from model.runtime.graphs import GraphedPass
from model.runtime.text_encoder import ExpansionGraph, PassGraph, TextEncoder
from model.runtime.weights import (
    checkpoint_dtype,
    load_head,
    load_language_model_rows,
    load_linear,
    load_masked_lm_head,
    read_encoder,
)
from model.spec.card import ModelCard
from model.spec.checkpoint import BGE_M3_COLBERT, BGE_M3_SPARSE
from model.spec.config import DECODERS, EncoderConfig
from model.spec.outputs import GPU_PASS_TOKENS

if TYPE_CHECKING:
    from model.runtime.openvino_pass import Int8Scheme

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Precisions of the CPU's OpenVINO pass alone, its weights quantized (model/runtime/openvino_pass.py): the explicit
# paths and
# the passes OpenVINO does not take run in float32.
QUANTIZED = ("int8",)


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' is CUDA when available, else CPU; anything else is passed to torch.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {device!r}: {error}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available")
    return resolved


@dataclass(frozen=True)
class Precision:
    """The dtype the embedding pass's weights are kept in, the one its matrix products run in, and the one the
    explicit paths' weights are kept in.

    On the GPU the pass's weights are in the compute dtype. On the CPU they are too where the checkpoint is
    stored in it (a bfloat16 decoder under bfloat16); otherwise the weights, the norms and the softmax stay
    float32 and a lower compute dtype applies to the matrix products alone (autocast): bfloat16 products run on
    the CPU's matrix units where it has them, and the embeddings keep cosine ≥ 0.9999 against float32.

    The explicit paths (attention maps, inspection) compute in float32 on every device. They share the pass's
    weights where those are float32 or the checkpoint's own dtype (a lower one is widened to float32 a layer
    at a time, exactly); only where the pass runs in a dtype narrower than the checkpoint (a float32
    checkpoint under float16 on a GPU) do they keep a copy in the checkpoint's dtype.
    """

    weights: torch.dtype
    compute: torch.dtype
    explicit: torch.dtype = torch.float32

    @property
    def autocast(self) -> bool:
        return self.compute != self.weights

    @property
    def shared(self) -> bool:
        """Whether the pass and the explicit paths use one copy of the weights."""
        return self.explicit == self.weights


def resolve_precision(dtype: str, device: torch.device, checkpoint: torch.dtype = torch.float32) -> Precision:
    """'auto': on CUDA float16, or bfloat16 for a checkpoint stored in it (float16 overflows in models trained
    in bfloat16, Gemma's among them); on a CPU float32, exact (equal to sentence-transformers): a lower precision
    there is the user's choice, made knowing its cost (docs/models.md, "On a CPU"). ``checkpoint`` is the dtype the
    checkpoint stores its weights in. A quantized precision (int8) is the CPU's alone, torch's side of it float32."""
    if dtype in QUANTIZED:
        if device.type != "cpu":
            raise ValueError(
                f"{dtype} is a CPU precision here (OpenVINO's pass with its weights in {dtype}); on a GPU use "
                "float16 or bfloat16"
            )
        return Precision(torch.float32, torch.float32, torch.float32)
    if dtype == "auto" and device.type == "cuda":
        dtype = "bfloat16" if checkpoint == torch.bfloat16 else "float16"
    elif dtype == "auto":
        dtype = "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join((*DTYPES, *QUANTIZED))}, got {dtype!r}")
    compute = DTYPES[dtype]
    weights = compute if device.type != "cpu" or checkpoint == compute else torch.float32
    if weights in (torch.float32, checkpoint):
        explicit = weights
    else:
        explicit = checkpoint if checkpoint in (torch.float16, torch.bfloat16) else torch.float32
    return Precision(weights, compute, explicit)


def products_in(encoder: Encoder, dtype: torch.dtype) -> Encoder:
    """A copy of the encoder whose linear layers' weights and biases are in ``dtype``, sharing every other tensor
    (embeddings, norms) with it: the CPU's pass under bfloat16 autocast, which then casts the activations alone.

    Why: autocast casts a float32 weight to bfloat16 on every call, and the recorded pass does too (the graph
    runs unoptimised, as recorded): all-MiniLM-L6-v2's one-text pass took 8.1–8.4 ms so against 4.5–4.9 with the
    weights cast once, equal to the last bit (docs/benchmarks/cpu-runtimes.md, "bfloat16 on the CPU: weights cast
    once, rows in buckets (CPU)"). The explicit paths keep the float32 encoder; the copy adds half its linear
    weights' bytes."""
    linear = {
        id(tensor) for module in encoder.modules() if isinstance(module, nn.Linear) for tensor in module.parameters()
    }
    shared = {id(tensor): tensor for tensor in (*encoder.parameters(), *encoder.buffers()) if id(tensor) not in linear}
    lowered = copy.deepcopy(encoder, shared)
    for module in lowered.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return lowered


def trace_pass(encoder: Encoder, example: tuple[Tensor, Tensor, Tensor], autocast: torch.dtype | None) -> PassGraph:
    """The encoder's embedding pass (every layer, padding skipped, the last hidden state) as a TorchScript graph.

    Why a graph: it runs all of its ~20 operations a layer without coming back to Python, so without the GIL.
    Run eagerly, the inference thread must win the GIL back from the event loop after each operation, and
    while the loop parses and answers a burst of requests every one of those waits stretches the pass (a
    pass beside a busy Python thread measured about 1.3× its time alone eagerly, about 1.1× as a graph).

    ``example`` must hold padding, so that the packed path is the one recorded; the graph then serves any
    batch (without padding the packing keeps every token). Traced under ``autocast`` the casts are recorded
    in the graph. The results equal the eager pass exactly (tests/model/test_traced_pass.py).
    """
    assert bool((example[1] == 0).any()), "the example batch must hold padding"

    def last_hidden_state(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        return encoder(input_ids, attention_mask, token_type_ids).last_hidden_state

    context = torch.autocast(example[0].device.type, dtype=autocast) if autocast is not None else nullcontext()
    with warnings.catch_warnings(), torch.inference_mode(), context:
        # torch.jit.trace is deprecated in favour of torch.compile / torch.export, which do not yet give a
        # GIL-free pass over dynamic shapes without a compiler toolchain and minutes of warm-up; the one tracer
        # warning is the padding check recorded as "padding present", which is intended (see above).
        warnings.simplefilter("ignore")
        graph = torch.jit.trace(last_hidden_state, example, check_trace=False)
    return graph


def trace_expansion_pass(
    encoder: Encoder, example: tuple[Tensor, Tensor, Tensor], autocast: torch.dtype | None
) -> ExpansionGraph:
    """As trace_pass, with the positions computed as a fourth input (the encoder's ``computed``): the pass of
    ColBERT queries whose expansion tokens no key sees. ``example``'s padding is taken as computed but unseen."""
    computed = torch.ones_like(example[1])
    computed[-1, -1] = 0  # still padding somewhere, so that the packed path is the one recorded

    def last_hidden_state(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, seen: Tensor) -> Tensor:
        return encoder(input_ids, attention_mask, token_type_ids, computed=seen).last_hidden_state

    context = torch.autocast(example[0].device.type, dtype=autocast) if autocast is not None else nullcontext()
    with warnings.catch_warnings(), torch.inference_mode(), context:
        warnings.simplefilter("ignore")  # the recorded padding check, as in trace_pass
        graph = torch.jit.trace(last_hidden_state, (*example, computed), check_trace=False)
    return graph


def fuse_kernels(model: TextEncoder, name: str) -> None:
    """The pass's fusions for half precision on a GPU: the GELU in the first product's epilogue, each residual
    addition with its LayerNorm in one kernel (post-norm blocks), the embeddings' lookups, sum and LayerNorm in
    one (model/nn/kernels.py). Triton compiles those two at their first run, which needs a C compiler and a writable
    cache: they are tried here once, on a batch packed and padded, and where they fail torch's kernels stay."""
    for module in model.passes.modules():
        if isinstance(module, PositionwiseFeedForward):
            module.fuse_gelu()
    fused = [
        module
        for module in model.passes.modules()
        if (isinstance(module, EncoderLayer) and module.fuse_norms())
        or (isinstance(module, Embeddings) and module.fuse_norm())
    ]
    if not fused:
        return
    try:
        batch = example_batch(model)
        with torch.inference_mode():
            model.passes(*batch)
            model.passes(*batch, pack=False)
    except Exception as error:  # whatever Triton raises where it cannot build (no compiler, no cache, no GPU)
        for module in fused:
            module.norms_fused = False
        logger.warning("the fused norms of %s could not run here, torch's kernels instead: %s", name, error)


def example_batch(model: TextEncoder) -> tuple[Tensor, Tensor, Tensor]:
    """Two texts of different lengths, so that the batch holds padding: what the pass is recorded on."""
    return model.to_tensors(model.card.tokenizer.pad(model.card.tokenizer.encode(["a graph", "of the pass, traced"])))


def trace(model: TextEncoder) -> None:
    """Record a model's embedding pass as a graph (``trace_pass``), used from then on by its passes
    (model/runtime/tasks.py: ``embed_texts``, ``logits``, ...)."""
    example = example_batch(model)
    traced = TracedPass(model.passes, trace_pass(model.passes, example, model.autocast_dtype))
    kept = (backend for backend in model.backends if not isinstance(unwrapped(backend), TracedPass))
    model.backends = (*kept, traced)
    late = model.card.late_interaction
    if late is not None and late.expansion is not None and not late.expansion.attend:
        model.expansion_graph = trace_expansion_pass(model.passes, example, model.autocast_dtype)


RUNTIMES = ("auto", "torch", "openvino")


def cpu_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 products natively: AVX512-BF16 or AMX, as torch detects them."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and bool(check()) for check in checks)


def cpu_threads() -> int:
    """The threads a compiled CPU pass computes with: the process's intra-op threads (the cores it may use)."""
    return torch.get_num_threads()


def compile_openvino(
    model: TextEncoder,
    threads: int,
    dtype: torch.dtype | None = None,
    quantize: str | None = None,
    padded: bool | None = None,
    streams: int = 1,
    int8: Int8Scheme | None = None,
) -> PassBackend:
    """The embedding pass compiled by OpenVINO (model/runtime/openvino_pass.py) in ``dtype`` (the model's by default),
    its weights in ``quantize`` where given, ``padded`` as it is asked (by default: float32 packed, bfloat16 and int8
    padded), on ``streams`` streams (``compile_for_cpu``), int8 as ``int8`` says (``WEIGHTS_ALONE`` unless given);
    ValueError where it cannot be. A packed pass in bfloat16 or int8 comes with its products' rows rounded up to
    buckets and its lengths aligned (``BucketedRows``, ``AlignedLength``), as torch's bfloat16 pass: OpenVINO prepares
    each product again for a count of rows it has not met."""
    from model.runtime.openvino_pass import PRECISIONS, WEIGHTS_ALONE, OpenVINOPass

    dtype = model.dtype if dtype is None else dtype
    if dtype not in PRECISIONS:
        raise ValueError(f"OpenVINO's pass here runs float32 or bfloat16, not {_name(dtype)}")
    try:
        compiled = OpenVINOPass(
            model.encoder, example_batch(model), dtype, threads, quantize, padded, streams, int8 or WEIGHTS_ALONE
        )
    except Exception as error:  # the converter's and the compiler's errors have no common class
        raise ValueError(f"OpenVINO could not compile it: {type(error).__name__}: {error}") from error
    if compiled.padded or compiled.precision == "f32" and quantize is None:
        return compiled
    # bfloat16 or int8 weights on the packed pass: its products meet a few dozen counts of rows, as torch's do
    longest = model.encoder.embeddings.max_length
    return AlignedLength(BucketedRows(compiled, model.card.config.pad_token_id), longest)


def openvino_passes(
    model: TextEncoder,
    threads: int,
    dtype: torch.dtype | None = None,
    quantize: str | None = None,
    *,
    cpu: CpuKind,
    lanes: int = 1,
) -> tuple[PassBackend, ...]:
    """OpenVINO's pass of every batch, in ``dtype`` (the model's by default) with its weights in ``quantize`` (int8 by
    the CPU kind's scheme, ``int8_scheme``): one compiled pass in float32 (packed) and on a CPU with AMX; in bfloat16
    or int8 on a CPU without AMX, two, the padded pass for one text and the packed one, its products' rows in
    buckets, for more.

    Why two: on AMD EPYC with AVX-512 and AVX512-BF16, taking turns on texts new to each round, the packed pass ran
    passes of 32 texts 1.29 times as fast as the padded one in bfloat16 and 1.45 times in int8, the padded pass one
    text 1.26 and 1.23 times as fast as the packed one (docs/benchmarks/cpu-runtimes.md, "bfloat16 and int8 on
    AVX-512 without AMX: the packed pass for batches (CPU)"). The second holds another copy of the weights in
    OpenVINO's layout (bfloat16 or int8). With AMX the padded pass alone, as measured there.

    ``lanes``: the passes the caller computes at once (the service's compute lanes). Beside the pass of one text, the
    packed pass then has as many streams as lanes and threads allow, one thread each, so that the lanes' passes
    compute side by side, each on its own core, rather than one after another on all of them, every operator waiting
    at its end for the thread the event loop took (as torch's lanes do, app/engine/compute.py); the model's
    ``passes_at_once`` says how many. On AMD EPYC with AVX-512 and AVX512-BF16, 2 cores, two services taking turns
    over HTTP (bench/turns.py), the texts/s of one stream's: 4 clients × 32 texts 1.07 times (bfloat16) and 1.08
    (int8), one client × 32 1.11 and 1.12, 32 clients × 1 text 1.28 and 1.11 (docs/benchmarks/cpu-runtimes.md,
    "OpenVINO's passes of batches side by side, one core each (CPU)"). Not in float32, whose one pass serves one text
    too: a second would hold another copy of the weights, and more memory under load than the service holds to."""
    int8 = int8_scheme(cpu)
    compiled = compile_openvino(model, threads, dtype, quantize, int8=int8)
    if not getattr(compiled, "padded", False) or cpu.amx:
        return (compiled,)
    streams = max(1, min(lanes, threads))
    packed = compile_openvino(model, threads, dtype, quantize, padded=False, streams=streams, int8=int8)
    model.passes_at_once = streams if streams > 1 else None
    return OneText(compiled, packed.name), packed


def quantized_runtime(model: TextEncoder, quantize: str, threads: int, lanes: int = 1) -> str:
    """Put OpenVINO's pass with its weights in ``quantize`` (int8) first in the model's backends, the rest of it in
    bfloat16 where the CPU computes it natively (measured both faster and closer to float32 than float32 around
    int8 weights: docs/benchmarks/cpu-runtimes.md, "int8 on the CPU"), float32 elsewhere; return why, for the load
    log. Refused
    (ValueError) where OpenVINO or NNCF is not installed; a model OpenVINO cannot compile keeps the torch pass in
    float32, and the reason says so."""
    from model.runtime.openvino_pass import available, quantizer_available

    if not available():
        raise ValueError(f"ENCODER_DTYPE={quantize} runs on OpenVINO, but the openvino package is not installed")
    if not quantizer_available():
        raise ValueError(
            f"ENCODER_DTYPE={quantize} needs NNCF to quantize the weights, and it is not installed: install the "
            "int8 extra (pip install -c constraints.txt '.[int8]'; make serve does so when ENCODER_DTYPE=int8)"
        )
    around = torch.bfloat16 if cpu_bfloat16() else torch.float32
    cpu = CpuKind.here()
    try:
        compiled = openvino_passes(model, threads, around, quantize, cpu=cpu, lanes=lanes)
    except ValueError as error:
        logger.warning("%s: %s; the torch pass serves it in float32", model.card.name, error)
        return f"OpenVINO could not compile it ({error}), so float32 on torch"
    model.backends = (*compiled, *model.backends)
    model.quantized = quantize
    return f"ENCODER_DTYPE={quantize}: {int8_scheme(cpu)}, the rest in {_name(around)}"


def int8_scheme(cpu: CpuKind) -> Int8Scheme:
    """How ``ENCODER_DTYPE=int8`` quantizes on ``cpu``: on AVX-512 without AMX the feed-forward's contraction left out
    of int8 and the activations in groups of 64 (``CONTRACTION_KEPT``: measured faster than bfloat16 there, where every
    weight in int8 with groups of 32 was not, and as near float32); elsewhere every linear layer's weights, groups of
    32 (``WEIGHTS_ALONE``: on AMX and on AVX2 the other was not measured)."""
    from model.runtime.openvino_pass import CONTRACTION_KEPT, WEIGHTS_ALONE

    return CONTRACTION_KEPT if cpu.avx512 and not cpu.amx else WEIGHTS_ALONE


@dataclass(frozen=True)
class CpuKind:
    """What the runtime rule reads of a CPU, as torch detects it."""

    amx: bool  # Intel's matrix tiles (Xeon from Sapphire Rapids on): oneDNN's products in bfloat16 and int8
    avx512: bool  # 512-bit vectors (without them, AVX2's 256)

    @classmethod
    def here(cls) -> CpuKind:
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return cls(
            amx=amx is not None and bool(amx()), avx512=torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        )

    def __str__(self) -> str:
        return "AMX" if self.amx else "AVX-512 without AMX" if self.avx512 else "no AVX-512 or AMX"


# What ``ENCODER_RUNTIME=auto`` serves the embedding pass on, a CPU kind at a time (docs/operations.md, "Runtime and
# precision"): each from the service measured on both runtimes on such a CPU (docs/benchmarks/cpu-runtimes.md).
TORCH, OPENVINO, OPENVINO_FOR_ONE_TEXT = "torch", "openvino", "openvino for one text"
# Below this many weights in its layers (the embedding tables not counted), an encoder's pass is cheaper on torch on
# every CPU kind: OpenVINO's fixed cost a call outweighs what its kernels save (docs/benchmarks/cpu-runtimes.md,
# "Small encoders on torch (CPU)").
SMALL_ENCODER_WEIGHTS = 1_000_000


def layer_weights(config: EncoderConfig) -> int:
    """The weights of an encoder's layers, from its config: what a pass multiplies a token by (the embedding
    tables, which a pass only reads a row of, not counted; biases and norms neither)."""
    qkv = sum(config.qkv_widths) * config.d_model
    out = config.qkv_widths[0] * config.d_model
    feed_forward = config.d_model * config.d_ff * (3 if config.glu else 2)
    return config.n_layers * (qkv + out + feed_forward)


def runtime_rule(cpu: CpuKind, dtype: torch.dtype, decoder: bool, weights: int) -> tuple[str, str]:
    """The runtime of ``auto`` for an embedding pass in ``dtype`` on ``cpu`` (a decoder's or an encoder's), and
    why: a rule rather than a race, so that the same machine, model and settings serve the same runtime and the
    same numbers at every start. ``weights``: the encoder's layers' (``layer_weights``).

    - A decoder (Qwen3, Gemma 3, ...): torch. Its batches measured 1.25-1.64 times faster on torch than on
      optimum-intel's OpenVINO model of it, and a conversion holds a second copy of a billion weights
      (docs/benchmarks/cpu-runtimes.md, "One text on OpenVINO, more on torch; decoders against optimum-intel (CPU)").
    - An encoder on a CPU with AMX: torch for batches, where oneDNN's AMX products put it level with OpenVINO or
      ahead (over HTTP, make bench's (b) in bfloat16 at 521 texts/s on torch against 403 on OpenVINO; in float32
      OpenVINO 1.3 to 1.5 times slower: docs/benchmarks/cpu-runtimes.md, "Runtimes and precisions (CPU)"); in
      bfloat16 OpenVINO takes the passes of one text alone, where it took 0.7 times torch's time (the section
      above).
    - An encoder on a CPU with AVX-512 and no AMX: OpenVINO, whose compiled pass measured faster than torch's on
      AMD EPYC with AVX-512 and AVX512-BF16 (ours in process, taking turns: float32 passes of 32 1.2 times torch's
      rate, one text 1.3 times; bfloat16 passes of 32 1.15 times, one text 1.3 times), in bfloat16 as two passes
      (``openvino_passes``; docs/benchmarks/cpu-runtimes.md, "bfloat16 and int8 on AVX-512 without AMX: the packed
      pass for batches (CPU)").
    - An encoder on a CPU without AVX-512 or AMX (AVX2 alone, and any other): torch. On AMD EPYC with AVX2, in one
      run with nothing beside it, torch's pass of all-MiniLM-L6-v2 was the faster on passes of 32 (167 texts/s
      against OpenVINO's 135 in process; make bench's loads over HTTP 1.11-1.27 times OpenVINO's; one text within a
      fifth either way, OpenVINO 0.83 to 1.12 times torch's time by run), and it holds a third less memory. A run on
      another such machine, shared with a test run, had found the opposite (docs/benchmarks/cpu-runtimes.md, "The
      runtime rule on each CPU kind (CPU)").
    - An encoder with fewer than SMALL_ENCODER_WEIGHTS weights in its layers: torch, on any CPU. On AMD EPYC with
      AVX2, random BERTs of 1 layer 32 wide and 2 layers 128 wide (8 thousand and 390 thousand weights) ran 1.2 to
      2.3 times faster on torch, one text or 32: OpenVINO's fixed cost a call, which no vector width changes. Larger
      ones (3 layers 256 wide, 2.4 million: 1.1-1.2 times) are left to the CPU's row, since on AVX-512 OpenVINO's
      kernels gain more than on AVX2 (measured there on all-MiniLM-L6-v2 alone)."""
    if decoder:
        return TORCH, "a decoder: torch's pass is the faster on every CPU measured"
    if weights < SMALL_ENCODER_WEIGHTS:
        return (
            TORCH,
            f"a small encoder ({weights / 1e6:.2g} million weights in its layers, "
            f"under {SMALL_ENCODER_WEIGHTS / 1e6:.0f})",
        )
    if cpu.amx and dtype == torch.bfloat16:
        return OPENVINO_FOR_ONE_TEXT, "an encoder in bfloat16 on a CPU with AMX: OpenVINO for one text, torch for more"
    if cpu.amx:
        return TORCH, f"an encoder in {_name(dtype)} on a CPU with AMX"
    if not cpu.avx512:
        return TORCH, f"an encoder on a CPU with {cpu}"
    return OPENVINO, f"an encoder on a CPU with {cpu}"


def choose_runtime(model: TextEncoder, runtime: str, threads: int, cpu: CpuKind | None = None, lanes: int = 1) -> str:
    """Put OpenVINO's compiled pass first in the model's backends where ``runtime`` asks for it (``openvino``) or
    where ``runtime_rule`` gives it (``auto``: every pass, or those of one text alone in front of torch's); return
    why, for the load log. A model OpenVINO cannot compile, or OpenVINO not installed, keeps the torch pass under
    ``auto``, and the reason says so."""
    if runtime == "torch":
        return "ENCODER_RUNTIME=torch"
    if runtime == "auto":
        chosen, why = runtime_rule(
            cpu or CpuKind.here(), model.dtype, model.card.config.family in DECODERS, layer_weights(model.card.config)
        )
        if chosen == TORCH:
            return f"ENCODER_RUNTIME=auto: {why}"
    else:
        chosen, why = OPENVINO, "ENCODER_RUNTIME=openvino"
    from model.runtime.openvino_pass import available

    if not available():
        if runtime == "openvino":
            raise ValueError("ENCODER_RUNTIME=openvino, but the openvino package is not installed")
        return f"ENCODER_RUNTIME=auto: {why}, but openvino is not installed"
    try:
        if chosen == OPENVINO:
            passes = openvino_passes(model, threads, cpu=cpu or CpuKind.here(), lanes=lanes)
            model.backends = (*passes, *model.backends)
        else:
            compiled = compile_openvino(model, threads)
            torch_pass = model.backends[0] if model.backends else EagerPass(model.passes, model.autocast_dtype)
            model.backends = (OneText(compiled, torch_pass.name), *model.backends)
    except ValueError as error:
        logger.warning("%s: %s; the torch pass serves it", model.card.name, error)
        return f"OpenVINO could not compile it ({error})"
    return why if runtime == "openvino" else f"ENCODER_RUNTIME=auto: {why}"


def load_model(
    path: Path | str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    name: str | None = None,
    max_tokens: int | None = None,
    traced: bool = True,
    cuda_graphs: bool = True,
    graph_tokens: int = GPU_PASS_TOKENS,
    runtime: str = "torch",
    threads: int | None = None,
    lanes: int = 1,
) -> TextEncoder:
    """Load a directory holding config.json, model.safetensors and tokenizer.json (the bundled
    all-MiniLM-L6-v2 when ``path`` is None). With ``traced`` the embedding pass runs as a traced graph
    (``trace``); without it, eagerly. On a GPU, with ``cuda_graphs``, passes of up to ``graph_tokens`` padded
    tokens replay CUDA graphs instead (model/runtime/graphs.py), larger ones take the traced or eager pass. On a CPU,
    ``runtime`` says whether OpenVINO's compiled pass serves it (``choose_runtime``: ``auto`` by the rule of
    ``runtime_rule``), computing with ``threads`` (the process's torch threads by default); ``lanes``: the passes the
    caller computes at once (``openvino_passes``).
    ``dtype="int8"`` is OpenVINO's pass with its weights in int8 (``quantized_runtime``), on a CPU only."""
    started = time.perf_counter()
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    quantize = dtype if dtype in QUANTIZED else None
    if quantize is not None and runtime == "torch":
        raise ValueError(
            f"ENCODER_DTYPE={quantize} runs on OpenVINO's pass, and ENCODER_RUNTIME=torch has none: use auto or "
            "openvino"
        )
    card = ModelCard.read(path, name, max_tokens)
    torch_device = resolve_device(device)
    weights_path = card.path / "model.safetensors"
    stored = checkpoint_dtype(weights_path)
    precision = resolve_precision(dtype, torch_device, stored)
    if torch_device.type == "cpu" and precision.compute == torch.bfloat16 and not cpu_bfloat16():
        raise ValueError(
            "bfloat16 on this CPU: it has neither AVX512-BF16 nor AMX, so its bfloat16 products would be emulated, "
            "slower than float32; use ENCODER_DTYPE=float32 (or auto)"
        )
    model = assemble(card, weights_path, torch_device, precision)
    if traced:
        trace(model)
    why = "on a GPU" if torch_device.type == "cuda" else "ENCODER_RUNTIME=torch"
    if torch_device.type == "cpu":
        why = cpu_passes(model, runtime, quantize, threads or cpu_threads(), lanes)
    elif torch_device.type == "cuda":
        gpu_passes(model, cuda_graphs, graph_tokens)
    log_loaded(model, time.perf_counter() - started, stored, precision, why)
    return model


def assemble(card: ModelCard, weights_path: Path, device: torch.device, precision: Precision) -> TextEncoder:
    """The model the card describes with its weights read onto ``device``: the encoder (and the pass's copy of it
    where its precision differs) and every head the card names."""
    encoder = read_encoder(card.config, weights_path, precision.explicit)
    pass_encoder = None
    if not precision.shared:  # a GPU under float16 over a float32 checkpoint: a copy for the embedding pass
        pass_encoder = copy.deepcopy(encoder).to(device=device, dtype=precision.weights)
    encoder = encoder.to(device=device)
    if device.type == "cpu" and precision.autocast:
        pass_encoder = products_in(encoder, precision.compute)
    return TextEncoder(
        card=card,
        encoder=encoder,
        device=device,
        dtype=precision.compute,
        weights_dtype=precision.weights,
        explicit_dtype=precision.explicit,
        pass_encoder=pass_encoder,
        **load_heads(card, weights_path, device, precision),
    )


def load_heads(card: ModelCard, weights_path: Path, device: torch.device, precision: Precision) -> dict[str, Any]:
    """The heads the card names, read onto ``device``, by the TextEncoder fields they fill."""
    config, model_dir = card.config, card.path
    heads: dict[str, Any] = {}
    heads.update(dense=tuple(Dense.load(spec).to(device=device) for spec in card.pooling.dense))
    if card.head is not None:
        classifier = SequenceClassificationHead(config, card.head)
        load_head(classifier, config, weights_path)
        # the scores' heads in the explicit paths' dtype (float32 for a float32 checkpoint under float16 on a GPU):
        # small, kept once, exact for the explanations' gradients; the pass's hidden state is widened to them
        heads.update(classifier=classifier.to(device=device, dtype=precision.explicit).eval().requires_grad_(False))
    if card.answers is not None:
        tied = bool(card.hf.get("tie_word_embeddings", config.family == "gemma3_text"))
        rows = load_language_model_rows(config, weights_path, list(card.answers), tied, precision.explicit)
        heads.update(reranker=rows.to(device=device).eval())
    if card.sparse is not None and card.sparse.kind == "splade":  # float32: kept exact, as the weights are
        heads.update(masked_lm=load_masked_lm_head(config, weights_path, torch.float32).to(device=device))
    elif card.sparse is not None:
        heads.update(lexical=load_linear(model_dir / BGE_M3_SPARSE, config.d_model, 1).to(device=device))
    if card.late_interaction is not None:
        heads.update(projections=tuple(Dense.load(spec).to(device=device) for spec in card.late_interaction.dense))
    elif card.multi_vector is not None:
        heads.update(colbert=load_linear(model_dir / BGE_M3_COLBERT, config.d_model).to(device=device))
    return heads


def cpu_passes(model: TextEncoder, runtime: str, quantize: str | None, threads: int, lanes: int = 1) -> str:
    """The CPU's embedding passes: torch's (traced, or eager), wrapped for the attention kernel's lengths and, under
    bfloat16, for oneDNN's row counts; then OpenVINO's where ``runtime`` or ``quantize`` has it. Returns why the
    runtime serving it was chosen."""
    torch_passes = model.backends or (EagerPass(model.passes, model.autocast_dtype),)
    if model.autocast_dtype == torch.bfloat16:
        # bfloat16 products through oneDNN: a kernel prepared for each count of rows (BucketedRows)
        torch_passes = tuple(BucketedRows(backend, model.card.config.pad_token_id) for backend in torch_passes)
    # the attention kernel's lengths (AlignedLength)
    longest = model.passes.embeddings.max_length
    model.backends = tuple(AlignedLength(backend, longest) for backend in torch_passes)
    if quantize is not None:
        return quantized_runtime(model, quantize, threads, lanes)
    return choose_runtime(model, runtime, threads, lanes=lanes)


def gpu_passes(model: TextEncoder, cuda_graphs: bool, graph_tokens: int) -> None:
    """The GPU's embedding passes: in half precision the fused kernels and the packed attention core; with
    ``cuda_graphs`` passes of up to ``graph_tokens`` replayed as CUDA graphs."""
    half = model.weights_dtype in (torch.float16, torch.bfloat16)
    if half:
        fuse_kernels(model, model.card.name)  # before the graphs record the pass, so that they hold these kernels too
    if cuda_graphs:
        try:
            graphs = GraphedPass(
                model.passes, model.card.config.pad_token_id, model.card.max_tokens, max_tokens=graph_tokens
            )
            model.backends = (graphs, *model.backends)
        except RuntimeError as error:  # a family whose pass cannot be recorded: it runs as before
            logger.warning("the embedding pass of %s could not be recorded as CUDA graphs: %s", model.card.name, error)
    if half:
        # Passes the graphs do not hold run eagerly with the attention core on the packed tokens (flash attention's
        # variable-length kernel) instead of the traced padded core: 4 to 11 % more tokens/s at 512 and 2,048 rows
        # on an H100 (docs/benchmarks/cuda.md, "make gpu-check on an H100: packed attention, front ends, a decoder,
        # the AMX host (CUDA)"). The trace cannot hold it: it would fix the longest row's length.
        model.passes.varlen = True
        model.backends = tuple(backend for backend in model.backends if not isinstance(backend, TracedPass))


def log_loaded(model: TextEncoder, seconds: float, stored: torch.dtype, precision: Precision, why: str) -> None:
    """One line: what was loaded from where, in which precisions, and which runtime runs its pass and why."""
    logger.info(
        "loaded %s (%s) from %s on %s in %.2f s: the checkpoint's %s weights kept in %s%s, products in %s%s; "
        "the embedding pass runs on %s (%s)",
        model.card.name,
        model.card.config.family,
        model.card.path,
        model.device,
        seconds,
        _name(stored),
        _name(precision.explicit),
        (
            f" and in {_name(precision.weights)} for the embedding pass"
            if not precision.shared
            else f", the linear layers' also in {_name(precision.compute)} for the embedding pass"
            if model.pass_encoder is not None
            else ""
        ),
        _name(precision.compute) if model.quantized is None else f"{model.quantized} weights on OpenVINO's pass",
        f"; {model.card.scores_method} scores" if model.card.scores_method else "",
        model.runtime,
        why,
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
