"""Cohere's requests as the services' data and their answers in its shapes: the prompt its input_type stands
for, documents cut at max_tokens_per_doc, its meta, its error's body."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from app.errors import Failure, InvalidRequest
from app.serialization import json_response
from app.serving.registry import ServedModel

# input_type → the prompts that stand for it, the first the model has taken
INPUT_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("query",),
    "search_document": ("document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def meta(tokens: int) -> dict[str, Any]:
    return {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}


def input_prompt(served: ServedModel, input_type: str) -> str | None:
    """The model's prompt for Cohere's input_type (search_query → query, search_document → document or
    passage), or none where it has none."""
    return next((name for name in INPUT_PROMPTS.get(input_type, ()) if name in served.card.prompts), None)


async def shortened(served: ServedModel, documents: list[str], limit: int | None) -> list[str]:
    """Each document cut after its first ``limit`` tokens (Cohere's max_tokens_per_doc), at the end of that
    token's characters."""
    if limit is None:
        return documents
    if limit < 1:
        raise InvalidRequest("max_tokens_per_doc", "must be at least 1")
    encodings = await served.tokens.encode(documents, param="documents", whole=True, special_tokens=False)
    cut = []
    for document, encoding in zip(documents, encodings, strict=True):
        ends = [end for (_, end), special in zip(encoding.offsets, encoding.special_tokens_mask) if not special]
        cut.append(document if len(ends) <= limit else document[: ends[limit - 1]])
    return cut


def cohere_errors(failure: Failure) -> Response:
    """Cohere's ``{"message"}``."""
    return json_response({"message": failure.message}, status_code=failure.status, headers=failure.headers)
