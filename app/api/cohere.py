"""Cohere's v2 embed and rerank (/v2/embed, /v2/rerank) and Jina's rerank (/v1/rerank), for their clients.

As app/api/tei.py: each route translates the request into the native one, calls the same service, and
reshapes the answer. Cohere's errors are ``{"message": "..."}`` (``cohere_errors``, its router's shape); Jina's
route answers the native envelope, as the other /v1 route (OpenAI's) does.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from app.engine.messages import Timing
from app.errors import Failure, InvalidRequest, errors_in
from app.schemas import ERROR_RESPONSES, EncodeRequest, RerankRequest
from app.serialization import json_response, vectors_as
from app.serving.registry import ServedModel
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep, TasksDep
from app.web.responding import answer_value as answer

# input_type → the prompts that stand for it, the first the model has taken
INPUT_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("query",),
    "search_document": ("document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
EMBEDDING_TYPES = ("float", "base64", "binary", "ubinary")  # the ones served


def floats() -> list[EmbeddingType]:
    """embedding_types' default: float alone."""
    return ["float"]


class CohereRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CohereEmbedRequest(CohereRequest):
    model: str = Field(description="a served model's name")
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"]
    texts: list[str] | None = None
    images: list[str] | None = None
    embedding_types: list[EmbeddingType] = Field(default_factory=lambda: floats())
    output_dimension: int | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None


class CohereRerankRequest(CohereRequest):
    model: str = Field(description="a served model's name")
    query: str
    documents: list[str]
    top_n: int | None = None
    max_tokens_per_doc: int | None = None


class JinaRerankRequest(CohereRequest):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True


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


class CohereError(BaseModel):
    message: str


COHERE_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": CohereError, "description": spec["description"]} for status, spec in ERROR_RESPONSES.items()
}


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: dict[str, list[list[float]] | list[list[int]] | list[str]]
    texts: list[str]
    meta: dict[str, Any]
    response_type: Literal["embeddings_by_type"]


class CohereRank(BaseModel):
    index: int
    relevance_score: float


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereRank]
    meta: dict[str, Any]


class JinaDocument(BaseModel):
    text: str


class JinaRank(CohereRank):
    document: JinaDocument | None = None


class JinaRerankResponse(BaseModel):
    model: str
    results: list[JinaRank]
    usage: dict[str, int]


def cohere_errors(failure: Failure) -> Response:
    """Cohere's ``{"message"}``."""
    return json_response({"message": failure.message}, status_code=failure.status, headers=failure.headers)


PREFIX = "/v2"  # Cohere's v2 API
router = APIRouter(prefix=PREFIX, tags=["cohere"], responses=COHERE_RESPONSES, route_class=errors_in(cohere_errors))
jina_router = APIRouter(tags=["jina"], responses=ERROR_RESPONSES)


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

    async def work(timing: Timing) -> Any:
        embedded = await embeddings.encode(served, native, timing)
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

    async def work(timing: Timing) -> Any:
        ranked = await tasks.rerank(served, native, timing)
        results = [{"index": i, "relevance_score": float(ranked.scores[i])} for i in ranked.order]
        return {"id": str(uuid.uuid4()), "results": results, "meta": meta(ranked.tokens_used)}

    return await answer(request, responder, work, native.admitted_texts)


@jina_router.post(
    "/v1/rerank", response_model=JinaRerankResponse, summary="Jina: the documents' relevance to the query, best first"
)
async def jina_rerank(
    body: JinaRerankRequest, request: Request, registry: Registry, tasks: TasksDep, responder: ResponderDep
) -> Response:
    served = registry.get(body.model)
    if not body.documents:
        raise InvalidRequest("documents", "send at least one document")
    native = RerankRequest(query=body.query, documents=body.documents, top_n=body.top_n, model=body.model)

    async def work(timing: Timing) -> Any:
        ranked = await tasks.rerank(served, native, timing)
        results = []
        for i in ranked.order:
            result: dict[str, Any] = {"index": i, "relevance_score": float(ranked.scores[i])}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        tokens = ranked.tokens_used
        return {"model": served.name, "results": results, "usage": {"total_tokens": tokens, "prompt_tokens": tokens}}

    return await answer(request, responder, work, native.admitted_texts)
