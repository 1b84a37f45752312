from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.dependencies import Service
from app.routes import answer
from app.schemas import ERROR_RESPONSES, EncodeRequest, EncodeResponse, TokenizeRequest, TokenizeResponse

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/encode", responses={200: {"model": EncodeResponse}})
async def encode(body: EncodeRequest, request: Request, service: Service) -> Response:
    """Sentence embeddings (and, on request, tokens and per-token vectors) for one or more texts."""
    # Token vectors can be many numbers: estimate at 128 tokens a text.
    size = len(body.texts) * service.model.config.d_model * (129 if body.return_token_embeddings else 1)
    return await answer(request, service, lambda timing: service.encode(body, timing), size, len(body.texts))


@router.post("/tokenize", responses={200: {"model": TokenizeResponse}})
async def tokenize(body: TokenizeRequest, request: Request, service: Service) -> Response:
    """The model's tokens for one or more texts (optionally paired), with ids, character spans and segments."""
    return await answer(request, service, lambda _: asyncio.to_thread(service.tokenize, body), n_texts=len(body.texts))
