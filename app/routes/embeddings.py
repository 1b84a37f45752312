from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from app.dependencies import Service
from app.schemas import ERROR_RESPONSES, EncodeRequest, EncodeResponse, TokenizeRequest, TokenizeResponse
from app.serialization import json_response

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/encode", responses={200: {"model": EncodeResponse}})
async def encode(request: EncodeRequest, service: Service) -> Response:
    """Sentence embeddings (and, on request, tokens and per-token vectors) for one or more texts."""
    return json_response(await service.run(service.encode, request))


@router.post("/tokenize", responses={200: {"model": TokenizeResponse}})
async def tokenize(request: TokenizeRequest, service: Service) -> Response:
    """The model's tokens for one or more texts (optionally paired), with ids, character spans and segments."""
    return json_response(await service.run(service.tokenize, request))
