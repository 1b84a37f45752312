"""What a pass is asked for and what it gives back, as plain data (numpy arrays, numbers): the messages' payloads
between the services and the model, read and written without torch; and the arithmetic on them that the services
do themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

    from model.spec.checkpoint import Pooling
    from model.spec.config import RopeScaling


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """``normalize`` for arrays: each vector along the last axis L2-normalised (a zero vector stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)  # (…, 1)
    return vectors / np.maximum(norms, 1e-12)  # F.normalize's epsilon


def keep_dimensions(vectors: np.ndarray, dimensions: int, normalize_again: bool = True) -> np.ndarray:
    """Matryoshka: the first ``dimensions`` components of each row of (B, D), L2-normalised again if asked."""
    kept = vectors[..., :dimensions]  # (B, d)
    return unit_rows(kept) if normalize_again else kept


@dataclass(frozen=True)
class EmbeddingSpec:
    """What one text asks of a forward pass."""

    layer: int  # the hidden state, made absolute by TextEncoder.resolve_layer: 0 = embeddings, N = last layer
    pooling: Pooling  # how its token vectors become one sentence vector
    normalize: bool  # L2-normalise the sentence vector
    token_vectors: bool = False  # also return the text's token vectors
    skip: int = 0  # its first tokens left out of the pooling (a prompt, where the model excludes prompts)


@dataclass(frozen=True)
class TextEmbedding:
    """One text's result: its sentence vector and, when asked for, its token vectors."""

    sentence: np.ndarray  # (D',) float32
    tokens: np.ndarray | None = None  # (T, D) float32, the text's own tokens only (no padding)


@dataclass(frozen=True, eq=False)
class EmbeddedTexts(Sequence[TextEmbedding]):
    """A pass's texts' results as arrays: every sentence vector in one (n, D') array, and each text's token vectors
    where its spec asked (else None). Read by index, a text is its ``TextEmbedding``; a slice is a view of the
    same arrays, so that a pass's answer reaches each request without an object a text."""

    sentences: np.ndarray  # (n, D') float32
    token_vectors: Sequence[np.ndarray | None] | None = None  # n entries; None where no text asked for them

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # Sequence's int and slice overloads
        tokens = self.token_vectors
        if isinstance(index, slice):
            return EmbeddedTexts(self.sentences[index], None if tokens is None else tokens[index])
        return TextEmbedding(self.sentences[index], None if tokens is None else tokens[index])


def joined_results(parts: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """A request's results from several passes, in order, as one: one pass's answer as it is, arrays joined where
    every part is arrays, else a list."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(part, EmbeddedTexts) for part in parts):
        embedded: list[EmbeddedTexts] = list(parts)  # type: ignore[arg-type]
        tokens = (
            None
            if all(part.token_vectors is None for part in embedded)
            else [vectors for part in embedded for vectors in (part.token_vectors or [None] * len(part))]
        )
        return EmbeddedTexts(np.concatenate([part.sentences for part in embedded]), tokens)
    if all(isinstance(part, ScoredTexts) for part in parts):
        scored: list[ScoredTexts] = list(parts)  # type: ignore[arg-type]
        return ScoredTexts(
            np.concatenate([part.logits for part in scored]), np.concatenate([part.probabilities for part in scored])
        )
    return [result for part in parts for result in part]


def sentence_rows(results: Sequence[TextEmbedding]) -> np.ndarray:
    """Embed results' sentence vectors as one (n, D') array: the array itself where they came as one."""
    if isinstance(results, EmbeddedTexts):
        return results.sentences
    return np.stack([result.sentence for result in results])


def token_rows(results: Sequence[TextEmbedding]) -> list[np.ndarray | None]:
    """Embed results' token vectors, each text's (T, D) or None where it did not ask for them."""
    if isinstance(results, EmbeddedTexts):
        return [None] * len(results) if results.token_vectors is None else list(results.token_vectors)
    return [result.tokens for result in results]


@dataclass(frozen=True)
class SparseVector:
    """One text's sparse vector: vocabulary ids ascending and their weights, the non-zero ones only."""

    indices: np.ndarray  # (n,) int64
    values: np.ndarray  # (n,) float32


@dataclass(frozen=True)
class MultiVectors:
    """One text's multi-vector output: the vectors of its scored tokens (n, D') float32, and their positions in
    the pass (a position at or past the text's length is a query expansion's)."""

    vectors: np.ndarray
    positions: np.ndarray  # (n,) int64, ascending


@dataclass(frozen=True)
class MultiVectorOptions:
    """A multi-vector pass's per-text option: encode it as a query (else as a document)."""

    query: bool = False


@dataclass(frozen=True)
class SparseOptions:
    """A sparse pass's per-text option: keep only the ``top_k`` largest weights (all when None)."""

    top_k: int | None = None


@dataclass(frozen=True)
class Scores:
    """What a classification pass gives one text (or pair)."""

    logits: np.ndarray  # (labels,) float32
    probabilities: np.ndarray  # (labels,): softmax, or a sigmoid per label (multi-label heads, cross-encoders)


@dataclass(frozen=True, eq=False)
class ScoredTexts(Sequence[Scores]):
    """A classification pass's texts' scores as arrays, (n, labels) each: read by index, a text is its ``Scores``;
    a slice is a view of the same arrays."""

    logits: np.ndarray
    probabilities: np.ndarray

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # Sequence's int and slice overloads
        if isinstance(index, slice):
            return ScoredTexts(self.logits[index], self.probabilities[index])
        return Scores(self.logits[index], self.probabilities[index])


