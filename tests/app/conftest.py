"""HTTP fixtures: the app in-process over httpx.ASGITransport, with its lifespan run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from model import TextEncoder


async def wait_until_ready(client: httpx.AsyncClient, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await client.get("/health")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline, "the service did not become ready"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def serve(settings: Settings | None = None, model: TextEncoder | None = None, ready: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """An AsyncClient talking to a fresh app, lifespan started (and, with ``ready``, model loaded)."""
    app = create_app(settings or Settings(), model)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            if ready:
                await wait_until_ready(client)
            yield client


@pytest.fixture(scope="session")
async def client(bundled_model: TextEncoder) -> AsyncIterator[httpx.AsyncClient]:
    """The bundled model behind default settings, shared by the HTTP tests."""
    async with serve(Settings(), bundled_model) as client:
        yield client


def assert_error(response: httpx.Response, status: int, type_: str, param: str | None = None, contains: str = "") -> dict:
    """The response is the API.md error envelope with this status, type and param."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param"}, body
    assert body["error"]["type"] == type_, body
    assert body["error"]["param"] == param, body
    assert contains in body["error"]["message"], body
    return body["error"]
