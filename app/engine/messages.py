"""The one message between the services and the engine that runs the models: a task.

A task is one kind of computation (embed, classify, an inspection) on tokenised texts, with that kind's options;
what comes back is arrays and small records. Every kind is this one type, and it holds token ids, numbers and
arrays only (no closure, no model object): the queue that carries it knows nothing of the model, the engine runs a
pass of one kind through the model's method for that kind (``app/engine/worker.py``, ``PASSES``), and the same message
can cross to another process as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from model import AttentionSelection, EmbeddingSpec, MultiVectorOptions, PositionQuery, SparseOptions, TokenSequence

TaskKind = Literal[
    "embed", "classify", "sparse", "multi_vector", "attention", "neuron", "head_statistics", "explain", "positions"
]

# Kinds whose texts are entries of their own, so that the texts of many requests share a pass; a task of any
# other kind is one entry and a pass of its own.
BATCHED: frozenset[TaskKind] = frozenset({"embed", "classify", "sparse", "multi_vector"})


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
    | PositionQuery
    | None
)


@dataclass(frozen=True, slots=True)
class Task:
    """What to compute (``kind`` and its ``options``) on which texts.

    ``embed``: an EmbeddingSpec, one result (TextEmbedding) a text. ``classify``: no options, one Scores a text.
    ``sparse``: SparseOptions, one SparseVector a text. ``multi_vector``: MultiVectorOptions, one MultiVectors a text.
    ``attention``: an AttentionSelection on one text, its maps. ``neuron``: a HeadChoice on one text, its
    HeadSteps. ``head_statistics``: KeyMarks of the texts, (S, B, L, H) statistics. ``explain``: ExplainInputs,
    no texts, each text's contributions and method. ``positions``: a PositionQuery, no texts, the table.
    """

    kind: TaskKind
    texts: Sequence[TokenSequence] = ()
    options: Options = None

    @property
    def batched(self) -> bool:
        return self.kind in BATCHED
