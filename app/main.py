"""The application factory: ``uvicorn --factory app.main:create_app`` (settings from ENCODER_* variables).

Importing this module does nothing; ``create_app()`` builds the application. Models load in the
background once the server runs: /health answers 503 ``not_ready`` until every one is loaded and warm.
A model that cannot load stops the process with exit status 1 and one log line naming the model, its
directory and the problem, so that an orchestrator shows a crash loop instead of a pod that never
becomes ready.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp

from app import __version__, tracing
from app.allocator import bound_allocator
from app.api import attention, embeddings, positional_encoding, service, tasks, tokenize, viewer
from app.api.cohere import routes as cohere
from app.api.hot import HOT_ROUTES
from app.api.jina import routes as jina
from app.api.openai import routes as openai
from app.api.tei import routes as tei
from app.engine.admission import Admission
from app.engine.errors import EngineError
from app.errors import ErrorShapes, api_error_response, install_error_handlers, native_errors, shape_of
from app.logs import configure_logging
from app.metrics import Metrics
from app.services.embeddings import Embeddings
from app.services.inspection import Inspection
from app.services.tasks import Tasks
from app.serving.registry import ModelRegistry, front_end_registry, load_registry
from app.settings import Settings, get_settings
from app.web.dependencies import ApiKey
from app.web.fast_path import FastPath
from app.web.middleware import BodySizeLimit, BodyTimeout, OneWriteResponses, RequestLog
from app.web.responding import Responder, client_error

if TYPE_CHECKING:
    from model import TextEncoder

logger = logging.getLogger("app")
TIMING_HEADERS = ["X-Request-ID", "X-Tokenization-Time", "X-Queue-Time", "X-Inference-Time", "X-Serialization-Time"]
EXIT_LOAD_FAILED = 1
GRPC_GRACE_S = 30.0  # at shutdown, gRPC calls in flight are answered for up to this long


class Service(FastAPI):
    """FastAPI with three layers outside Starlette's own: each response in one write (OneWriteResponses), a body
    that must arrive in time (BodyTimeout), and the hot routes' short way in (FastPath)."""

    def build_middleware_stack(self) -> ASGIApp:
        settings: Settings = getattr(self.state, "settings", None) or Settings()  # create_app sets it
        stack = FastPath(super().build_middleware_stack(), self, HOT_ROUTES)
        shapes = getattr(self.state, "error_shapes", None)  # add_routes sets it
        return OneWriteResponses(BodyTimeout(stack, settings.body_timeout_s, settings.max_body_bytes, shapes))


DOCS_FILES = "/static/docs"  # Swagger UI 5, from the fastapi-offline package


