from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import (
    ERROR_RESPONSES,
    AttentionRequest,
    AttentionResponse,
    Explanation,
    HeadStatisticsRequest,
    HeadStatisticsResponse,
    NeuronRequest,
    NeuronResponse,
    Reply,
    Similarity,
    SimilarityRequest,
    SimilarityResponse,
    usage_of,
)
from app.serialization import NPZ_MEDIA_TYPE, accepts_npz, construct
from app.services.inspection import Similarities
from app.web.dependencies import InspectionDep, Registry, ResponderDep
from app.web.responding import rendered

router = APIRouter(tags=["inspection"], responses=ERROR_RESPONSES)

NPZ_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            NPZ_MEDIA_TYPE: {
                "schema": {"type": "string", "format": "binary"},
                "example": "with Accept: application/x-npz, a NumPy .npz archive: attention, tokens, layers, heads",
            }
        }
    }
}


@router.post("/attention", response_model=AttentionResponse, responses=NPZ_RESPONSE)
async def attention(
    body: AttentionRequest, request: Request, registry: Registry, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    """Per-layer, per-head attention matrices for a text (or text pair): optionally norm-weighted, averaged or
    rolled out, merged into words; as JSON, or as a NumPy .npz archive with `Accept: application/x-npz`."""
    binary = accepts_npz(request.headers.get("accept"))
    return await responder.serve(
        request, registry, body, lambda model, body, timing: inspection.attention(model, body, timing, binary)
    )


@router.post("/attention/neuron", response_model=NeuronResponse)
async def attention_neuron(
    body: NeuronRequest, request: Request, registry: Registry, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    """One layer and head, step by step: queries, keys, values, the scaled scores, the softmax and the context
    vectors (the seed notebooks' computation on the model's own weights)."""
    return await responder.serve(request, registry, body, inspection.neuron)


@router.post("/attention/heads", response_model=HeadStatisticsResponse)
async def attention_heads(
    body: HeadStatisticsRequest,
    request: Request,
    registry: Registry,
    inspection: InspectionDep,
    responder: ResponderDep,
) -> Response:
    """Statistics of every layer and head (entropy, distance, attention to [CLS], [SEP], punctuation, self and
    neighbours), averaged over the texts."""
    return await responder.serve(request, registry, body, inspection.head_statistics)


@router.post("/similarity", response_model=SimilarityResponse)
async def similarity(
    body: SimilarityRequest, request: Request, registry: Registry, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    """Cosine similarity of a source text with each text; with `explain`, which token pairs made each score."""
    return await responder.serve(request, registry, body, rendered(inspection.similarity, similar))


def similar(request: SimilarityRequest, similarities: Similarities) -> Reply:
    """/similarity's answer: each text's score, with its explanation where asked."""
    data = []
    for index, score in enumerate(similarities.scores):
        item: dict[str, Any] = {"index": index, "score": score}
        if similarities.explanations is not None:
            explained = similarities.explanations[index]
            item["explanation"] = construct(
                Explanation,
                source_tokens=explained.source_tokens,
                tokens=explained.tokens,
                contributions=explained.contributions,
                method=explained.method,
            )
        data.append(construct(Similarity, **item))
    usage = usage_of(similarities.tokens_used)
    return Reply(construct(SimilarityResponse, model=similarities.model, data=data, usage=usage), similarities.n_values)
