"""TEI's clients in their own environment against /tei: LangChain's HuggingFaceEndpointEmbeddings, LlamaIndex's
TextEmbeddingsInference, Haystack's TEI embedders (dense and sparse), each equal to the native answer. The clients
run in .venv-clients (make test makes it; CLIENTS_PYTHON names its interpreter), whose dependencies would move
the suite's."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from model import default_model_path
from tests.helpers import ROOT, running_server
from tests.retrieval import write_splade

pytestmark = pytest.mark.slow  # starts the service as its own process, and the clients in theirs

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    splade = write_splade(tmp_path_factory.mktemp("splade"), "bert", "max", seed=2)
    with running_server({"ENCODER_MODELS": f"minilm={default_model_path()},splade={splade}"}) as url:
        yield url


@pytest.fixture(scope="module")
def answers(server: str) -> dict:
    python = Path(os.environ.get("CLIENTS_PYTHON", ROOT / ".venv-clients" / "bin" / "python"))
    assert python.is_file(), f"{python} is missing: `make test` installs TEI's clients in .venv-clients"
    script = ROOT / "tests" / "clients" / "tei_clients.py"
    done = subprocess.run([str(python), str(script), server, *TEXTS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_client_embeds_as_encode_does(server: str, answers: dict) -> None:
    expected = [item["embedding"] for item in httpx.post(f"{server}/encode", json={"texts": TEXTS}).json()["data"]]
    for name in ("langchain_documents", "llamaindex"):
        np.testing.assert_allclose(answers[name], expected, atol=1e-6, err_msg=name)
    # Haystack's embedders send normalize: false unless told otherwise
    raw = [
        item["embedding"]
        for item in httpx.post(f"{server}/encode", json={"texts": TEXTS, "normalize": False}).json()["data"]
    ]
    np.testing.assert_allclose(answers["haystack_documents"], raw, atol=1e-5)
    np.testing.assert_allclose(answers["haystack_text"], raw[0], atol=1e-5)
    np.testing.assert_allclose(answers["langchain_query"], expected[0], atol=1e-6)


def test_haystacks_sparse_embedder_equals_encode_sparse(server: str, answers: dict) -> None:
    body = {"texts": TEXTS[0], "model": "splade"}
    (expected,) = httpx.post(f"{server}/encode/sparse", json=body).json()["data"]
    assert answers["haystack_sparse"]["indices"] == expected["indices"]
    np.testing.assert_allclose(answers["haystack_sparse"]["values"], expected["values"], atol=1e-6)
