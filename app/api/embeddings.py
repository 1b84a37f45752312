from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import (
    ERROR_RESPONSES,
    EncodeRequest,
    EncodeResponse,
    LateChunksRequest,
    LateChunksResponse,
    MultiVectorRequest,
    MultiVectorResponse,
    SparseEncodeRequest,
    SparseEncodeResponse,
)
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/encode", response_model=EncodeResponse)
async def encode(
    body: EncodeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Sentence embeddings (and, on request, tokens and per-token vectors) for one or more texts."""
    return await responder.serve(request, registry, body, embeddings.encode)


@router.post("/encode/sparse", response_model=SparseEncodeResponse)
async def encode_sparse(
    body: SparseEncodeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Sparse vectors of a SPLADE model: one weight for each vocabulary entry the text activates, the rest zero."""
    return await responder.serve(request, registry, body, embeddings.sparse)


@router.post("/encode/late-chunks", response_model=LateChunksResponse)
async def encode_late_chunks(
    body: LateChunksRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Late chunking: one pass over the whole text, then each chunk's embedding from its own tokens' final vectors."""
    return await responder.serve(request, registry, body, embeddings.late_chunks)


@router.post("/encode/multi-vector", response_model=MultiVectorResponse)
async def encode_multi_vector(
    body: MultiVectorRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """One vector a token, for late interaction (MaxSim), from a multi-vector model."""
    return await responder.serve(request, registry, body, embeddings.multi_vector)
