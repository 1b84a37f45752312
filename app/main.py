"""The service's entry point: ``uvicorn app.main:app``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from model import TextEncoder

logger = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.model = TextEncoder.load()
    yield


app = FastAPI(title="encoder-service", lifespan=lifespan)


@app.get("/health")
async def health() -> JSONResponse:
    """Whether the model is loaded."""
    return JSONResponse({"status": "ok"})
