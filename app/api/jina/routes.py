"""Jina's rerank route, /v1/rerank: Jina's request as the native /rerank, the answer in Jina's shape, its errors
in the native envelope (as the other /v1 routes, OpenAI's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.jina.types import JinaRerankRequest, JinaRerankResponse
from app.errors import InvalidRequest
from app.schemas import ERROR_RESPONSES, RerankRequest
from app.web.dependencies import Registry, ResponderDep, TasksDep
from app.web.responding import answer_value as answer

router = APIRouter(tags=["jina"], responses=ERROR_RESPONSES)


@router.post(
    "/v1/rerank", response_model=JinaRerankResponse, summary="Jina: the documents' relevance to the query, best first"
)
async def jina_rerank(
    body: JinaRerankRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    served = registry.get(body.model)
    if not body.documents:
        raise InvalidRequest("documents", "send at least one document")
    native = RerankRequest(query=body.query, documents=body.documents, top_n=body.top_n, model=body.model)

    async def work() -> Any:
        ranked = await tasks.rerank(served, native)
        results = []
        for i in ranked.order:
            result: dict[str, Any] = {"index": i, "relevance_score": float(ranked.scores[i])}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        tokens = ranked.tokens_used
        return {"model": served.name, "results": results, "usage": {"total_tokens": tokens, "prompt_tokens": tokens}}

    return await answer(request, responder, work, native.admitted_texts)
