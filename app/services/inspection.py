"""/attention, /attention/heads, /similarity and /positional-encoding: what the model attends to, what made two
texts similar, and how it encodes positions."""

from __future__ import annotations

import asyncio
import math
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from tokenizers import Encoding

from app.engine.messages import ExplainInputs, HeadChoice, KeyMarks, Task
from app.errors import InvalidRequest
from app.schemas import (
    AttentionRequest,
    HeadStatisticsRequest,
    NeuronRequest,
    SimilarityRequest,
)
from app.services.embeddings import Embeddings, tokens_in
from app.serving.registry import ServedModel
from app.settings import Settings
from model import (
    AttentionSelection,
    EmbeddingSpec,
    HeadSteps,
    IndexOutOfRange,
    PositionQuery,
    TextTokenizer,
    Word,
    maxsim,
    resolve_indices,
    sentence_rows,
)


@dataclass(frozen=True)
class Attended:
    """A text's (or pair's) selected attention maps, for any API to write."""

    model: str
    weights: np.ndarray  # (L', H', T', T') as selected and aggregated, rounded where asked
    tokens: list[str]  # the maps' rows: the tokens, or the words they were merged into
    encoding: Encoding  # the text's tokens
    words: list[Word] | None  # the words and their tokens, where the maps are merged into words
    selection: AttentionSelection


@dataclass(frozen=True)
class Steps:
    """One head of one layer step by step (the neuron view), for any API to write."""

    model: str
    encoding: Encoding
    layer: int
    head: int
    steps: HeadSteps


@dataclass(frozen=True)
class HeadMeans:
    """Every layer's and head's statistics, averaged over the texts, for any API to write."""

    model: str
    layers: int
    heads: int
    n_texts: int
    means: np.ndarray  # (S, L, H), one (L, H) table a statistic of HEAD_STATISTICS


@dataclass(frozen=True)
class Positions:
    """A table of positional encodings (or, ``kind=relative``, of relative-position buckets)."""

    kind: str
    length: int
    d_model: int
    base: float | None
    encoding: np.ndarray  # (length, d_model)
    buckets: int | None = None


@dataclass(frozen=True)
class Explained:
    """A similarity split into its terms: ``contributions[i][j]`` of source token i and text token j."""

    source_tokens: list[str]
    tokens: list[str]
    contributions: np.ndarray  # (S, T)
    method: str


@dataclass(frozen=True)
class Similarities:
    """The source's similarity with each text, for any API to write."""

    model: str
    scores: list[float]  # one for each text
    explanations: list[Explained] | None  # one for each text, where asked
    tokens_used: int
    n_values: int  # the numbers the explanations hold


def statistics_slices(lengths: Sequence[int], per_token_squared: int, slice_values: int) -> list[list[int]]:
    """Text indices cut into slices of similar lengths (little padding) whose padded attention, texts ×
    per_token_squared × longest², stays within ``slice_values``; a text too long for any slice has one alone."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    slices: list[list[int]] = []
    for i in order:  # ascending: the newest member of a slice is its longest
        if slices and (len(slices[-1]) + 1) * per_token_squared * lengths[i] ** 2 <= slice_values:
            slices[-1].append(i)
        else:
            slices.append([i])
    return slices


SEPARATORS = frozenset({"[SEP]", "</s>"})


def is_punctuation(text: str) -> bool:
    """Made only of Unicode punctuation (categories P*), and not empty."""
    return bool(text) and all(unicodedata.category(character).startswith("P") for character in text)


def key_marks(encodings: Sequence[Encoding], texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which tokens of each padded row are separators (special tokens [SEP], </s>) and punctuation (a token
    whose span of the text is made only of punctuation, so RoBERTa's "Ġ," counts): two (B, T) bool arrays."""
    T = max(len(encoding.ids) for encoding in encodings)
    separators = np.zeros((len(encodings), T), dtype=bool)
    punctuation = np.zeros((len(encodings), T), dtype=bool)
    for row, (encoding, text) in enumerate(zip(encodings, texts)):
        for position, (token, special, (start, end)) in enumerate(
            zip(encoding.tokens, encoding.special_tokens_mask, encoding.offsets)
        ):
            if special:
                separators[row, position] = token in SEPARATORS
            else:
                punctuation[row, position] = is_punctuation(text[start:end])
    return separators, punctuation


