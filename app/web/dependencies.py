"""What routes are given through ``Depends``, as ``Annotated`` aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Query, Request
from starlette.datastructures import State

from app.errors import NotReady, Unauthorized
from app.services.embeddings import Embeddings
from app.services.inspection import Inspection
from app.services.tasks import Tasks
from app.serving.registry import ModelRegistry, ServedModel
from app.settings import Settings
from app.web.responding import Responder


async def get_registry(request: Request) -> ModelRegistry:
    """The loaded models; 503 ``not_ready`` until every one is loaded and warmed up."""
    return registry_of(request.app.state)


def registry_of(state: State) -> ModelRegistry:
    """The app's loaded models (``state``: its ``app.state``), or NotReady while they load, or after one stopped."""
    registry: ModelRegistry | None = state.registry
    if registry is None:
        reason = state.load_error
        raise NotReady(f"the model failed to load: {reason}" if reason else "the model is still loading")
    stopped = registry.stopped()
    if stopped:  # never expected: then /health fails too, and an orchestrator restarts the process
        raise NotReady(f"{', '.join(stopped)} has stopped")
    return registry


async def get_model(
    registry: Annotated[ModelRegistry, Depends(get_registry)],
    model: Annotated[str | None, Query(description="a served model's name; the default model when omitted")] = None,
) -> ServedModel:
    """The model a GET request names with ``?model=`` (404 model_not_found if none), else the default one.

    POST requests name theirs in the body: their routes ask the registry themselves.
    """
    return registry.get(model)


async def app_settings(request: Request) -> Settings:
    """The application's settings (read from the environment once, by app.settings.get_settings, or a test's)."""
    return request.app.state.settings


async def get_responder(request: Request) -> Responder:
    return request.app.state.responder


async def get_embeddings(request: Request) -> Embeddings:
    return request.app.state.embeddings


async def get_inspection(request: Request) -> Inspection:
    return request.app.state.inspection


async def get_tasks(request: Request) -> Tasks:
    return request.app.state.tasks


Registry = Annotated[ModelRegistry, Depends(get_registry)]
Model = Annotated[ServedModel, Depends(get_model)]
SettingsDep = Annotated[Settings, Depends(app_settings)]
ResponderDep = Annotated[Responder, Depends(get_responder)]
EmbeddingsDep = Annotated[Embeddings, Depends(get_embeddings)]
InspectionDep = Annotated[Inspection, Depends(get_inspection)]
TasksDep = Annotated[Tasks, Depends(get_tasks)]


async def require_api_key(request: Request) -> None:
    """401 ``unauthorized`` unless the request carries one of the configured keys (none configured: open, and the
    headers not read)."""
    settings: Settings = request.app.state.settings
    if settings.api_keys:
        check_api_key(settings, request.headers.get("authorization", ""))


def check_api_key(settings: Settings, authorization: str) -> None:
    """Unauthorized unless ``authorization`` (the header's or gRPC metadata's value) is ``Bearer <one of the
    configured keys>``; anything passes when none is configured."""
    if not settings.api_keys:
        return
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "an API key is required: send the header 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    presented = token.strip().encode()
    # Compare with every key, in constant time, so timing tells nothing about which or how much matched.
    matches = [hmac.compare_digest(presented, key.get_secret_value().encode()) for key in settings.api_keys]
    if not any(matches):
        raise Unauthorized("the API key is not valid", headers={"WWW-Authenticate": "Bearer"})


ApiKey = Depends(require_api_key)
