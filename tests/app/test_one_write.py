"""Each response leaves the server in one socket write, headers and body together.

A replica killed between two writes would leave the load balancer in front of it with headers and no
body, too late to retry elsewhere (tests/deploy/test_failover.py kills one under load). Here uvicorn
runs in the test's event loop on a real socket, and every write of its side of the connections is
recorded: plain FastAPI shows uvicorn's two writes, the service shows one.
"""

from __future__ import annotations

import asyncio
from asyncio import selector_events
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse
from starlette.types import ASGIApp

from app.main import Service, create_app
from app.serialization import SENT_PART_BYTES
from app.settings import Settings
from model import TextEncoder
from tests.helpers import assert_error, free_port, wait_until_ready


@pytest.fixture
def server_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bytes]]:
    """(local port, bytes) of every write on an asyncio socket transport, the client's included.

    ``writelines`` is one write of its parts joined (as asyncio does it on Python 3.11; uvloop and later
    asyncio send the parts with one ``writev``/``sendmsg``).
    """
    writes: list[tuple[int, bytes]] = []
    transport_class = selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_class.write

    def recording(self: asyncio.Transport, data: bytes) -> None:
        writes.append((self.get_extra_info("sockname")[1], bytes(data)))
        original(self, data)

    def recording_lines(self: asyncio.Transport, parts: list[bytes]) -> None:  # one call, one system call
        recording(self, b"".join(parts))

    monkeypatch.setattr(transport_class, "write", recording)
    monkeypatch.setattr(transport_class, "writelines", recording_lines)
    return writes


@asynccontextmanager
async def uvicorn_serving(app: ASGIApp, port: int) -> AsyncIterator[httpx.AsyncClient]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, loop="none", http="httptools", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), "uvicorn stopped during start-up"
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client
    finally:
        server.should_exit = True
        await serving


def responses_written(writes: list[tuple[int, bytes]], port: int) -> Iterator[list[bytes]]:
    """The server's writes, grouped by response (a group starts at a status line)."""
    group: list[bytes] = []
    for local, data in writes:
        if local != port:
            continue
        if data.startswith(b"HTTP/1.1 ") and group:
            yield group
            group = []
        group.append(data)
    if group:
        yield group


def extra_routes(app: FastAPI) -> None:
    @app.get("/empty")
    def empty() -> Response:
        return Response(status_code=204)

    @app.get("/stream")
    def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"first part, ", b"second part"]), media_type="text/plain")


async def test_plain_fastapi_under_uvicorn_writes_headers_and_body_apart(server_writes) -> None:
    app = FastAPI()

    @app.get("/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    port = free_port()
    async with uvicorn_serving(app, port) as client:
        assert (await client.get("/hello")).json() == {"hello": "world"}
    [written] = list(responses_written(server_writes, port))
    assert len(written) == 2 and written[0].endswith(b"\r\n\r\n") and written[1] == b'{"hello":"world"}'


async def test_the_service_writes_each_response_once(server_writes, tiny_model: TextEncoder) -> None:
    app = create_app(Settings(), {tiny_model.card.name: tiny_model})
    port = free_port()
    async with app.router.lifespan_context(app), uvicorn_serving(app, port) as client:
        await wait_until_ready(client)
        server_writes.clear()
        encoded = await client.post("/encode", json={"texts": ["one write", "for the whole answer"]})
        assert encoded.status_code == 200 and len(encoded.json()["data"]) == 2
        assert_error(await client.post("/encode", json={"texts": []}), 422, "validation_error", "texts")
        assert_error(await client.get("/nowhere"), 404, "not_found")
        info = await client.get("/info")
        assert info.json()["model"] == tiny_model.card.name
    written = list(responses_written(server_writes, port))
    assert len(written) == 4, written
    for response, single in zip((encoded, None, None, info), written, strict=True):
        assert len(single) == 1, single
        head, _, body = single[0].partition(b"\r\n\r\n")
        assert body and b"content-length: %d" % len(body) in head.lower()
        if response is not None:
            assert body == response.content


async def test_empty_and_streamed_bodies_still_arrive_whole(server_writes) -> None:
    app = Service()
    extra_routes(app)
    port = free_port()
    async with uvicorn_serving(app, port) as client:
        empty = await client.get("/empty")
        streamed = await client.get("/stream")
    assert empty.status_code == 204 and empty.content == b""
    assert streamed.text == "first part, second part"
    empty_written, streamed_written = responses_written(server_writes, port)
    assert len(empty_written) == 1 and empty_written[0].endswith(b"\r\n\r\n")  # headers alone, not held back
    # The first part goes with the headers; later parts are written as they come.
    assert streamed_written[0].startswith(b"HTTP/1.1 200") and streamed_written[0].endswith(b"c\r\nfirst part, \r\n")
    assert b"".join(streamed_written[1:]) == b"b\r\nsecond part\r\n0\r\n\r\n"


async def test_a_large_answer_leaves_in_parts_of_at_most_a_mebibyte_with_its_length(
    server_writes, tiny_model: TextEncoder
) -> None:
    """An answer over SENT_PART_BYTES is not written to the transport whole (which copies what the socket does not
    take at once): the headers with its first part, then a part at a time; its length is still declared (no
    chunked encoding), and it arrives whole."""
    app = create_app(Settings(), {tiny_model.card.name: tiny_model})
    port = free_port()
    async with app.router.lifespan_context(app), uvicorn_serving(app, port) as client:
        await wait_until_ready(client)
        server_writes.clear()
        table = await client.get("/positional-encoding", params={"length": 4096, "d_model": 128})
    assert table.status_code == 200
    expected = sinusoid_table(4096, 128)
    np.testing.assert_allclose(np.array(table.json()["encoding"]), expected, atol=1e-3)  # float32 angles to 4096
    [written] = list(responses_written(server_writes, port))
    head, _, first = written[0].partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower()
    assert b"content-length: %d" % len(table.content) in head.lower()
    assert first + b"".join(written[1:]) == table.content
    assert len(table.content) > 2 * SENT_PART_BYTES and len(written) >= 3
    assert max(len(first), *(len(part) for part in written[1:])) <= SENT_PART_BYTES


def sinusoid_table(length: int, d_model: int) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), as the seed notebook writes it."""
    position = np.arange(length)[:, None]
    angle = position / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    table = np.zeros((length, d_model))
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return table
