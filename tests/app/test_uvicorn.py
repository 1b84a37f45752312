"""The real server: `uvicorn --factory app.main:create_app` in its own process on 127.0.0.1, over real sockets."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.helpers import assert_error, running_server

pytestmark = pytest.mark.slow  # starts the service as its own process


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server({"ENCODER_MAX_BODY_BYTES": "65536"}) as url:
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
