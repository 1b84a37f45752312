from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import ERROR_RESPONSES, HealthResponse, InfoResponse
from app.serialization import json_response
from app.services.info import info as describe
from app.web.dependencies import Model, SettingsDep, get_registry

info_router = APIRouter(tags=["service"], responses=ERROR_RESPONSES)
open_router = APIRouter(tags=["service"], responses={503: ERROR_RESPONSES[503]})


@info_router.get("/info", response_model=InfoResponse)
async def info(model: Model, settings: SettingsDep) -> Response:
    """The model, its architecture, device and dtype, the limits in force and the version."""
    return json_response(describe(model, settings))


@open_router.get("/health", response_model=HealthResponse)
@open_router.get("/ready", response_model=HealthResponse)
@open_router.head("/health", include_in_schema=False)  # one operation each in the schema: HEAD is GET's
@open_router.head("/ready", include_in_schema=False)
async def health(request: Request) -> Response:
    """200 once every model is loaded and has run a warm-up pass; 503 not_ready before. ``/ready`` is the same
    probe under the name orchestrators look for; HEAD answers as GET, without a body (probes that use HEAD)."""
    await get_registry(request)
    if request.method == "HEAD":
        return Response(status_code=200, media_type="application/json")
    return json_response({"status": "ok"})


@open_router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (open, like /health)."""
    metrics, registry = request.app.state.metrics, request.app.state.registry
    body = metrics.exposition() if registry is None else await registry.exposition(metrics)
    return Response(body, media_type=metrics.content_type)
