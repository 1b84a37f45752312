"""Cohere's v2 routes, /v2/embed and /v2/rerank: each translates Cohere's request into the native one, calls
the same service as the native route, and writes the answer in Cohere's shape; its errors ``{"message": "..."}``
(``cohere_errors``, its router's shape)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.cohere.translate import cohere_errors, input_prompt, meta, shortened
from app.api.cohere.types import (
    COHERE_RESPONSES,
    EMBEDDING_TYPES,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereRerankRequest,
    CohereRerankResponse,
)
from app.errors import InvalidRequest, errors_in
from app.schemas import EncodeRequest, RerankRequest
from app.serialization import vectors_as
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep, TasksDep
from app.web.responding import answer_value as answer

PREFIX = "/v2"  # Cohere's v2 API
router = APIRouter(prefix=PREFIX, tags=["cohere"], responses=COHERE_RESPONSES, route_class=errors_in(cohere_errors))


@router.post("/embed", response_model=CohereEmbedResponse, summary="Cohere v2: embeddings by type")
async def embed(
    body: CohereEmbedRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    served = registry.get(body.model)
    if body.images or body.input_type == "image":
        raise InvalidRequest("images", "images are not embedded here: send texts")
    if not body.texts:
        raise InvalidRequest("texts", "send at least one text")
    if body.truncate == "START":
        raise InvalidRequest("truncate", "START is not served: texts are cut at their end (END), or not (NONE)")
    wanted = list(dict.fromkeys(body.embedding_types))
    refused = [kind for kind in wanted if kind not in EMBEDDING_TYPES]
    if refused:
        raise InvalidRequest("embedding_types", f"{', '.join(refused)} not served: float, base64, binary, ubinary")
    if body.max_tokens is not None and body.max_tokens < served.card.max_tokens:
        raise InvalidRequest("max_tokens", f"texts are cut at the model's {served.card.max_tokens} tokens")
    binary = any(kind in ("binary", "ubinary") for kind in wanted)
    embeddings.check_dimensions(body.output_dimension, served.card.dimension, "binary" if binary else "float")
    native = EncodeRequest(
        texts=body.texts,
        truncate=body.truncate == "END",
        dimensions=body.output_dimension,
        prompt_name=input_prompt(served, body.input_type),
    )

    async def work() -> Any:
        embedded = await embeddings.encode(served, native)
        vectors, tokens = embedded.vectors, embedded.tokens_used  # (B, D), as /encode gives them
        return {
            "id": str(uuid.uuid4()),
            "embeddings": {kind: vectors_as(kind, vectors) for kind in wanted},
            "texts": body.texts,
            "meta": meta(tokens),
            "response_type": "embeddings_by_type",
        }

    return await answer(request, responder, work, native.admitted_texts)


@router.post(
    "/rerank",
    response_model=CohereRerankResponse,
    summary="Cohere v2: the documents' relevance to the query, best first",
)
async def rerank(
    body: CohereRerankRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    served = registry.get(body.model)
    if not body.documents:
        raise InvalidRequest("documents", "send at least one document")
    documents = await shortened(served, body.documents, body.max_tokens_per_doc)
    native = RerankRequest(query=body.query, documents=documents, top_n=body.top_n, model=body.model)

    async def work() -> Any:
        ranked = await tasks.rerank(served, native)
        results = [{"index": i, "relevance_score": float(ranked.scores[i])} for i in ranked.order]
        return {"id": str(uuid.uuid4()), "results": results, "meta": meta(ranked.tokens_used)}

    return await answer(request, responder, work, native.admitted_texts)
