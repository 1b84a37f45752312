from __future__ import annotations

from typing import Any

import numpy as np
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
    Word,
    pair_token_infos,
    usage_of,
)
from app.serialization import NPZ_MEDIA_TYPE, accepts_npz, construct
from app.services.inspection import Attended, HeadMeans, Similarities, Steps
from app.serving.registry import ServedModel
from app.web.dependencies import InspectionDep, Registry, ResponderDep
from app.web.responding import rendered
from model import HEAD_STATISTICS, HEAD_STEP_ARRAYS

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

    async def attended(served: ServedModel, body: AttentionRequest) -> Reply:
        result = await inspection.attention(served, body, binary)
        return attention_archive(result) if binary else attention_answer(body, result)

    return await responder.serve(request, registry, body, attended)


def attention_answer(request: AttentionRequest, attended: Attended) -> Reply:
    """/attention's JSON answer: the maps with their tokens (or words), layers and heads."""
    words, weights, selection = attended.words, attended.weights, attended.selection
    response = construct(
        AttentionResponse,
        model=attended.model,
        tokens=attended.tokens,
        token_details=pair_token_infos(attended.encoding),
        **({"words": [construct(Word, text=w.text, tokens=list(w.positions)) for w in words]} if words else {}),
        layers=list(selection.layers),
        heads=list(selection.heads),
        aggregate=selection.aggregate,
        weighting=selection.weighting,
        level=request.level,
        shape=list(weights.shape),
        attention=weights,
    )
    return Reply(response, weights.size)


def attention_archive(attended: Attended) -> Reply:
    """/attention's answer as a NumPy .npz archive (``Accept: application/x-npz``)."""
    archive = {
        "attention": np.ascontiguousarray(attended.weights, dtype=np.float32),
        "tokens": np.array(attended.tokens, dtype=np.str_),
        "layers": np.array(attended.selection.layers, dtype=np.int64),
        "heads": np.array(attended.selection.heads, dtype=np.int64),
    }
    return Reply(construct(AttentionResponse), attended.weights.size, archive=archive)


@router.post("/attention/neuron", response_model=NeuronResponse)
async def attention_neuron(
    body: NeuronRequest, request: Request, registry: Registry, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    """One layer and head, step by step: queries, keys, values, the scaled scores, the softmax and the context
    vectors (the seed notebooks' computation on the model's own weights)."""
    return await responder.serve(request, registry, body, rendered(inspection.neuron, neuron_answer))


def neuron_answer(request: NeuronRequest, steps: Steps) -> Reply:
    """/attention/neuron's answer: the head's steps, with the text's tokens."""
    arrays = {name: getattr(steps.steps, name) for name in HEAD_STEP_ARRAYS}
    response = construct(
        NeuronResponse,
        model=steps.model,
        tokens=list(steps.encoding.tokens),
        token_details=pair_token_infos(steps.encoding),
        layer=steps.layer,
        head=steps.head,
        scale=steps.steps.scale,
        **arrays,
    )
    return Reply(response, sum(a.size for a in arrays.values()))


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
    return await responder.serve(request, registry, body, rendered(inspection.head_statistics, statistics_answer))


def statistics_answer(request: HeadStatisticsRequest, means: HeadMeans) -> Reply:
    """/attention/heads' answer: each statistic's (layers, heads) table."""
    response = construct(
        HeadStatisticsResponse,
        model=means.model,
        layers=means.layers,
        heads=means.heads,
        n_texts=means.n_texts,
        statistics={name: means.means[s] for s, name in enumerate(HEAD_STATISTICS)},
    )
    return Reply(response, means.means.size)


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
