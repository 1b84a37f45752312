"""The one message between the services and the engine that runs the models: a task.

A task is one kind of computation (embed, classify, an inspection) on tokenised texts, with that kind's options;
what comes back is arrays and small records. Every kind is this one type, and it holds token ids, numbers and
arrays only (no closure, no model object): the queue that carries it knows nothing of the model, the engine runs a
pass of one kind through that kind's function of the loaded model (model/runtime/tasks.py), and the same message can
cross to another process as it is. Each kind is declared once, in ``KINDS``: whether it is batched, its options, its
pass. Beside the task goes
its ``Timing``: the time left to it, and where its time went (queue, pass), which the answer's headers report.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

import model
from model import (
    AttentionSelection,
    AttributionOptions,
    EmbeddingSpec,
    MultiVectorOptions,
    PositionQuery,
    SparseOptions,
    TokenSequence,
)

if TYPE_CHECKING:
    from model import TextEncoder

TaskKind = Literal[
    "embed",
    "classify",
    "sparse",
    "multi_vector",
    "attention",
    "neuron",
    "head_statistics",
    "explain",
    "attribute",
    "positions",
]


@dataclass
class Timing:
    """Where one request's time went: tokenising, waiting in the queue, then computing; and when its time runs out
    (the event loop's clock), so that work sent elsewhere carries the time left."""

    queue_s: float = 0.0
    inference_s: float = 0.0
    deadline: float | None = None
    tokenization_s: float = 0.0  # added to by the tokenisation stage, which finds it in REQUEST_TIMING

    def left_s(self, default: float) -> float:
        """Seconds until the deadline (at least 0), or ``default`` where there is none."""
        if self.deadline is None:
            return default
        return max(0.0, self.deadline - asyncio.get_running_loop().time())


# The Timing of the request the calling task works for (set by the responder for the request's work): where the
# tokenisation stage adds its time, and the queue (a Runner) its wait, its computing and the request's deadline; no
# service passes a Timing by hand.
REQUEST_TIMING: contextvars.ContextVar[Timing | None] = contextvars.ContextVar("request_timing", default=None)


@dataclass(frozen=True)
class ModelFacts:
    """Where and how the engine computes a model: what /info reports beside the card."""

    device: str
    dtype: str  # what the products run in
    weights_dtype: str  # what the embedding pass's weights are kept in
    explicit_weights_dtype: str  # what the explicit paths' weights are kept in
    max_batch_tokens: int  # the padded tokens a pass takes at most
    runtime: str = "torch"  # what computes the embedding pass (TextEncoder.runtime)


@dataclass(frozen=True, slots=True)
class HeadChoice:
    """The neuron view's layer and head (absolute indices)."""

    layer: int
    head: int


@dataclass(frozen=True, slots=True)
class KeyMarks:
    """Which keys of the padded batch are separators and punctuation, for the head statistics: (B, T) bool each."""

    separators: np.ndarray
    punctuation: np.ndarray


@dataclass(frozen=True, slots=True)
class ExplainInputs:
    """The final token vectors of a similarity's source (n, D) and of each text (m, D), and the prompt's tokens
    that the pooling left out of each."""

    source: np.ndarray
    texts: tuple[np.ndarray, ...]
    skip: int = 0


Options = (
    EmbeddingSpec
    | SparseOptions
    | MultiVectorOptions
    | AttentionSelection
    | HeadChoice
    | KeyMarks
    | ExplainInputs
    | AttributionOptions
    | PositionQuery
    | None
)


@dataclass(frozen=True, slots=True)
class Task:
    """What to compute (``kind`` and its ``options``) on which texts.

    ``embed``: an EmbeddingSpec, one result (TextEmbedding) per text. ``classify``: no options, one Scores per
    text. ``sparse``: SparseOptions, one SparseVector per text. ``multi_vector``: MultiVectorOptions, one
    MultiVectors per text.
    ``attention``: an AttentionSelection on one text, its maps. ``neuron``: a HeadChoice on one text, its
    HeadSteps. ``head_statistics``: KeyMarks of the texts, (S, B, L, H) statistics. ``explain``: ExplainInputs,
    no texts, each text's contributions and method. ``attribute``: AttributionOptions on a few texts (or pairs),
    each text's Attribution. ``positions``: a PositionQuery, no texts, the table.
    """

    kind: TaskKind
    texts: Sequence[TokenSequence] = ()
    options: Options = None

    def __post_init__(self) -> None:
        declared = KINDS[self.kind].options
        if not (self.options is None if declared is None else isinstance(self.options, declared)):
            wanted = "no options" if declared is None else declared.__name__
            raise TypeError(f"a task of kind {self.kind!r} takes {wanted}, not {type(self.options).__name__}")

    @property
    def batched(self) -> bool:
        return KINDS[self.kind].batched

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its fields, as it is built: a slotted dataclass's own state sets each field by hand on the way
        back, a task's largest cost in crossing after its texts."""
        return Task, (self.kind, self.texts, self.options)


# What a pass of a kind runs: its function of the loaded model (model/runtime/tasks.py, through the package face, which
# imports it and torch on the first pass: a front end never does), given the pass's texts and options (for a batched
# kind one option per text, for another kind the task's one option), returning one result per text for a batched
# kind and a list of the task's one result otherwise. Called on a compute lane (app/engine/worker.py).
Pass = Callable[["TextEncoder", Sequence[TokenSequence], Any], Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of task, declared once: whether its texts are entries of their own, so that the texts of many
    requests share a pass (``batched``), else the task is one entry and a pass of its own; the type of its options;
    and its pass."""

    batched: bool
    options: type | None
    compute: Pass
    # Its pass holds up to a few hundred MiB (the attention maps of every layer and head, bounded per request by the
    # settings): the process computes at most ENCODER_INSPECTION_PASSES of these at once (app/engine/work_queue.py).
    large: bool = False


KINDS: dict[TaskKind, Kind] = {
    "embed": Kind(True, EmbeddingSpec, lambda loaded, texts, specs: model.tasks.embed_texts(loaded, texts, specs)),
    "classify": Kind(True, None, lambda loaded, texts, _: model.tasks.scores(loaded, texts)),
    "sparse": Kind(
        True, SparseOptions, lambda loaded, texts, options: model.tasks.sparse_vectors(loaded, texts, options)
    ),
    "multi_vector": Kind(
        True, MultiVectorOptions, lambda loaded, texts, options: model.tasks.multi_vectors(loaded, texts, options)
    ),
    "attention": Kind(
        False,
        AttentionSelection,
        lambda loaded, texts, selection: [model.tasks.attention_maps(loaded, texts[0], selection)],
        large=True,
    ),
    "neuron": Kind(
        False, HeadChoice, lambda loaded, texts, at: [model.tasks.neuron_view(loaded, texts[0], at.layer, at.head)]
    ),
    "head_statistics": Kind(
        False,
        KeyMarks,
        lambda loaded, texts, marks: [model.tasks.head_statistics(loaded, texts, marks.separators, marks.punctuation)],
        large=True,
    ),
    "explain": Kind(
        False,
        ExplainInputs,
        lambda loaded, _, inputs: [model.tasks.explain_similarities(loaded, inputs.source, inputs.texts, inputs.skip)],
    ),
    # with gradients, through every layer and back, several steps a pass: it holds as much as an attention pass
    "attribute": Kind(
        False,
        AttributionOptions,
        lambda loaded, texts, options: [model.tasks.attribute(loaded, texts, options)],
        large=True,
    ),
    "positions": Kind(False, PositionQuery, lambda loaded, _, query: [model.tasks.position_encoding(loaded, query)]),
}
