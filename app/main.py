"""The service's entry point: ``uvicorn app.main:app`` (settings from ENCODER_* variables)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

from app import __version__
from app.dependencies import ApiKey
from app.errors import install_error_handlers
from app.logs import configure_logging
from app.metrics import Metrics
from app.middleware import BodySizeLimit, RequestLog
from app.routes import attention, embeddings, meta, viewer
from app.service import EncoderService
from app.settings import Settings, get_settings
from model import TextEncoder

logger = logging.getLogger("app")
TIMING_HEADERS = ["X-Request-ID", "X-Queue-Time", "X-Inference-Time", "X-Serialization-Time"]


def load_service(settings: Settings, model: TextEncoder | None = None, metrics: Metrics | None = None) -> EncoderService:
    """Load the model (unless given), wrap it in the service and run the warm-up pass."""
    started = time.perf_counter()
    if model is None:
        model = TextEncoder.load(
            settings.model_dir,
            device=settings.device,
            dtype=settings.dtype,
            name=settings.model_name,
            max_tokens=settings.max_tokens_per_text,
        )
    service = EncoderService(model, settings, metrics)
    service.warm_up()
    logger.info(
        "ready: %s on %s (%s), loaded and warmed up in %.2f s",
        model.name, model.device, str(model.dtype).removeprefix("torch."), time.perf_counter() - started,
    )
    return service


def create_app(settings: Settings | None = None, model: TextEncoder | None = None) -> FastAPI:
    """The application. The model loads in the background: /health answers 503 until it is ready."""
    settings = settings or get_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = None
        app.state.load_error = None

        async def load() -> None:
            try:
                app.state.service = await asyncio.to_thread(load_service, settings, model, metrics)
            except Exception as error:  # reported by /health and every endpoint as not_ready
                logger.exception("the model failed to load")
                app.state.load_error = str(error)

        loading = asyncio.create_task(load())
        try:
            yield
        finally:
            # Reached after the server has stopped accepting and answered what was in flight.
            if not loading.done():
                loading.cancel()
            if app.state.service is not None:
                await asyncio.to_thread(app.state.service.close)
            logger.info("stopped")

    app = FastAPI(
        title="encoder-service",
        version=__version__,
        description="Tokens, sentence and token embeddings, attention matrices and positional encodings "
        "from a transformer encoder.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=TIMING_HEADERS,
        )
    app.add_middleware(RequestLog, metrics=metrics)  # outermost: sees every request and its final status
    for router in (embeddings.router, attention.router):
        app.include_router(router, dependencies=[ApiKey])
    app.include_router(meta.info_router, dependencies=[ApiKey])
    app.include_router(meta.health_router)  # open: load balancers and orchestrators probe it without a key
    app.include_router(viewer.router)  # the page is static and open; its API calls carry the key
    app.mount("/static", StaticFiles(directory=viewer.STATIC_DIR), name="static")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (open, like /health)."""
        return Response(metrics.exposition(), media_type=metrics.content_type)

    return app


configure_logging(get_settings().log_level, get_settings().log_format)
app = create_app()
