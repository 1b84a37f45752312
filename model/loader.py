"""Loading a model: its card and weights from one Hugging Face-layout directory onto a device, in a precision,
with its embedding pass traced (and on a GPU recorded as CUDA graphs). What a loaded model computes is
model/text_encoder.py's."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from model.card import read_card
from model.checkpoint import BGE_M3_COLBERT, BGE_M3_SPARSE
from model.encoder import Encoder
from model.graphs import GraphedPass
from model.heads import SequenceClassificationHead
from model.outputs import GPU_PASS_TOKENS
from model.pooling import Dense
from model.text_encoder import ExpansionGraph, PassGraph, TextEncoder
from model.weights import (
    checkpoint_dtype,
    load_head,
    load_language_model_rows,
    load_linear,
    load_masked_lm_head,
    read_encoder,
)

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 matrix units (AMX), as torch detects it.

    AVX512-BF16 alone is not enough: on an Intel Xeon with AVX512-BF16 and no AMX, all-MiniLM-L6-v2 embedded
    batches of 32 at 0.65× the texts/s of float32, and single texts took 1.4 to 2.3× as long (BENCHMARKS.md).
    """
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return check is not None and bool(check())


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
    in bfloat16, Gemma's among them); on the CPU bfloat16 products where the CPU has native bfloat16 matrix units
    (AMX), float32 elsewhere. ``checkpoint`` is the dtype the checkpoint stores its weights in."""
    if dtype == "auto":
        if device.type == "cuda":
            dtype = "bfloat16" if checkpoint == torch.bfloat16 else "float16"
        else:
            dtype = "bfloat16" if native_bfloat16() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    compute = DTYPES[dtype]
    weights = compute if device.type != "cpu" or checkpoint == compute else torch.float32
    if weights in (torch.float32, checkpoint):
        explicit = weights
    else:
        explicit = checkpoint if checkpoint in (torch.float16, torch.bfloat16) else torch.float32
    return Precision(weights, compute, explicit)


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


def trace(model: TextEncoder) -> None:
    """Record a model's embedding pass as a graph (``trace_pass``), used from then on by its passes (embed_encodings,
    classify, ...)."""
    example = model.to_tensors(model.tokenizer.pad(model.tokenizer.encode(["a graph", "of the pass, traced"])))
    model.graph = trace_pass(model.passes, example, model.autocast_dtype)
    late = model.late_interaction
    if late is not None and late.expansion is not None and not late.expansion.attend:
        model.expansion_graph = trace_expansion_pass(model.passes, example, model.autocast_dtype)


def load_model(
    path: Path | str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    name: str | None = None,
    max_tokens: int | None = None,
    traced: bool = True,
    cuda_graphs: bool = True,
    graph_tokens: int = GPU_PASS_TOKENS,
) -> TextEncoder:
    """Load a directory holding config.json, model.safetensors and tokenizer.json (the bundled
    all-MiniLM-L6-v2 when ``path`` is None). With ``traced`` the embedding pass runs as a traced graph
    (``trace``); without it, eagerly. On a GPU, with ``cuda_graphs``, passes of up to ``graph_tokens`` padded
    tokens replay CUDA graphs instead (model/graphs.py), larger ones take the traced or eager pass."""
    started = time.perf_counter()
    card = read_card(path, name, max_tokens)
    model_dir, config, hf, name = card["path"], card["config"], card["hf"], card["name"]
    torch_device = resolve_device(device)
    weights_path = model_dir / "model.safetensors"
    stored = checkpoint_dtype(weights_path)
    precision = resolve_precision(dtype, torch_device, stored)

    encoder = read_encoder(config, weights_path, precision.explicit)
    pass_encoder = None
    if not precision.shared:  # a GPU under float16 over a float32 checkpoint: a copy for the embedding pass
        pass_encoder = copy.deepcopy(encoder).to(device=torch_device, dtype=precision.weights)
    encoder = encoder.to(device=torch_device)
    classifier = None
    if card["head"] is not None:
        classifier = SequenceClassificationHead(config, card["head"])
        load_head(classifier, config, weights_path)
        classifier = classifier.to(device=torch_device, dtype=precision.weights).eval().requires_grad_(False)
    reranker = None
    if card["answers"] is not None:
        tied = bool(hf.get("tie_word_embeddings", config.family == "gemma3_text"))
        reranker = load_language_model_rows(config, weights_path, list(card["answers"]), tied, precision.weights)
        reranker = reranker.to(device=torch_device).eval()
    dense = tuple(Dense.load(spec).to(device=torch_device) for spec in card["pooling"].dense)
    masked_lm, lexical = None, None
    if card["sparse"] is not None and card["sparse"].kind == "splade":  # float32: kept exact, as the weights are
        masked_lm = load_masked_lm_head(config, weights_path, torch.float32).to(device=torch_device)
    elif card["sparse"] is not None:
        lexical = load_linear(model_dir / BGE_M3_SPARSE, config.d_model, 1).to(device=torch_device)
    colbert: nn.Linear | None = None
    projections: tuple[Dense, ...] = ()
    if card["late_interaction"] is not None:
        projections = tuple(Dense.load(spec).to(device=torch_device) for spec in card["late_interaction"].dense)
    elif card["multi_vector"] is not None:
        colbert = load_linear(model_dir / BGE_M3_COLBERT, config.d_model).to(device=torch_device)
    model = TextEncoder(
        **card,
        encoder=encoder,
        device=torch_device,
        dtype=precision.compute,
        weights_dtype=precision.weights,
        explicit_dtype=precision.explicit,
        classifier=classifier,
        reranker=reranker,
        masked_lm=masked_lm,
        lexical=lexical,
        colbert=colbert,
        projections=projections,
        dense=dense,
        pass_encoder=pass_encoder,
    )
    limit = model.max_tokens
    if traced:
        trace(model)
    if cuda_graphs and torch_device.type == "cuda":
        try:
            model.graphs = GraphedPass(model.passes, config.pad_token_id, limit, max_tokens=graph_tokens)
        except RuntimeError as error:  # a family whose pass cannot be recorded: it runs as before
            logger.warning("the embedding pass of %s could not be recorded as CUDA graphs: %s", name, error)
    if torch_device.type == "cuda" and precision.weights in (torch.float16, torch.bfloat16):
        # Passes the graphs do not hold run eagerly with the attention core on the packed tokens (flash attention's
        # variable-length kernel) instead of the traced padded core: 4 to 11 % more tokens/s at 512 and 2,048 rows
        # on an H100 (BENCHMARKS.md, "Packed attention"). The trace cannot hold it: it would fix the longest row.
        model.passes.varlen = True
        model.graph = None
    logger.info(
        "loaded %s (%s) from %s on %s in %.2f s: the checkpoint's %s weights kept in %s%s, products in %s%s",
        name,
        config.family,
        model_dir,
        torch_device,
        time.perf_counter() - started,
        _name(stored),
        _name(precision.explicit),
        "" if precision.shared else f" and in {_name(precision.weights)} for the embedding pass",
        _name(precision.compute),
        f"; {model.scores_method} scores" if model.scores_method else "",
    )
    return model


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
