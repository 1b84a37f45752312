"""/rerank and /classify: the classification heads of cross-encoders and sequence classifiers."""

from __future__ import annotations

import numpy as np

from app.errors import InvalidRequest
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
from model import SequenceClassificationHead


def head_of(served: ServedModel, task: str, labels: int | None = None) -> SequenceClassificationHead:
    """The model's classification head, or a 422 naming the model when it cannot do the task."""
    head = served.model.classifier
    if head is None:
        raise InvalidRequest("model", f"model {served.name!r} has no classification head, so it cannot {task}")
    if labels is not None and len(head.head.labels) != labels:
        raise InvalidRequest(
            "model", f"model {served.name!r} has {len(head.head.labels)} outputs; to {task} it needs {labels}"
        )
    return head


class Tasks:
    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings  # for its limits

    async def rerank(self, served: ServedModel, request: RerankRequest, timing: Timing | None = None) -> Reply:
        """Documents by relevance to the query: a cross-encoder's score of each (query, document) pair."""
        head_of(served, "rerank", labels=1)
        self.embeddings.check_batch(len(request.documents), "documents")
        queries = [request.query] * len(request.documents)
        # (query, document) pairs, the query first as cross-encoders are trained; a pair too long for the
        # model is named by its document.
        encodings = await served.tokens.encode(queries, request.documents, truncate=request.truncate, param="documents")
        scored = await served.queue.classify(encodings, timing)
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
        return Reply(construct(RerankResponse, model=served.name, results=results, usage=usage(encodings)))

    async def classify(self, served: ServedModel, request: ClassifyRequest, timing: Timing | None = None) -> Reply:
        """Labels with their scores: softmax over the labels, or a sigmoid per label for multi-label heads."""
        head = head_of(served, "classify")
        self.embeddings.check_batch(len(request.texts))
        pairs = second_segments(request.texts, request.text_pair)
        encodings = await served.tokens.encode(request.texts, pairs, truncate=request.truncate, param="texts")
        probabilities = np.stack([row.probabilities for row in await served.queue.classify(encodings, timing)])
        labels = head.head.labels
        data = []
        for index, row in enumerate(probabilities):
            order = np.argsort(-row, kind="stable")[: request.top_k]
            ranked = [construct(LabelScore, label=labels[j], score=float(row[j])) for j in order]
            data.append(construct(Classified, index=index, labels=ranked))
        return Reply(construct(ClassifyResponse, model=served.name, data=data, usage=usage(encodings)))