def statistics_task(encodings: Sequence[Encoding], texts: Sequence[str]) -> Task:
    """One slice of the head statistics as a task: its texts and which of their keys are separators and
    punctuation."""
    separators, punctuation = key_marks(encodings, texts)
    return Task("head_statistics", encodings, KeyMarks(separators, punctuation))


def resolve(values: list[int] | None, count: int, param: str) -> tuple[int, ...]:
    """Layer or head indices made absolute, or a 422 naming the one out of range (``param[i]`` for a list,
    ``param`` for a single index)."""
    try:
        return tuple(resolve_indices(values, count))
    except IndexOutOfRange as error:
        name = param if param in ("layer", "head") else f"{param}[{error.position}]"
        raise InvalidRequest(name, str(error)) from error


class Inspection:
    def __init__(self, settings: Settings, embeddings: Embeddings) -> None:
        self.settings = settings
        self.embeddings = embeddings  # for its batch limit

    async def attention(self, served: ServedModel, request: AttentionRequest, binary: bool = False) -> Attended:
        """The selected maps; with ``binary`` (for a NumPy .npz archive) under its own, larger bound."""
        config = served.card.config
        (encoding,) = await served.attention_tokens.encode(
            [request.text], [request.text_pair], truncate=request.truncate, param="text", indexed=False
        )
        words = TextTokenizer.words(encoding, (request.text, request.text_pair)) if request.level == "word" else None
        selection = AttentionSelection(
            layers=resolve(request.layers, config.n_layers, "layers"),
            heads=resolve(request.heads, config.n_heads, "heads"),
            aggregate=request.aggregate,
            weighting=request.weighting,
            words=tuple(word.positions for word in words) if words is not None else None,
        )
        # The bound is on the token maps computed (word maps are merged from them), and on what is sent.
        L, H, T, _ = replace(selection, words=None).shape(len(encoding.ids))
        n_values = L * H * T * T
        limit = self.settings.max_attention_values_binary if binary else self.settings.max_attention_values
        if n_values > limit:
            hint = "" if binary else " or ask for the binary answer (Accept: application/x-npz, a larger limit)"
            raise InvalidRequest(
                "layers",
                f"the response would hold {n_values:,} attention weights ({L} layers × {H} heads × {T} × {T} "
                f"tokens), more than the limit of {limit:,}: select fewer layers or heads, use aggregate 'mean', "
                f"send a shorter text{hint}",
            )
        (weights,) = await served.queue.run(Task("attention", [encoding], selection))
        if request.decimals is not None:
            weights = np.round(weights, request.decimals)
        tokens = [word.text for word in words] if words is not None else list(encoding.tokens)
        return Attended(served.name, weights, tokens, encoding, words, selection)

    async def neuron(self, served: ServedModel, request: NeuronRequest) -> Steps:
        """One head of one layer, step by step (the seeds' computation on the real weights)."""
        config = served.card.config
        (layer,) = resolve([request.layer], config.n_layers, "layer")
        (head,) = resolve([request.head], config.n_heads, "head")
        (encoding,) = await served.attention_tokens.encode(
            [request.text], [request.text_pair], truncate=request.truncate, param="text", indexed=False
        )
        (steps,) = await served.queue.run(Task("neuron", [encoding], HeadChoice(layer, head)))
        return Steps(served.name, encoding, layer, head, steps)

    async def head_statistics(self, served: ServedModel, request: HeadStatisticsRequest) -> HeadMeans:
        """API.md's statistics of every layer and head, averaged over the texts: the texts are cut into slices
        of at most ``inspection_slice_values`` attention weights, each one pass of the explicit path."""
        settings = self.settings
        self.embeddings.check_batch(len(request.texts))
        config = served.card.config
        encodings = await served.attention_tokens.encode(request.texts, truncate=request.truncate, param="texts")
        per_text = config.n_layers * config.n_heads  # attention weights per token² of a text
        lengths = [len(encoding.ids) for encoding in encodings]
        n_values = sum(per_text * T * T for T in lengths)
        if n_values > settings.max_head_statistics_values:
            raise InvalidRequest(
                "texts",
                f"the statistics would take {n_values:,} attention weights (texts × {config.n_layers} layers × "
                f"{config.n_heads} heads × tokens²), more than the limit of {settings.max_head_statistics_values:,}: "
                "send fewer or shorter texts, or split them over several requests and average the results",
            )
        slices = statistics_slices(lengths, per_text, settings.inspection_slice_values)
        tasks = await asyncio.to_thread(  # the key marks, a Python loop over the tokens, off the event loop
            lambda: [statistics_task([encodings[i] for i in rows], [request.texts[i] for i in rows]) for rows in slices]
        )
        parts = await served.queue.run_in_turn(tasks)
        per_text_statistics = np.concatenate(parts, axis=1)  # (S, N, L, H), the texts in slice order
        with warnings.catch_warnings():  # a statistic no text has (to_next of one-token texts) stays NaN → null
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(per_text_statistics, axis=1)  # (S, L, H)
        return HeadMeans(served.name, config.n_layers, config.n_heads, len(encodings), means)

    async def similarity(self, served: ServedModel, request: SimilarityRequest) -> Similarities:
        """Cosine similarity of the source's sentence embedding with each text's, from one shared pass; with
        ``explain`` each score split into source token × text token contributions (explain_similarity)."""
        settings = self.settings
        self.embeddings.check_batch(len(request.texts))
        model = served.card
        if model.multi_vector is not None:
            if request.prompt_name is not None:
                raise InvalidRequest(
                    "prompt_name", "a multi-vector model reads the source and texts with its own prompts"
                )
            return await self.late_similarity(served, request)
        # Dense modules after pooling go through a weighted sum whose weights sum to 1 only where they are affine
        # (no activation), and not through a max or a sum scaled by √n
        pooled_apart = model.pooling.mode in ("max", "mean_sqrt_len_tokens")
        if request.explain and model.pooling.dense and (not model.pooling.affine or pooled_apart):
            raise InvalidRequest(
                "explain",
                f"model {served.name!r} pools by {model.pooling.mode} and then applies Dense modules"
                f"{' with an activation' if not model.pooling.affine else ''}: its cosine does not split into token "
                "pairs exactly; send explain false",
            )
        texts, skip = self.embeddings.prompted(served, [request.source, *request.texts], request.prompt_name)
        (source_encoding,) = await served.tokens.encode(
            texts[:1], truncate=request.truncate, param="source", indexed=False
        )
        encodings = await served.tokens.encode(texts[1:], truncate=request.truncate, param="texts")
        n_values = len(source_encoding.ids) * sum(len(encoding.ids) for encoding in encodings) if request.explain else 0
        if n_values > settings.max_explanation_values:  # 0 without explain
            raise InvalidRequest(
                "texts",
                f"the explanations would hold {n_values:,} contributions (source tokens × text tokens, summed over "
                f"the texts), more than the limit of {settings.max_explanation_values:,}: send fewer or shorter "
                "texts, or explain false",
            )
        spec = EmbeddingSpec(
            layer=model.config.n_layers,
            pooling=model.pooling.mode,
            normalize=True,
            token_vectors=request.explain,
            skip=skip,
        )
        results = await served.queue.run(Task("embed", [source_encoding, *encodings], spec))
        sentences = sentence_rows(results)  # (1 + N, D), unit length
        scores = sentences[1:] @ sentences[0]  # (N,)
        explanations = None
        if request.explain:
            inputs = ExplainInputs(results[0].tokens, tuple(result.tokens for result in results[1:]), skip)
            (explained,) = await served.queue.run(Task("explain", options=inputs))
            explanations = [
                Explained(list(source_encoding.tokens), list(encoding.tokens), contributions, method)
                for encoding, (contributions, method) in zip(encodings, explained, strict=True)
            ]
        used = tokens_in([source_encoding, *encodings])
        return Similarities(served.name, [float(score) for score in scores], explanations, used, n_values)

    async def late_similarity(self, served: ServedModel, request: SimilarityRequest) -> Similarities:
        """/similarity on a multi-vector model: MaxSim of the source read as a query with each text read as a
        document (as /rerank scores them); with ``explain`` each score's terms, [i][j] the dot product of the
        source's vector i and the text's vector j where j is i's best match and 0 elsewhere (divided by the
        source's vector count where the model averages), which sum to the score."""
        vectors = self.embeddings.late_vectors
        ((source,), sources, (source_tokens,)), (documents, results, tokens) = await asyncio.gather(
            vectors(served, [request.source], query=True, truncate=request.truncate, param="source", indexed=False),
            vectors(served, request.texts, query=False, truncate=request.truncate),
        )
        query = sources[0].vectors  # (q, D')
        n_values = len(query) * sum(len(result.vectors) for result in results) if request.explain else 0
        limit = self.settings.max_explanation_values
        if n_values > limit:  # 0 without explain
            raise InvalidRequest(
                "texts",
                f"the explanations would hold {n_values:,} contributions (source vectors × text vectors, summed "
                f"over the texts), more than the limit of {limit:,}: send fewer or shorter texts, or explain false",
            )
        late = served.card.late_interaction
        mean = late is None or late.mean
        scores = [maxsim(query, result.vectors, mean) for result in results]
        explanations = None
        if request.explain:
            explanations = []
            for result, names in zip(results, tokens, strict=True):
                products = query @ result.vectors.T  # (q, d)
                contributions = np.zeros_like(products)
                if products.size:
                    rows, best = np.arange(len(query)), products.argmax(axis=1)
                    contributions[rows, best] = products[rows, best] / (len(query) if mean else 1)
                explanations.append(Explained(source_tokens, names, contributions, "maxsim"))
        return Similarities(served.name, scores, explanations, tokens_in([source, *documents]), n_values)

    async def positional_encoding(
        self,
        served: ServedModel,
        kind: Literal["sinusoidal", "learned", "rotary", "relative"],
        length: int,
        d_model: int | None,
        base: float | None,
    ) -> Positions:
        model, config, settings = served.card, served.card.config, self.settings
        if kind == "learned":
            table = model.position_table
            if table is None:
                raise InvalidRequest(
                    "kind",
                    f"model {served.name!r} has no position table: its positions are {config.position_embedding} "
                    f"(ask for kind={'rotary' if config.position_embedding == 'rotary' else 'relative'})",
                )
            if length > table[0]:
                raise InvalidRequest("length", f"must be at most {table[0]}, the model's positions, got {length}")
            (encoding,) = await served.queue.run(Task("positions", options=PositionQuery(kind, length)))  # (length, E)
            return Positions(kind, length, table[1], None, encoding)
        if kind == "relative":
            buckets = model.relative_buckets
            if buckets is None:
                raise InvalidRequest(
                    "kind",
                    f"model {served.name!r} has no relative positions: its positions are {config.position_embedding}",
                )
            if length > settings.pe_max_length:
                raise InvalidRequest("length", f"must be at most {settings.pe_max_length}, got {length}")
            if length * length > settings.pe_max_values:
                raise InvalidRequest(
                    "length", f"length² = {length * length:,} is more than the limit of {settings.pe_max_values:,}"
                )
            (matrix,) = await served.queue.run(
                Task("positions", options=PositionQuery(kind, length))
            )  # (length, length)
            return Positions(kind, length, length, None, matrix, buckets)

        rotary = kind == "rotary"
        own = rotary and config.position_embedding == "rotary" and base is None  # the model's own angles
        scaling = config.rope_scaling if own else None
        if base is None:
            base = config.rope_theta if own else 10000.0
        if d_model is None:
            d_model = config.head_dim if rotary else config.d_model
        if length > settings.pe_max_length:
            raise InvalidRequest("length", f"must be at most {settings.pe_max_length}, got {length}")
        if d_model > settings.pe_max_d_model:
            raise InvalidRequest("d_model", f"must be at most {settings.pe_max_d_model}, got {d_model}")
        if d_model % 2 != 0:
            raise InvalidRequest("d_model", f"must be even for the {kind} encoding, got {d_model}")
        if length * d_model > settings.pe_max_values:
            raise InvalidRequest(
                "length",
                f"length × d_model = {length * d_model:,} is more than the limit of {settings.pe_max_values:,}",
            )
        if not (math.isfinite(base) and base > 1):
            raise InvalidRequest("base", f"must be a finite number greater than 1, got {base}")
        query = PositionQuery(kind, length, d_model, base, scaling)
        (encoding,) = await served.queue.run(Task("positions", options=query))
        return Positions(kind, length, d_model, base, encoding)
