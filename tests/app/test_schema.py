"""schemathesis against the service's own OpenAPI schema, over HTTP: no 5xx, every response as documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import conforms, running_server

pytestmark = pytest.mark.slow  # starts the service as its own process

CHECKS = [
    not_a_server_error,  # no 5xx but the documented 503s
    status_code_conformance,  # every status the service answers is in the schema
    content_type_conformance,
    response_schema_conformance,  # every body matches its documented model
    response_headers_conformance,
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # Small limits so that generated inputs cross them too (and the run stays fast on a CPU).
    env = {
        "ENCODER_MAX_BATCH_TEXTS": "8",
        "ENCODER_MAX_TOKENS_PER_TEXT": "64",
        "ENCODER_PE_MAX_LENGTH": "256",
        "ENCODER_PE_MAX_D_MODEL": "256",
        "ENCODER_MAX_BODY_BYTES": "65536",
    }
    with running_server(env) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(server: str):
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_endpoint_conforms_to_its_schema(api_schema, server: str, mode: GenerationMode) -> None:
    """Valid and invalid generated requests to every operation: documented statuses and bodies only."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/encode",
        "/attention",
        "/positional-encoding",
        "/tokenize",
        "/info",
        "/health",
    }
    conforms(operations, mode, server, CHECKS, examples=60)
