"""/rerank and /classify: the heads of cross-encoders, yes/no rerankers and sequence classifiers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from tokenizers import Encoding

from app.engine.messages import Task
from app.errors import CannotDo, InvalidRequest, ModelLacks
from app.schemas import (
    ClassifyRequest,
    ExplainRequest,
    RerankRequest,
)
from app.services.embeddings import Embeddings, second_segments, tokens_in
from app.serving.registry import ServedModel
from model import (
    YES_NO,
    Attribution,
    AttributionOptions,
    EmbeddingSpec,
    HeadConfig,
    SparseOptions,
    TextTokenizer,
    TokenIds,
    TokenSequence,
    maxsim,
    score_rows,
    sentence_rows,
)


def head_of(served: ServedModel, task: str, labels: int | None = None) -> HeadConfig:
    """The model's classification head, or a 422 naming the model when it cannot do the task."""
    head = served.card.head
    if head is None:
        raise ModelLacks(served.name, f"classification head, so it cannot {task}", task)
    if labels is not None and len(head.labels) != labels:
        raise CannotDo(f"model {served.name!r} has {len(head.labels)} outputs; to {task} it needs {labels}", task)
    return head


def rerank_method(served: ServedModel, asked: str | None = None) -> str:
    """How the model scores pairs (``ModelCard.rerank_methods``), the one ``asked`` for where it supports it; a 422
    naming the model when it cannot rerank, or ``method`` when it cannot score that way."""
    methods = served.card.rerank_methods
    if not methods:
        head_of(served, "rerank", labels=1)  # the 422 that names its number of outputs
    if asked is not None and asked not in methods:
        raise InvalidRequest("method", f"model {served.name!r} reranks by {', '.join(methods)}, not {asked}")
    return asked or methods[0]


# The sentence-transformers prompt names a query and a document are encoded with (encode_query, encode_document),
# where the model has them; else the model's default prompt.
QUERY_PROMPTS = ("query",)
DOCUMENT_PROMPTS = ("document", "passage", "corpus")


@dataclass(frozen=True)
class Ranked:
    """Documents scored against a query, for any API to write."""

    model: str
    method: str  # how they were scored (RerankMethod)
    order: list[int]  # the documents best first, as many as asked (top_n)
    scores: np.ndarray  # (B,) each document's score
    tokens_used: int
    explanations: list[Explanation] | None = None  # each document's, with explain


@dataclass(frozen=True)
class Labelled:
    """Texts' labels with their scores, best first, for any API to write."""

    model: str
    labels: list[list[tuple[str, float]]]  # each text's labels (as many as asked: top_k) and scores, best first
    tokens: list[int]  # each text's tokens computed (its pair's and the special tokens included)
    explanations: list[Explanation] | None = None  # each text's, of its top label, with explain

    @property
    def tokens_used(self) -> int:
        return sum(self.tokens)


@dataclass(frozen=True)
class Explanation:
    """A score's attribution to the tokens of its input."""

    tokens: list[str]
    attribution: Attribution


@dataclass(frozen=True)
class Explained:
    """Which tokens made a score, for any API to write."""

    model: str
    target: tuple[int, str] | None  # the label explained (index, name); None for a yes/no reranker's one score
    method: str
    steps: int | None  # integrated gradients' steps
    tokens: list[str]
    attribution: Attribution
    tokens_used: int


def baseline_of(encoding: TokenSequence, tokenizer: TextTokenizer) -> tuple[int, ...]:
    """An explanation's baseline: the text's ids with every token made the pad token but the special ones, those
    the tokenizer's post-processor added ([CLS], [SEP]) and those its vocabulary marks special (<|im_start|>)."""
    added = encoding.special_tokens_mask if isinstance(encoding, Encoding) else [0] * len(encoding.ids)
    special = tokenizer.special_ids
    return tuple(i if mark or i in special else tokenizer.pad_token_id for i, mark in zip(encoding.ids, added))


EXPLAIN_STEPS = 50  # integrated gradients' steps where a request asks only for its explanations (/explain's default)
# An explanation's task holds points of at most a pass's tokens ÷ this: its passes run forward and back in float32 and
# were each a whole pass of tokens long, where the embedding passes beside it are mostly far shorter. On two CPU cores
# with one compute lane, /encode's median latency beside explanations of 256 steps was 40x its latency alone with the
# whole explanation one task, 10x in spans of a pass, 4.2x in spans of a quarter (docs/benchmarks/inspection.md); a
# 50-step explanation of 63 tokens is still one task on a GPU (16,384 tokens a pass).
EXPLAIN_POINT_COST = 4


