"""OpenAI's embeddings request as the services' data, and their answer in OpenAI's shape."""

from __future__ import annotations

from app.api.openai.types import OpenAIEmbeddingsRequest
from app.schemas import Reply, usage_of
from app.serialization import vectors_as
from app.services.embeddings import Embedded, Pooled


def pooled(body: OpenAIEmbeddingsRequest) -> Pooled:
    """/v1/embeddings' input as what ``Embeddings.pooled`` embeds: one string, strings, one row of token ids, or
    rows of them."""
    inputs = body.input
    texts: list[str] | None = None
    ids: list[list[int]] | None = None
    if isinstance(inputs, str):
        texts = [inputs]
    elif isinstance(inputs[0], str):
        texts = [item for item in inputs if isinstance(item, str)]
    elif isinstance(inputs[0], int):
        ids = [[item for item in inputs if isinstance(item, int)]]
    else:
        ids = [item for item in inputs if isinstance(item, list)]
    return Pooled(
        texts=texts,
        ids=ids,
        one=isinstance(inputs, str) or isinstance(inputs[0], int),
        dimensions=body.dimensions,
        encoding_format=body.encoding_format,
        prompt_name=body.prompt_name,
        prompt=body.prompt,
        chunk_overlap=None if body.chunking is None else body.chunking.overlap,
    )


def openai_embeddings(request: OpenAIEmbeddingsRequest, embedded: Embedded) -> Reply:
    """/v1/embeddings' answer, in OpenAI's shape."""
    data = [  # each an OpenAIEmbedding's fields as a dict, in its order: orjson writes them natively
        {"object": "embedding", "index": index, "embedding": embedding}
        for index, embedding in enumerate(vectors_as(request.encoding_format, embedded.vectors))
    ]
    # an OpenAIEmbeddingsResponse's fields as a dict, in its order, as its data's items are
    response = {"object": "list", "data": data, "model": embedded.model, "usage": usage_of(embedded.tokens_used)}
    return Reply(response, int(embedded.vectors.size))
