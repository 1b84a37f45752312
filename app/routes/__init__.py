"""One router per endpoint family, and how a route hands its work over and answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from starlette.responses import Response

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
    request: Request, service: EncoderService, work: Callable[[], Awaitable[Any]], n_values: int = 0
) -> Response:
    """Admit the request (429 when the queue is full), await its work, serialise the result."""
    async with service.admit():
        try:
            content = await until_disconnected(request, work())
        except ClientGone:
            logger.debug("client gone: %s %s dropped", request.method, request.url.path)
            return Response(status_code=499)
    body = await asyncio.to_thread(dumps, content) if n_values > RENDER_IN_THREAD_VALUES else dumps(content)
    return Response(body, media_type="application/json")