def explained_together(lengths: Sequence[int], steps: int, tokens: int) -> list[list[int]]:
    """Texts (their lengths) in groups of their indices, shortest first, whose points (``steps`` a text, each padded
    to the group's longest text, as a pass pads them) fit one pass of ``tokens``, one text at least a group: each group
    one task, its points computed together.

    Why: an explanation's points are rows of a few passes through the encoder and back; texts explained one task each
    paid a pass (and its fixed cost) apiece however short they were: on a GPU, where a pass of a few thousand tokens
    costs little more than its launches, 16 documents' explanations were 16 such passes. Shortest first, so that a
    group's texts are of like length: grouped in the order given, a pass padded its short texts' points to its
    longest's, and a group's padded points could spill into a pass more (/rerank's 16 documents of bench.explain:
    62,600 tokens of points where they hold 54,700; 57,300 shortest first). A group is still at most about a pass, so
    that a request that leaves has little of its work left to run, and other requests go between the groups."""
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if not groups or (len(groups[-1]) + 1) * steps * lengths[index] > tokens:  # the group's longest: this one
            groups.append([])
        groups[-1].append(index)
    return groups


def step_spans(length: int, steps: int, tokens: int) -> list[tuple[int, int]]:
    """Integrated gradients' ``steps`` for a text of ``length`` tokens in spans [first, stop) of as many points as
    ``tokens`` hold, one at least.

    Why: each span is one task of the engine, the next queued once the last is answered (``run_in_turn``), so that
    the requests that arrive meanwhile go between a long explanation's passes rather than wait for all of them: a
    lone compute lane (a GPU's, a CPU's of four threads or more) was held for the whole explanation."""
    each = max(1, tokens // length)
    return [(first, min(first + each, steps)) for first in range(0, steps, each)]


async def attributed(served: ServedModel, encoding: TokenSequence, options: AttributionOptions) -> Attribution:
    """One text's attribution, integrated gradients' steps in spans of a quarter of a pass (``step_spans``,
    ``EXPLAIN_POINT_COST``), their attributions summed and the convergence delta taken of the sum."""
    spans = step_spans(len(encoding.ids), options.steps, max(1, options.tokens // EXPLAIN_POINT_COST))
    if options.method != "integrated_gradients" or len(spans) == 1:
        ((attribution,),) = await served.queue.run(Task("attribute", [encoding], options))
        return attribution
    tasks = [Task("attribute", [encoding], replace(options, span=span)) for span in spans]
    parts = [part for (part,) in await served.queue.run_in_turn(tasks)]
    attributions = np.stack([part.attributions for part in parts]).sum(axis=0)
    score, baseline_score = parts[0].score, parts[0].baseline_score
    assert baseline_score is not None
    delta = float(attributions.sum(dtype=np.float64) - (score - baseline_score))
    return Attribution(attributions, score, baseline_score, delta)


class Tasks:
    def __init__(self, embeddings: Embeddings, max_explain_steps: int = 256, max_explained_texts: int = 16) -> None:
        self.embeddings = embeddings  # for its limits
        self.max_explain_steps = max_explain_steps
        self.max_explained_texts = max_explained_texts

    async def rerank(self, served: ServedModel, request: RerankRequest) -> Ranked:
        """Documents by relevance to the query: a cross-encoder's score of each (query, document) pair, a yes/no
        reranker's answer to each pair formatted in its template, or the similarity of the query's and each
        document's vectors (sparse or dense)."""
        method = rerank_method(served, request.method)
        self.embeddings.check_batch(len(request.documents), "documents")
        if request.explain and method not in ("cross-encoder", "yes-no"):
            raise InvalidRequest(
                "explain",
                f"explains the scores of cross-encoders and yes/no rerankers; model {served.name!r} ranks by "
                f"{method} (/similarity with explain: true says which token pairs made a similarity)",
            )
        if method in ("cosine", "sparse-dot", "maxsim"):
            if request.instruction is not None:
                raise InvalidRequest("instruction", f"applies to yes-no rerankers; model {served.name!r} is not one")
            by = {"cosine": self.cosine, "sparse-dot": self.sparse_dot, "maxsim": self.maxsim}[method]
            scores, counted = await by(served, request)
            return self.ranked(served, request, method, scores, counted)
        encodings: Sequence[TokenSequence]
        if method == "yes-no":
            encodings = await self.formatted(served, request)
        else:
            if request.instruction is not None:
                raise InvalidRequest("instruction", f"applies to yes-no rerankers; model {served.name!r} is a {method}")
            queries = [request.query] * len(request.documents)
            # (query, document) pairs, the query first as cross-encoders are trained; a pair too long for the
            # model is named by its document.
            encodings = await served.tokens.encode(
                queries, request.documents, truncate=request.truncate, param="documents", token_text=request.explain
            )
        if request.explain:
            self.check_explained(len(encodings))
        scored = await served.queue.run(Task("classify", encodings))
        rows = score_rows(scored)
        scores = (rows.logits if request.raw_scores else rows.probabilities)[:, 0]  # (B,)
        ranked = self.ranked(served, request, method, scores, encodings)
        if not request.explain:
            return ranked
        explanations = await self.explanations(served, encodings, [0] * len(encodings))
        return replace(ranked, explanations=explanations)

    @staticmethod
    def ranked(
        served: ServedModel,
        request: RerankRequest,
        method: str,
        scores: np.ndarray,
        encodings: Sequence[TokenSequence],
    ) -> Ranked:
        """The documents best first by ``scores`` (B,), as many as the request asks."""
        order = [int(i) for i in np.argsort(-scores, kind="stable")[: request.top_n]]
        return Ranked(served.name, method, order, scores, tokens_in(encodings))

    async def cosine(self, served: ServedModel, request: RerankRequest) -> tuple[np.ndarray, list[TokenSequence]]:
        """An embedding model's scores: the cosine of the query's and each document's embeddings, each encoded as
        sentence-transformers' encode_query and encode_document encode them (their prompts where the model has
        them)."""
        model = served.card
        query_prompt = next((name for name in QUERY_PROMPTS if name in model.prompts), None)
        document_prompt = next((name for name in DOCUMENT_PROMPTS if name in model.prompts), None)
        query, query_skip = self.embeddings.prompted(served, [request.query], query_prompt)
        documents, document_skip = self.embeddings.prompted(served, request.documents, document_prompt)
        (query_encoding,) = await served.tokens.encode(
            query, param="query", indexed=False, truncate=request.truncate, token_text=False
        )
        encodings = await served.tokens.encode(
            documents, param="documents", truncate=request.truncate, token_text=False
        )
        layer, pooling = model.config.n_layers, model.pooling.mode
        specs = (
            EmbeddingSpec(layer=layer, pooling=pooling, normalize=True, skip=query_skip),
            EmbeddingSpec(layer=layer, pooling=pooling, normalize=True, skip=document_skip),
        )
        query_vector, document_vectors = await asyncio.gather(
            served.queue.run(Task("embed", [query_encoding], specs[0])),
            served.queue.run(Task("embed", encodings, specs[1])),
        )
        documents_matrix = sentence_rows(document_vectors)  # (B, D)
        return documents_matrix @ query_vector[0].sentence, [query_encoding, *encodings]

    async def maxsim(self, served: ServedModel, request: RerankRequest) -> tuple[np.ndarray, list[TokenSequence]]:
        """A multi-vector model's scores, the query read as a query and each document as a document: for each of
        the query's vectors the best dot product with a document's, summed (ColBERT, as MultiVectorEncoder and
        PyLate score) or averaged over the query's vectors (BGE-M3, as FlagEmbedding scores it; a ColBERT
        checkpoint whose similarity is meanmaxsim)."""
        vectors = self.embeddings.late_vectors
        ((query,), queries, _), (documents, results, _) = await asyncio.gather(
            vectors(served, [request.query], query=True, truncate=request.truncate, param="query", indexed=False),
            vectors(served, request.documents, query=False, truncate=request.truncate, param="documents"),
        )
        late = served.card.late_interaction
        mean = late is None or late.mean
        scores = [maxsim(queries[0].vectors, document.vectors, mean) for document in results]
        return np.array(scores, dtype=np.float32), [query, *documents]

    async def sparse_dot(self, served: ServedModel, request: RerankRequest) -> tuple[np.ndarray, list[TokenSequence]]:
        """A SPLADE model's scores: the dot product of the query's and each document's sparse vectors."""
        (query_encoding,) = await served.tokens.encode(
            [request.query], param="query", indexed=False, truncate=request.truncate
        )
        encodings = await served.tokens.encode(request.documents, param="documents", truncate=request.truncate)
        vectors = await served.queue.run(Task("sparse", [query_encoding, *encodings], SparseOptions()))
        query = vectors[0]
        scores = []
        for document in vectors[1:]:
            _, in_query, in_document = np.intersect1d(query.indices, document.indices, return_indices=True)
            scores.append(float(query.values[in_query] @ document.values[in_document]))
        return np.array(scores, dtype=np.float32), [query_encoding, *encodings]

    @staticmethod
    async def formatted(served: ServedModel, request: RerankRequest) -> list[TokenIds]:
        """Each document in the yes/no template with the query and instruction (``YES_NO``), tokenised with no
        special token beyond those the template writes: the fixed prefix and suffix kept whole, the document cut
        where the whole is too long (with ``truncate``; else a 422 naming it)."""
        model = served.card
        instruction = request.instruction if request.instruction is not None else YES_NO.instruction
        head = YES_NO.head(instruction, request.query)
        middles = [head + document for document in request.documents]
        # cut at the model's length here (what overflows is kept aside, so that its length is known), and to fit
        # the template below
        encodings = await served.tokens.encode(middles, param="documents", special_tokens=False)
        (head_encoding,) = await served.tokens.encode([head], param="query", indexed=False, special_tokens=False)
        prefix, suffix = model.template_ids
        fixed = len(prefix) + len(suffix) + len(head_encoding.ids)
        if fixed >= model.max_tokens:
            raise InvalidRequest(
                "query",
                f"the template, instruction and query take {fixed} tokens of the {model.max_tokens} the model reads, "
                "leaving no room for a document: send a shorter query or instruction",
            )
        if not request.truncate:
            for index, encoding in enumerate(encodings):
                middle = len(encoding.ids) + sum(len(part.ids) for part in encoding.overflowing)
                n = len(prefix) + middle + len(suffix)
                if n > model.max_tokens:
                    raise InvalidRequest(
                        f"documents[{index}]",
                        f"in the template, the pair has {n} tokens, more than the maximum of {model.max_tokens} "
                        "(send truncate: true to cut the document)",
                    )
        return [model.tokenizer.around(prefix, encoding.ids, suffix) for encoding in encodings]

    async def explain(self, served: ServedModel, request: ExplainRequest) -> Explained:
        """Which tokens of a text (or pair) made the model's score (API.md, "POST /explain"): integrated gradients
        or gradient × input at the embedding block's output, for a classifier's label or a yes/no reranker's
        yes − no."""
        card = served.card
        if card.head is None and card.answers is None:
            raise InvalidRequest(
                "model",
                f"model {served.name!r} has no score to explain: it is an embedding model (/similarity with "
                "explain: true says which token pairs made its similarities)",
            )
        most = self.max_explain_steps
        if not 1 <= request.steps <= most:
            raise InvalidRequest(
                "steps", f"must be between 1 and {most} (ENCODER_MAX_EXPLAIN_STEPS), got {request.steps}"
            )
        encoding: TokenSequence
        if card.answers is not None:  # a yes/no reranker: the pair in its template, as /rerank scores it
            if request.text_pair is None:
                raise InvalidRequest("text_pair", "a yes/no reranker scores a pair: send the document as text_pair")
            if request.target not in (None, 0):
                raise InvalidRequest("target", "a yes/no reranker has one score (yes − no): send null or 0")
            pair = RerankRequest(query=request.text, documents=[request.text_pair], truncate=request.truncate)
            (encoding,) = await self.formatted(served, pair)
            target = None
        else:
            pairs = None if request.text_pair is None else [request.text_pair]
            (encoding,) = await served.tokens.encode(
                [request.text], pairs, truncate=request.truncate, param="text", indexed=False
            )
            target = await self.target(served, request.target, encoding)
        tokenizer = card.tokenizer
        baseline = baseline_of(encoding, tokenizer)
        steps = request.steps if request.method == "integrated_gradients" else None
        index = 0 if target is None else target[0]
        options = AttributionOptions((index,), request.method, steps or 1, (baseline,), served.facts.max_batch_tokens)
        attribution = await attributed(served, encoding, options)
        tokens = tokenizer.vocabulary_entries(encoding.ids)
        return Explained(served.name, target, request.method, steps, tokens, attribution, len(encoding.ids))

    @staticmethod
    async def target(served: ServedModel, asked: int | str | None, encoding: TokenSequence) -> tuple[int, str]:
        """The label an explanation is of: the one asked for by index or name, else the only one, else the one the
        model scores highest for the text (one pass more); a 422 naming ``target`` with the labels."""
        labels = head_of(served, "explain").labels
        if isinstance(asked, str):
            if asked not in labels:
                raise InvalidRequest(
                    "target", f"{asked!r} is not a label of model {served.name!r}: {', '.join(labels)}"
                )
            return labels.index(asked), asked
        if asked is not None:
            if not 0 <= asked < len(labels):
                raise InvalidRequest(
                    "target",
                    f"{asked} is out of range: model {served.name!r} has {len(labels)} "
                    f"label{'' if len(labels) == 1 else 's'}, {', '.join(labels)}",
                )
            return asked, labels[asked]
        if len(labels) == 1:
            return 0, labels[0]
        (scores,) = await served.queue.run(Task("classify", [encoding]))
        top = int(np.argmax(scores.logits))
        return top, labels[top]

    async def classify(self, served: ServedModel, request: ClassifyRequest) -> Labelled:
        """Labels with their scores: softmax over the labels, or a sigmoid per label for multi-label heads (the
        logits with ``raw_scores``)."""
        head = head_of(served, "classify")
        self.embeddings.check_batch(len(request.texts))
        pairs = second_segments(request.texts, request.text_pair)
        encodings = await served.tokens.encode(
            request.texts, pairs, truncate=request.truncate, param="texts", token_text=request.explain
        )
        if request.explain:
            self.check_explained(len(encodings))
        scores = score_rows(await served.queue.run(Task("classify", encodings)))
        probabilities = scores.logits if request.raw_scores else scores.probabilities  # (B, labels)
        labels = [
            [(head.labels[j], float(row[j])) for j in np.argsort(-row, kind="stable")[: request.top_k]]
            for row in probabilities
        ]
        explanations = None
        if request.explain:  # of each text's top label
            tops = scores.logits.argmax(axis=1).tolist()
            explanations = await self.explanations(served, encodings, tops)
        return Labelled(served.name, labels, [len(encoding.ids) for encoding in encodings], explanations)

    def check_explained(self, n_texts: int) -> None:
        if n_texts > self.max_explained_texts:
            raise InvalidRequest(
                "explain",
                f"explains at most {self.max_explained_texts} texts per request (ENCODER_MAX_EXPLAINED_TEXTS), this "
                f"one has {n_texts}: send fewer, or ask /explain for each",
            )

    @staticmethod
    async def explanations(
        served: ServedModel, encodings: Sequence[TokenSequence], targets: Sequence[int]
    ) -> list[Explanation]:
        """Each text's explanation with /explain's defaults (integrated gradients, 50 steps) of its ``targets``
        output: the texts in tasks of as many as a pass holds (``explained_together``), queued together."""
        tokenizer, budget = served.card.tokenizer, served.facts.max_batch_tokens
        tasks = []
        groups = explained_together([len(encoding.ids) for encoding in encodings], EXPLAIN_STEPS, budget)
        for group in groups:
            options = AttributionOptions(
                tuple(targets[i] for i in group),
                "integrated_gradients",
                EXPLAIN_STEPS,
                tuple(baseline_of(encodings[i], tokenizer) for i in group),
                budget,
            )
            tasks.append(served.queue.run(Task("attribute", [encodings[i] for i in group], options)))
        attributed = {
            index: attribution
            for group, (answers,) in zip(groups, await asyncio.gather(*tasks), strict=True)
            for index, attribution in zip(group, answers, strict=True)
        }
        attributions = [attributed[index] for index in range(len(encodings))]
        return [
            Explanation(tokenizer.vocabulary_entries(encoding.ids), attribution)
            for encoding, attribution in zip(encodings, attributions, strict=True)
        ]
