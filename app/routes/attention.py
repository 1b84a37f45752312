from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from app.dependencies import Service
from app.routes import answer
from app.schemas import ERROR_RESPONSES, AttentionRequest, AttentionResponse, PositionalEncodingResponse

router = APIRouter(tags=["inspection"], responses=ERROR_RESPONSES)


@router.post("/attention", responses={200: {"model": AttentionResponse}})
async def attention(body: AttentionRequest, request: Request, service: Service) -> Response:
    """Per-layer, per-head attention matrices for a text (or text pair), optionally averaged or rolled out."""
    return await answer(request, service, lambda timing: service.attention(body, timing), service.settings.max_attention_values)


@router.get("/positional-encoding", responses={200: {"model": PositionalEncodingResponse}})
async def positional_encoding(
    request: Request,
    service: Service,
    length: Annotated[int, Query(ge=1, description="number of positions (at most pe_max_length, see /info)")] = 50,
    d_model: Annotated[int | None, Query(ge=2, description="encoding width, even; the model's hidden size when omitted")] = None,
    base: Annotated[float, Query(description="wavelength base, a finite number > 1")] = 10000.0,
    kind: Annotated[
        Literal["sinusoidal", "learned"],
        Query(description="sinusoidal: the formula of the paper; learned: the model's own position table"),
    ] = "sinusoidal",
) -> Response:
    """Positional encodings: the sinusoid of "Attention Is All You Need", or the model's learned table."""
    work = lambda _: asyncio.to_thread(service.positional_encoding, kind, length, d_model, base)  # noqa: E731
    return await answer(request, service, work, length * (d_model or service.model.config.d_model))
