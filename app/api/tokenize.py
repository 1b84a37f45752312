from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import ERROR_RESPONSES, TokenizeRequest, TokenizeResponse
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(
    body: TokenizeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """The model's tokens for one or more texts (optionally paired), with ids, character spans and segments."""
    return await responder.serve(request, registry, body, lambda model, body, _: embeddings.tokenize(model, body))
