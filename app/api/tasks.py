from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import (
    ERROR_RESPONSES,
    Classified,
    ClassifyRequest,
    ClassifyResponse,
    ExplainRequest,
    ExplainResponse,
    ExplainTarget,
    LabelScore,
    Reply,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreExplanation,
    usage_of,
)
from app.serialization import construct
from app.services.tasks import Explained, Explanation, Labelled, Ranked
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
    explanations = ranked.explanations
    results = []
    for i in ranked.order:
        optional: dict[str, Any] = {"document": request.documents[i]} if request.return_documents else {}
        if explanations is not None:
            optional["explanation"] = written_explanation(explanations[i])
        results.append(construct(RerankResult, index=i, relevance_score=float(ranked.scores[i]), **optional))
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
    explanations = labelled.explanations
    data = [
        construct(
            Classified,
            index=index,
            labels=[construct(LabelScore, label=label, score=score) for label, score in labels],
            **({"explanation": written_explanation(explanations[index])} if explanations is not None else {}),
        )
        for index, labels in enumerate(labelled.labels)
    ]
    return Reply(construct(ClassifyResponse, model=labelled.model, data=data, usage=usage_of(labelled.tokens_used)))


@router.post("/explain", response_model=ExplainResponse)
async def explain(
    body: ExplainRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    """Which tokens made a cross-encoder's, a classifier's or a yes/no reranker's score: integrated gradients (or
    gradient × input) at the embedding block's output, as Captum computes them."""
    return await responder.serve(request, registry, body, rendered(tasks.explain, explained))


def explained(request: ExplainRequest, explanation: Explained) -> Reply:
    """/explain's answer: the tokens and their attributions, the score, and for integrated gradients the baseline's
    score and the convergence delta."""
    target = explanation.target
    return Reply(
        construct(
            ExplainResponse,
            model=explanation.model,
            target=None if target is None else construct(ExplainTarget, index=target[0], label=target[1]),
            method=explanation.method,
            steps=explanation.steps,
            **explanation_fields(explanation),
            usage=usage_of(explanation.tokens_used),
        )
    )


def written_explanation(explanation: Explanation) -> ScoreExplanation:
    """A score's explanation beside it, in /rerank's and /classify's answers."""
    return construct(ScoreExplanation, **explanation_fields(explanation))


def explanation_fields(explanation: Explanation | Explained) -> dict[str, Any]:
    """What every explanation answers: the tokens, their attributions, the score, the baseline's score and the
    convergence delta."""
    attribution = explanation.attribution
    return {
        "tokens": explanation.tokens,
        "attributions": attribution.attributions,
        "score": attribution.score,
        "baseline_score": attribution.baseline_score,
        "convergence_delta": attribution.convergence_delta,
    }