def offline_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) from the files of the pinned fastapi-offline package, served here: FastAPI's own page
    loads them from a CDN, so it is blank without network. Swagger UI 5, as FastAPI's OpenAPI 3.1 needs (Swagger
    UI 4 does not render it). No /redoc: ReDoc's page still asks a CDN for its logo."""
    from importlib.resources import files

    from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html

    static = Path(str(files("fastapi_offline") / "static"))
    app.mount(DOCS_FILES, StaticFiles(directory=static), name="docs-files")
    title, schema = app.title, app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")  # behind a path prefix, as FastAPI's own page
        return get_swagger_ui_html(
            openapi_url=root + schema,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=root + "/docs/oauth2-redirect",
            swagger_js_url=f"{root}{DOCS_FILES}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_FILES}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_FILES}/favicon.png",
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()


def exit_process(message: str) -> None:
    """What a server process does when its model cannot load: log one line and exit non-zero."""
    logger.error(message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOAD_FAILED)  # uvicorn would otherwise keep serving 503s for ever


def create_app(
    settings: Settings | None = None,
    models: Mapping[str, TextEncoder] | None = None,
    on_load_failure: Callable[[str], None] | None = None,
    engine: str | None = None,
    on_ready: Callable[[ModelRegistry], None] | None = None,
) -> FastAPI:
    """The application.

    Called with no arguments (as ``uvicorn --factory`` does) it reads the settings from the environment,
    configures logging and exits the process if a model cannot load. Tests pass their own settings,
    already-loaded ``models``, and ``on_load_failure`` (by default, for them, /health then reports the
    reason as 503 ``not_ready``).

    With ``engine`` (the path of an engine's socket, app/serve.py) the app is a front end: it reads each model's
    card (no weights) and sends the models' work to the engine. ``on_ready`` is called once every model is loaded
    and warm, when /ready starts answering 200 (app/serve.py says "ready" then).
    """
    if settings is None:
        from app.engine.compute import bound_kernel_caches  # torch's: only where models are computed

        bound_kernel_caches()  # the server process, before any model is loaded
        bound_allocator()
        settings = get_settings()
        configure_logging(settings.log_level, settings.log_format)
        on_load_failure = on_load_failure or exit_process
        on_ready = on_ready or (lambda registry: logger.info("ready: %s", ", ".join(registry.names)))
    metrics = Metrics()
    loading = Loading(settings, metrics, models, engine, on_load_failure, on_ready)
    app = Service(
        title="encoder-service",
        version=__version__,
        description="Tokens, sentence and token embeddings, attention matrices and positional encodings "
        "from a transformer encoder.",
        lifespan=loading.lifespan,
        docs_url=None,  # served below from a package's files, not a CDN: /docs works offline
        redoc_url=None,  # ReDoc's page asks a CDN for its logo
        # FastAPI's own OpenTelemetry spans, metrics and logs, off: the service traces its requests itself
        # (app/tracing.py, across its processes), so a global provider that an agent sets would get each request
        # twice; and FastAPI would ask OpenTelemetry for its three global providers on every request (3 µs each time).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    offline_docs(app)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = None  # the loaded models, once every one is loaded and warm
    app.state.load_error = None
    add_services(app, settings, metrics, engine)
    add_routes(app, settings, metrics)
    return app


class Loading:
    """The application's life: its models loaded in the background once the server runs (or, for a front end,
    the cards read and the engine reached before it accepts), closed once it has stopped."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        models: Mapping[str, TextEncoder] | None,
        engine: str | None,
        on_load_failure: Callable[[str], None] | None,
        on_ready: Callable[[ModelRegistry], None] | None,
    ) -> None:
        self.settings, self.metrics, self.models, self.engine = settings, metrics, models, engine
        self.on_load_failure, self.on_ready = on_load_failure, on_ready

    async def load(self, app: FastAPI) -> None:
        try:
            if self.engine is not None:
                registry = await front_end_registry(self.settings, self.engine)
            else:
                registry = await asyncio.to_thread(load_registry, self.settings, self.metrics, self.models)
        except Exception as error:
            message = str(error)
            if self.on_load_failure is not None:
                self.on_load_failure(message)
            else:
                logger.error(message)
            app.state.load_error = message
            return
        app.state.registry = registry
        if self.on_ready is not None:
            self.on_ready(registry)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # traces where OpenTelemetry's variables ask for them (app/tracing.py); stopped here if started here
        traced = tracing.TRACER is None and tracing.start("front-end" if self.engine is not None else "service")
        loading = asyncio.create_task(self.load(app))
        if self.engine is not None:
            # A front end reads cards and connects to the engine in a moment: it starts accepting once ready, and
            # the connections that arrive meanwhile go to the others rather than getting 503s.
            await loading
        grpc_server = None
        if self.settings.grpc_port is not None:  # TEI's gRPC API beside HTTP (UNAVAILABLE until ready)
            from app.api.tei.grpc.server import start_grpc

            grpc_server = await start_grpc(app.state, self.settings)
        try:
            yield
        finally:
            # Reached after the server has stopped accepting and answered what was in flight.
            if grpc_server is not None:
                await grpc_server.stop(min(self.settings.request_timeout_s, GRPC_GRACE_S))
            if not loading.done():
                loading.cancel()
            if app.state.registry is not None:
                await asyncio.to_thread(app.state.registry.close)
            if traced:
                await asyncio.to_thread(tracing.stop)  # what is left exported
            logger.info("stopped")


def add_services(app: FastAPI, settings: Settings, metrics: Metrics, engine: str | None) -> None:
    """What the routes call: the services over the models, and the responder that bounds and answers them."""

    def seconds_per_text() -> float | None:
        loaded: ModelRegistry | None = app.state.registry
        return loaded.seconds_per_text() if loaded is not None else None

    # One bound on the texts held: here, or where the engine is a process of its own, the engine's (Admission)
    admission = Admission(settings.max_queue_texts if engine is None else None, seconds_per_text, metrics)
    app.state.responder = Responder(admission, metrics, settings.request_timeout_s)
    app.state.embeddings = Embeddings(settings)
    app.state.tasks = Tasks(app.state.embeddings, settings.max_explain_steps, settings.max_explained_texts)
    app.state.inspection = Inspection(settings, app.state.embeddings)


def add_routes(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    """The middleware, and every API's routers, each behind the API key unless open, each answering errors in its
    API's shape."""
    error_shapes = ErrorShapes()  # each router's routes answer in its API's shape; a path none serves, by prefix
    app.state.error_shapes = error_shapes  # the layers that answer before routing (BodySizeLimit, BodyTimeout)
    install_error_handlers(app, error_shapes)

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, exc: EngineError) -> Response:
        """The engine's error where no responder worded it (/metrics asking an engine that has gone)."""
        return api_error_response(client_error(exc), error_shapes.of(request.scope))

    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, shapes=error_shapes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=TIMING_HEADERS,
        )
    app.add_middleware(RequestLog, metrics=metrics)  # outermost: sees every request and its final status

    def include(router: APIRouter, prefix: str = "", keyed: bool = True) -> None:
        """The router's routes, behind the API key unless not ``keyed``; a path under its prefix that none of them
        serves answers in the router's error shape too."""
        app.include_router(router, prefix=prefix, dependencies=[ApiKey] if keyed else [])
        if prefix + router.prefix and shape_of(router) is not native_errors:
            error_shapes.claim(prefix + router.prefix, shape_of(router))

    for module in (embeddings, tokenize, attention, positional_encoding, openai, tasks, cohere, jina):
        include(module.router)
    for prefix in tei.PREFIXES:  # TEI's API, for its clients
        include(tei.router, prefix)
        include(tei.health_router, prefix, keyed=False)
    include(service.info_router)
    include(service.open_router, keyed=False)  # /health and /metrics: probes and scrapers come without a key
    include(viewer.router, keyed=False)  # the page is static and open; its API calls carry the key
    app.mount("/static", StaticFiles(directory=viewer.STATIC_DIR), name="static")
