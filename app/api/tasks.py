from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import ERROR_RESPONSES, ClassifyRequest, ClassifyResponse, RerankRequest, RerankResponse
from app.web.dependencies import Registry, ResponderDep, TasksDep

router = APIRouter(tags=["tasks"], responses=ERROR_RESPONSES)


@router.post("/rerank", response_model=RerankResponse)
async def rerank(
    body: RerankRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    """Documents ranked by a cross-encoder's relevance to the query, best first."""
    return await responder.serve(request, registry, body, tasks.rerank)


@router.post("/classify", response_model=ClassifyResponse)
async def classify(
    body: ClassifyRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    """Labels and scores of a sequence classifier for one or more texts (or pairs, as NLI takes them)."""
    return await responder.serve(request, registry, body, tasks.classify)