def score_rows(results: Sequence[Scores]) -> ScoredTexts:
    """Classification results as arrays (n, labels): themselves where they came as arrays."""
    if isinstance(results, ScoredTexts):
        return results
    return ScoredTexts(
        np.stack([result.logits for result in results]), np.stack([result.probabilities for result in results])
    )


ATTRIBUTION_METHODS = ("integrated_gradients", "gradient_x_input")


@dataclass(frozen=True)
class AttributionOptions:
    """What to attribute and how, for each of a task's texts: the output explained of each (a label's index; 0 for a
    model with one output or a yes/no reranker), the method (``ATTRIBUTION_METHODS``), integrated gradients' steps,
    each text's baseline token ids (the text's, with every token but the special ones made the pad token), the
    tokens a pass may hold (the texts' points, steps × a text's tokens each, split into passes within it), and the
    span of the steps computed, [first, stop) of ``steps`` (all where None): an explanation of more points than a
    pass holds goes as several tasks, a span each, whose attributions add up to the whole."""

    targets: tuple[int, ...]
    method: str
    steps: int
    baselines: tuple[tuple[int, ...], ...]
    tokens: int = 4096
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class Attribution:
    """Each token's share of a score, summed over the hidden size (T,); the score at the input, and for integrated
    gradients the score at the baseline and the convergence delta (sum of the attributions minus the difference
    of the two scores)."""

    attributions: np.ndarray
    score: float
    baseline_score: float | None
    convergence_delta: float | None


@dataclass(frozen=True)
class PositionQuery:
    """A positional encoding to compute: the seeds' sinusoid, the model's learned table, rotary angles (with a
    scaling where the model's own are asked for), or the relative-position buckets of query i and key j."""

    kind: str  # "sinusoidal", "learned", "rotary" or "relative"
    length: int
    d_model: int = 0  # the sinusoid's width, the rotary head width; unused for the model's own tables
    base: float = 10000.0
    scaling: RopeScaling | None = None


Aggregate = Literal["none", "mean", "rollout"]


Weighting = Literal["attention", "norm"]


class IndexOutOfRange(ValueError):
    """A layer or head index outside the model, with its position in the request's list."""

    def __init__(self, position: int, value: int, count: int) -> None:
        super().__init__(f"{value} is out of range: there are {count} ({-count} to {count - 1})")
        self.position = position


def resolve_indices(values: Sequence[int] | None, count: int) -> list[int]:
    """Layer or head indices, negative ones counted from the end; all of them when None."""
    if values is None:
        return list(range(count))
    resolved = []
    for position, value in enumerate(values):
        if not -count <= value < count:
            raise IndexOutOfRange(position, value, count)
        resolved.append(value % count)
    return resolved


@dataclass(frozen=True)
class AttentionSelection:
    """Which attention maps a request wants, and how they are combined."""

    layers: tuple[int, ...]  # absolute layer indices, in the order asked
    heads: tuple[int, ...]  # absolute head indices, in the order asked
    aggregate: Aggregate = "none"
    weighting: Weighting = "attention"  # norm: α_ij · ‖f_h(x_j)‖ (Kobayashi et al. 2020)
    words: tuple[tuple[int, ...], ...] | None = None  # token positions of each word, to merge into (Clark et al.)

    @property
    def deepest(self) -> int:
        """Layers that must be computed: up to the deepest one selected."""
        return max(self.layers) + 1

    def shape(self, n_tokens: int) -> tuple[int, int, int, int]:
        """The shape of the selected maps for a text of ``n_tokens`` tokens (of its words, when merged)."""
        head_axis = len(self.heads) if self.aggregate == "none" else 1
        n = len(self.words) if self.words is not None else n_tokens
        return (len(self.layers), head_axis, n, n)


HEAD_STATISTICS = (
    "entropy",
    "distance",
    "to_cls",
    "to_sep",
    "to_punctuation",
    "to_self",
    "to_previous",
    "to_next",
)


GPU_PASS_TOKENS = 16384  # padded tokens a pass on a GPU, unless set: the largest pass, and the largest bucket


# The neuron view's arrays of one head's steps (model/nn/encoder.py's HeadSteps, all but its scale).
HEAD_STEP_ARRAYS = ("queries", "keys", "values", "scores", "attention", "context")


class HeadSteps(NamedTuple):
    """One head of one layer on one text of T tokens, step by step (the neuron view): tensors where the encoder
    computes them, numpy arrays once the model hands them out (model/runtime/tasks.py, neuron_view)."""

    queries: Tensor | np.ndarray  # (T, Dh), after the per-head norm and the rotation where the model has them
    keys: Tensor | np.ndarray  # (T, Dh), likewise (its key/value head's, under grouped-query attention)
    values: Tensor | np.ndarray  # (T, Dh)
    scale: float  # what q · k is multiplied by: 1/√Dh for BERT
    scores: Tensor | np.ndarray  # (T, T): scale · q kᵀ (+ the position bias), before masking and softmax
    attention: Tensor | np.ndarray  # (T, T): softmax of the masked scores
    context: Tensor | np.ndarray  # (T, Dh): attention · values
