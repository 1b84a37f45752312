"""Objects the routes are given through ``Depends``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.errors import NotReady
from app.service import EncoderService


def get_service(request: Request) -> EncoderService:
    """The loaded service; 503 ``not_ready`` until the model is loaded and warmed up."""
    service: EncoderService | None = getattr(request.app.state, "service", None)
    if service is None:
        reason = getattr(request.app.state, "load_error", None)
        raise NotReady(f"the model failed to load: {reason}" if reason else "the model is still loading")
    return service


Service = Annotated[EncoderService, Depends(get_service)]
