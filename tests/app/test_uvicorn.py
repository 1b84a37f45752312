"""The real server: `uvicorn --factory app.main:create_app` in its own process on 127.0.0.1, over real sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.helpers import assert_error, running_server

pytestmark = pytest.mark.slow  # starts the service as its own process


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server({"ENCODER_MAX_BODY_BYTES": "65536", "ENCODER_BODY_TIMEOUT_S": "1"}) as url:
        yield url


def test_every_endpoint_answers_over_a_real_socket(server: str, sentence_transformer) -> None:
    with httpx.Client(base_url=server, timeout=60) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/info").json()["model"] == "all-MiniLM-L6-v2"
        texts = ["over a real socket", "to a real uvicorn"]
        data = client.post("/encode", json={"texts": texts}).json()["data"]
        expected = sentence_transformer.encode(texts, normalize_embeddings=True)
        np.testing.assert_allclose([d["embedding"] for d in data], expected, atol=1e-5)
        weights = np.array(client.post("/attention", json={"text": "hello there"}).json()["attention"])
        assert weights.shape == (6, 12, 4, 4)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert len(client.get("/positional-encoding", params={"length": 7}).json()["encoding"]) == 7
        assert client.post("/tokenize", json={"texts": "hi"}).json()["data"][0]["tokens"][1]["text"] == "hi"


def test_settings_come_from_the_environment_and_errors_keep_their_envelope(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as client:
        assert client.get("/info").json()["limits"]["max_body_bytes"] == 65536
        assert_error(client.post("/encode", content=b"x" * 70000), 413, "payload_too_large")
        assert_error(client.post("/encode", json={"texts": ""}), 422, "validation_error", "texts[0]")
        assert_error(client.get("/nowhere"), 404, "not_found")
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 100\r\n\r\n" + b'{"texts": [',  # declared, then a tenth of it
        b"Transfer-Encoding: chunked\r\n\r\n" + b'b\r\n{"texts": [\r\n',  # chunked, then no more chunks
    ],
    ids=["declared length", "chunked"],
)
def test_a_body_that_stalls_is_answered_408_and_its_connection_closed_others_unaffected(
    server: str, head: bytes
) -> None:
    address = urlsplit(server)
    with socket.create_connection((address.hostname, address.port), timeout=10) as stalled:
        stalled.sendall(b"POST /encode HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n" + head)
        started = time.monotonic()
        reply = httpx.post(f"{server}/encode", json={"texts": ["meanwhile"]}, timeout=30)  # another connection
        assert reply.status_code == 200 and len(reply.json()["data"]) == 1
        data = b""
        while chunk := stalled.recv(65536):  # until the service closes the connection
            data += chunk
        waited = time.monotonic() - started
    status, _, body = data.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), data
    assert b"connection: close" in status.lower(), status
    assert json.loads(body)["error"] == {
        "type": "request_timeout",
        "message": "the request body did not arrive within 1 s",
        "param": None,
    }
    assert 0.9 <= waited < 8, waited


def test_a_tei_body_that_stalls_is_answered_408_in_teis_shape(server: str) -> None:
    address = urlsplit(server)
    with socket.create_connection((address.hostname, address.port), timeout=10) as stalled:
        stalled.sendall(
            b"POST /tei/embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"inputs": ['
        )
        data = b""
        while chunk := stalled.recv(65536):  # until the service closes the connection
            data += chunk
    status, _, body = data.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), data
    assert json.loads(body) == {"error": "the request body did not arrive within 1 s", "error_type": "Validation"}
