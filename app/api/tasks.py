from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import (
    ERROR_RESPONSES,
    Classified,
    ClassifyRequest,
    ClassifyResponse,
    LabelScore,
    Reply,
    RerankRequest,
    RerankResponse,
    RerankResult,
    usage_of,
)
from app.serialization import construct
from app.services.tasks import Labelled, Ranked
from app.web.dependencies import Registry, ResponderDep, TasksDep
from app.web.responding import rendered

router = APIRouter(tags=["tasks"], responses=ERROR_RESPONSES)


@router.post("/rerank", response_model=RerankResponse)
async def rerank(
    body: RerankRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    """Documents ranked by a cross-encoder's relevance to the query, best first."""
    return await responder.serve(request, registry, body, rendered(tasks.rerank, reranked))


def reranked(request: RerankRequest, ranked: Ranked) -> Reply:
    """/rerank's answer: the documents best first, each with its score (and its text where asked)."""
    results = [
        construct(
            RerankResult,
            index=i,
            relevance_score=float(ranked.scores[i]),
            **({"document": request.documents[i]} if request.return_documents else {}),
        )
        for i in ranked.order
    ]
    usage = usage_of(ranked.tokens_used)
    return Reply(construct(RerankResponse, model=ranked.model, method=ranked.method, results=results, usage=usage))


@router.post("/classify", response_model=ClassifyResponse)
async def classify(
    body: ClassifyRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    """Labels and scores of a sequence classifier for one or more texts (or pairs, as NLI takes them)."""
    return await responder.serve(request, registry, body, rendered(tasks.classify, classified))


def classified(request: ClassifyRequest, labelled: Labelled) -> Reply:
    """/classify's answer: each text's labels, best first, with their scores."""
    data = [
        construct(
            Classified, index=index, labels=[construct(LabelScore, label=label, score=score) for label, score in labels]
        )
        for index, labels in enumerate(labelled.labels)
    ]
    return Reply(construct(ClassifyResponse, model=labelled.model, data=data, usage=usage_of(labelled.tokens_used)))
