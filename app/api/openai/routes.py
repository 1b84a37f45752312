"""OpenAI's embeddings API's routes: /v1/models and /v1/embeddings, in the native error envelope."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.openai.translate import openai_embeddings, pooled
from app.api.openai.types import OpenAIEmbeddingsRequest, OpenAIEmbeddingsResponse, OpenAIModel, OpenAIModelList
from app.schemas import ERROR_RESPONSES
from app.serialization import json_response
from app.services.embeddings import Embedded
from app.serving.registry import ServedModel
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

    async def compute(served: ServedModel, body: OpenAIEmbeddingsRequest) -> Embedded:
        return await embeddings.pooled(served, pooled(body))

    return await responder.serve(request, registry, body, rendered(compute, openai_embeddings))
