from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from tokenizers import Encoding

from app.schemas import (
    ERROR_RESPONSES,
    EncodeRequest,
    EncodeResponse,
    LateChunk,
    LateChunksRequest,
    LateChunksResponse,
    MultiVectorEmbedding,
    MultiVectorRequest,
    MultiVectorResponse,
    Reply,
    SparseEmbedding,
    SparseEncodeRequest,
    SparseEncodeResponse,
    token_infos,
    usage_of,
)
from app.serialization import construct, vectors_as
from app.services.embeddings import Chunked, Embedded, SparseEncoded, TokenVectors
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep
from app.web.responding import rendered

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/encode", response_model=EncodeResponse)
async def encode(
    body: EncodeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Sentence embeddings (and, on request, tokens and per-token vectors) for one or more texts."""
    return await responder.serve(request, registry, body, rendered(embeddings.encode, encoded))


def encoded(request: EncodeRequest, embedded: Embedded) -> Reply:
    """/encode's answer: each text's embedding in the request's encoding_format, with its tokens and its tokens'
    vectors where asked."""
    vectors = vectors_as(request.encoding_format, embedded.vectors)
    width = embedded.vectors.shape[1]
    data = []  # each an Embedding's fields as a dict, in its order: orjson writes them natively
    n_values = 0
    for index in range(len(embedded.vectors)):
        item: dict[str, Any] = {"index": index, "embedding": vectors[index]}
        if request.return_tokens:
            encoding = embedded.encodings[index]
            assert isinstance(encoding, Encoding), "/encode's texts are tokenised here, never given as ids"
            item["tokens"] = token_infos(encoding)
        tokens = embedded.token_vectors[index]
        if tokens is not None:
            float_ = request.encoding_format == "float"
            item["token_embeddings"] = tokens if float_ else vectors_as(request.encoding_format, tokens)
            n_values += tokens.size
        n_values += width
        data.append(item)
    # an EncodeResponse's fields as a dict, in its order, as its data's items are (a model made and written: 7 µs a
    # request, the dict 1)
    response = {"model": embedded.model, "dim": width, "data": data, "usage": usage_of(embedded.tokens_used)}
    return Reply(response, n_values)


@router.post("/encode/sparse", response_model=SparseEncodeResponse)
async def encode_sparse(
    body: SparseEncodeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Sparse vectors of a SPLADE model: one weight for each vocabulary entry the text activates, the rest zero."""
    return await responder.serve(request, registry, body, rendered(embeddings.sparse, sparse_encoded))


@router.post("/encode/late-chunks", response_model=LateChunksResponse)
async def encode_late_chunks(
    body: LateChunksRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """Late chunking: one pass over the whole text, then each chunk's embedding from its own tokens' final vectors."""
    return await responder.serve(request, registry, body, rendered(embeddings.late_chunks, late_chunked))


def late_chunked(request: LateChunksRequest, chunked: Chunked) -> Reply:
    """/encode/late-chunks' answer: each chunk's span and embedding."""
    data = [
        construct(LateChunk, index=index, start=start, end=end, embedding=embedding)
        for index, ((start, end), embedding) in enumerate(zip(chunked.spans, chunked.vectors, strict=True))
    ]
    response = construct(LateChunksResponse, model=chunked.model, data=data, usage=usage_of(chunked.tokens_used))
    return Reply(response, sum(vector.size for vector in chunked.vectors))


@router.post("/encode/multi-vector", response_model=MultiVectorResponse)
async def encode_multi_vector(
    body: MultiVectorRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """One vector a token, for late interaction (MaxSim), from a multi-vector model."""
    return await responder.serve(request, registry, body, rendered(embeddings.multi_vector, multi_vectors))


def multi_vectors(request: MultiVectorRequest, found: TokenVectors) -> Reply:
    """/encode/multi-vector's answer: each text's vectors in the request's encoding_format, with their tokens."""
    data = [
        construct(
            MultiVectorEmbedding, index=index, embeddings=vectors_as(request.encoding_format, vectors), tokens=names
        )
        for index, (vectors, names) in enumerate(zip(found.vectors, found.tokens, strict=True))
    ]
    dim = int(found.vectors[0].shape[1])
    response = construct(MultiVectorResponse, model=found.model, dim=dim, data=data, usage=usage_of(found.tokens_used))
    return Reply(response, sum(vectors.size for vectors in found.vectors))


def sparse_encoded(request: SparseEncodeRequest, encoded: SparseEncoded) -> Reply:
    """/encode/sparse's answer: each text's vocabulary ids and weights, with their entries where asked."""
    data = []
    for index, vector in enumerate(encoded.vectors):
        item: dict[str, Any] = {"index": index, "indices": vector.indices, "values": vector.values}
        if encoded.entries is not None:
            item["tokens"] = encoded.entries[index]
        data.append(construct(SparseEmbedding, **item))
    response = construct(SparseEncodeResponse, model=encoded.model, data=data, usage=usage_of(encoded.tokens_used))
    return Reply(response, sum(2 * vector.indices.size for vector in encoded.vectors))
