from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.dependencies import InspectionDep, Registry, ResponderDep
from app.schemas import ERROR_RESPONSES, AttentionRequest, AttentionResponse

router = APIRouter(tags=["inspection"], responses=ERROR_RESPONSES)


@router.post("/attention", response_model=AttentionResponse)
async def attention(
    body: AttentionRequest, request: Request, registry: Registry, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    """Per-layer, per-head attention matrices for a text (or text pair), optionally averaged or rolled out."""
    model = registry.get(body.model)
    return await responder.answer(request, lambda timing: inspection.attention(model, body, timing))
