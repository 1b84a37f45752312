from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.dependencies import Service, get_service
from app.schemas import ERROR_RESPONSES, HealthResponse, InfoResponse
from app.serialization import json_response

info_router = APIRouter(tags=["service"], responses=ERROR_RESPONSES)
health_router = APIRouter(tags=["service"], responses={503: ERROR_RESPONSES[503]})


@info_router.get("/info", responses={200: {"model": InfoResponse}})
async def info(service: Service) -> Response:
    """The model, its architecture, device and dtype, the limits in force and the version."""
    return json_response(service.info())


@health_router.get("/health", responses={200: {"model": HealthResponse}})
async def health(request: Request) -> Response:
    """200 once the model is loaded and has run a warm-up pass; 503 not_ready before."""
    await get_service(request)
    return json_response({"status": "ok"})
