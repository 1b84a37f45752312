from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from app.schemas import ERROR_RESPONSES, PositionalEncodingResponse, Reply
from app.serialization import construct
from app.services.inspection import Positions
from app.web.dependencies import InspectionDep, Model, ResponderDep

router = APIRouter(tags=["inspection"], responses=ERROR_RESPONSES)


@router.get("/positional-encoding", response_model=PositionalEncodingResponse)
async def positional_encoding(
    request: Request,
    model: Model,
    inspection: InspectionDep,
    responder: ResponderDep,
    length: Annotated[int, Query(ge=1, description="number of positions (at most pe_max_length, see /info)")] = 50,
    d_model: Annotated[
        int | None, Query(ge=2, description="encoding width, even; the model's hidden size when omitted")
    ] = None,
    base: Annotated[
        float | None,
        Query(
            description="wavelength base, a finite number > 1; 10000 when omitted, or for rotary the model's own "
            "(global layers) when it has rotary positions"
        ),
    ] = None,
    kind: Annotated[
        Literal["sinusoidal", "learned", "rotary", "relative"],
        Query(
            description="sinusoidal: the formula of the paper; learned: the model's own position table; rotary: "
            "the rotation angles of rotary position embeddings (d_model is then the head width; the model's own "
            "base and scaling unless base is given); relative: the bucket each query and key use (MPNet, DeBERTa)"
        ),
    ] = "sinusoidal",
) -> Response:
    """Positional encodings: the sinusoid of "Attention Is All You Need", the model's learned table, rotary
    angles, or the relative-position buckets."""

    async def work() -> Reply:
        return positions_answer(await inspection.positional_encoding(model, kind, length, d_model, base))

    return await responder.answer(request, work)


def positions_answer(positions: Positions) -> Reply:
    """/positional-encoding's answer: the table, with what it is (``buckets`` for relative positions)."""
    extra = {} if positions.buckets is None else {"buckets": positions.buckets}
    response = construct(
        PositionalEncodingResponse,
        kind=positions.kind,
        length=positions.length,
        d_model=positions.d_model,
        base=positions.base,
        **extra,
        encoding=positions.encoding,
    )
    return Reply(response, positions.encoding.size)
