"""/rerank and /classify: the heads of cross-encoders, yes/no rerankers and sequence classifiers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.errors import InvalidRequest
from app.messages import Task
from app.registry import ServedModel
from app.schemas import (
    Classified,
    ClassifyRequest,
    ClassifyResponse,
    LabelScore,
    Reply,
    RerankRequest,
    RerankResponse,
    RerankResult,
)
from app.serialization import construct
from app.services.embeddings import Embeddings, second_segments, usage
from app.work_queue import Timing
from model import HeadConfig
from model.heads import YES_NO
from model.tokenizer import TokenIds, TokenSequence


def head_of(served: ServedModel, task: str, labels: int | None = None) -> HeadConfig:
    """The model's classification head, or a 422 naming the model when it cannot do the task."""
    head = served.card.head
    if head is None:
        raise InvalidRequest("model", f"model {served.name!r} has no classification head, so it cannot {task}")
    if labels is not None and len(head.labels) != labels:
        raise InvalidRequest(
            "model", f"model {served.name!r} has {len(head.labels)} outputs; to {task} it needs {labels}"
        )
    return head


def rerank_method(served: ServedModel) -> str:
    """How the model scores pairs (``TextEncoder.scores_method``), or a 422 naming the model when it cannot."""
    method = served.card.scores_method
    if method is None:
        if served.card.head is not None:
            head_of(served, "rerank", labels=1)  # the 422 that names its number of outputs
        raise InvalidRequest(
            "model",
            f"model {served.name!r} cannot rerank: it is neither a cross-encoder (a classifier with one output) nor "
            "a causal LM whose vocabulary has the tokens yes and no",
        )
    return method


class Tasks:
    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings  # for its limits

    async def rerank(self, served: ServedModel, request: RerankRequest, timing: Timing | None = None) -> Reply:
        """Documents by relevance to the query: a cross-encoder's score of each (query, document) pair, or a yes/no
        reranker's answer to each pair formatted in its template."""
        method = rerank_method(served)
        self.embeddings.check_batch(len(request.documents), "documents")
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
                queries, request.documents, truncate=request.truncate, param="documents"
            )
        scored = await served.queue.run(Task("classify", encodings), timing)
        scores = np.array([(row.logits if request.raw_scores else row.probabilities)[0] for row in scored])  # (B,)
        order = np.argsort(-scores, kind="stable")[: request.top_n]
        results = [
            construct(
                RerankResult,
                index=int(i),
                relevance_score=float(scores[i]),
                **({"document": request.documents[i]} if request.return_documents else {}),
            )
            for i in order
        ]
        response = construct(RerankResponse, model=served.name, method=method, results=results, usage=usage(encodings))
        return Reply(response)

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

    async def classify(self, served: ServedModel, request: ClassifyRequest, timing: Timing | None = None) -> Reply:
        """Labels with their scores: softmax over the labels, or a sigmoid per label for multi-label heads."""
        head = head_of(served, "classify")
        self.embeddings.check_batch(len(request.texts))
        pairs = second_segments(request.texts, request.text_pair)
        encodings = await served.tokens.encode(request.texts, pairs, truncate=request.truncate, param="texts")
        probabilities = np.stack(
            [row.probabilities for row in await served.queue.run(Task("classify", encodings), timing)]
        )
        labels = head.labels
        data = []
        for index, row in enumerate(probabilities):
            order = np.argsort(-row, kind="stable")[: request.top_k]
            ranked = [construct(LabelScore, label=labels[j], score=float(row[j])) for j in order]
            data.append(construct(Classified, index=index, labels=ranked))
        return Reply(construct(ClassifyResponse, model=served.name, data=data, usage=usage(encodings)))
