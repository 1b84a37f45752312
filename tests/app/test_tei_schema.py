"""schemathesis with text-embeddings-inference's own OpenAPI document (tests/data/tei-openapi.json, TEI 1.9.3,
Apache-2.0) against /tei: no server error, only the statuses TEI documents, bodies as TEI's schemas say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import conforms, running_server

pytestmark = pytest.mark.slow  # starts the service as its own process

TEI_OPENAPI = Path(__file__).resolve().parents[1] / "data" / "tei-openapi.json"
# TEI's routes that are not TEI's alone: its /metrics is the service's own, its /v1/embeddings OpenAI's (both at the
# service's root, not under /tei)
ELSEWHERE = {"/metrics", "/v1/embeddings"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    env = {"ENCODER_MAX_BATCH_TEXTS": "8", "ENCODER_MAX_TOKENS_PER_TEXT": "64", "ENCODER_MAX_BODY_BYTES": "65536"}
    with running_server(env) as url:
        yield url


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_teis_own_schema_holds_for_tei(server: str, mode: GenerationMode) -> None:
    schema: Any = schemathesis.openapi.from_path(TEI_OPENAPI)
    operations = [result.ok() for result in schema.get_all_operations()]
    operations = [op for op in operations if op.path not in ELSEWHERE]
    assert {op.path for op in operations} >= {
        "/embed",
        "/rerank",
        "/predict",
        "/tokenize",
        "/decode",
        "/info",
        "/health",
    }
    conforms(operations, mode, f"{server}/tei", CHECKS, examples=30)
