"""OpenAI's embeddings API: /v1/models and /v1/embeddings, for OpenAI clients and the adapters built on them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import (
    ERROR_RESPONSES,
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResponse,
    OpenAIModel,
    OpenAIModelList,
    Reply,
    usage_of,
)
from app.serialization import construct, json_response, vectors_as
from app.services.embeddings import Embedded
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep
from app.web.responding import rendered

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)


@router.get("/models", response_model=OpenAIModelList)
async def models(registry: Registry) -> Response:
    """The served models, in OpenAI's shape (the first is the default)."""
    data = [OpenAIModel(id=served.name, created=served.created) for served in registry]
    return json_response(OpenAIModelList(data=data))


@router.post("/embeddings", response_model=OpenAIEmbeddingsResponse)
async def embeddings(
    body: OpenAIEmbeddingsRequest,
    request: Request,
    registry: Registry,
    embeddings: EmbeddingsDep,
    responder: ResponderDep,
) -> Response:
    """Embeddings in OpenAI's shape: strings or token ids in, pooled L2-normalised vectors out."""
    return await responder.serve(request, registry, body, rendered(embeddings.openai, openai_embeddings))


def openai_embeddings(request: OpenAIEmbeddingsRequest, embedded: Embedded) -> Reply:
    """/v1/embeddings' answer, in OpenAI's shape."""
    data = [  # each an OpenAIEmbedding's fields as a dict, in its order: orjson writes them natively
        {"object": "embedding", "index": index, "embedding": embedding}
        for index, embedding in enumerate(vectors_as(request.encoding_format, embedded.vectors))
    ]
    response = construct(
        OpenAIEmbeddingsResponse, object="list", data=data, model=embedded.model, usage=usage_of(embedded.tokens_used)
    )
    return Reply(response, int(embedded.vectors.size))
