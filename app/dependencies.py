"""Objects the routes are given through ``Depends``."""

from __future__ import annotations

from typing import Annotated

import hmac

from fastapi import Depends, Request

from app.errors import NotReady, Unauthorized
from app.service import EncoderService
from app.settings import Settings


async def get_service(request: Request) -> EncoderService:
    """The loaded service; 503 ``not_ready`` until the model is loaded and warmed up."""
    service: EncoderService | None = getattr(request.app.state, "service", None)
    if service is None:
        reason = getattr(request.app.state, "load_error", None)
        raise NotReady(f"the model failed to load: {reason}" if reason else "the model is still loading")
    return service


Service = Annotated[EncoderService, Depends(get_service)]


async def require_api_key(request: Request) -> None:
    """401 ``unauthorized`` unless the request carries one of the configured keys (none configured: open)."""
    settings: Settings = request.app.state.settings
    if not settings.api_keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("an API key is required: send the header 'Authorization: Bearer <key>'",
                           headers={"WWW-Authenticate": "Bearer"})
    presented = token.strip().encode()
    # Compare with every key, in constant time, so timing tells nothing about which or how much matched.
    matches = [hmac.compare_digest(presented, key.get_secret_value().encode()) for key in settings.api_keys]
    if not any(matches):
        raise Unauthorized("the API key is not valid", headers={"WWW-Authenticate": "Bearer"})


ApiKey = Depends(require_api_key)
