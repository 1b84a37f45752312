"""One router per endpoint family, and how a route hands its work over and answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from starlette.responses import Response

from app.engine import Timing
from app.errors import Timeout
from app.serialization import dumps
from app.service import EncoderService

logger = logging.getLogger(__name__)

# Responses with more numbers than this are serialised in a worker thread, not on the event loop.
RENDER_IN_THREAD_VALUES = 100_000


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await ``work``; if the client goes away first, cancel it (queued texts are then never computed)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task not in done:
        task.cancel()
        raise ClientGone
    return task.result()


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (a body not yet read is read and discarded first)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def answer(
    request: Request,
    service: EncoderService,
    work: Callable[[Timing], Awaitable[Any]],
    n_values: int = 0,
    n_texts: int = 1,
) -> Response:
    """Admit the request (429 past the queue limit), await its work within the deadline, serialise it.

    The response carries the time spent queued, computing and serialising, in milliseconds.
    """
    timing = Timing()
    request.state.timing = timing
    route = request.scope["route"].path
    async with service.admit(n_texts):
        try:
            content = await asyncio.wait_for(until_disconnected(request, work(timing)), service.settings.request_timeout_s)
        except ClientGone:
            logger.info("client gone: %s %s dropped", request.method, request.url.path)
            return Response(status_code=499)
        except TimeoutError:
            service.metrics.timeouts.inc()
            raise Timeout(
                f"the request was not answered within {service.settings.request_timeout_s:g} s and was dropped; "
                "the service is overloaded: retry later or send fewer texts",
                headers={"Retry-After": str(service.retry_after())},
            ) from None
    started = time.perf_counter()
    body = await asyncio.to_thread(dumps, content) if n_values > RENDER_IN_THREAD_VALUES else dumps(content)
    serialization_s = time.perf_counter() - started
    metrics = service.metrics
    metrics.latency.labels(route, "queue").observe(timing.queue_s)
    metrics.latency.labels(route, "inference").observe(timing.inference_s)
    metrics.latency.labels(route, "serialization").observe(serialization_s)
    return Response(body, media_type="application/json", headers={
        "X-Queue-Time": f"{timing.queue_s * 1000:.2f}",
        "X-Inference-Time": f"{timing.inference_s * 1000:.2f}",
        "X-Serialization-Time": f"{serialization_s * 1000:.2f}",
    })
