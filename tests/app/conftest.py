"""HTTP fixtures: the bundled model behind default settings, in-process over httpx.ASGITransport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.serving.registry import ServedModel
from app.settings import Settings
from model import TextEncoder
from tests.helpers import Service, serving


@pytest.fixture(scope="session")
async def service(bundled_model: TextEncoder) -> AsyncIterator[Service]:
    """The app on the bundled model, shared by the HTTP tests."""
    async with serving(Settings(), bundled_model) as running:
        yield running


@pytest.fixture(scope="session")
def client(service: Service) -> httpx.AsyncClient:
    return service.client


@pytest.fixture(scope="session")
def served(service: Service) -> ServedModel:
    """The shared app's model, with its queue, worker and tokenisation."""
    return service.model
