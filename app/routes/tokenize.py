from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.dependencies import EmbeddingsDep, Model, ResponderDep
from app.schemas import ERROR_RESPONSES, TokenizeRequest, TokenizeResponse

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(
    body: TokenizeRequest, request: Request, model: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """The model's tokens for one or more texts (optionally paired), with ids, character spans and segments."""
    return await responder.answer(request, lambda _: embeddings.tokenize(model, body), len(body.texts))
