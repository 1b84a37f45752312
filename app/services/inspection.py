"""/attention and /positional-encoding: what the model attends to, and how it encodes positions."""

from __future__ import annotations

import asyncio
import math
from typing import Literal

import numpy as np

from app.errors import InvalidRequest
from app.registry import ServedModel
from app.schemas import AttentionRequest, AttentionResponse, PositionalEncodingResponse, Reply
from app.serialization import construct
from app.services.embeddings import pair_token_infos
from app.settings import Settings
from app.work_queue import Timing
from model import AttentionSelection, IndexOutOfRange, resolve_indices, sinusoidal_positional_encoding
from model.encoder import rotary_angles


def resolve(values: list[int] | None, count: int, param: str) -> tuple[int, ...]:
    """Layer or head indices made absolute, or a 422 naming the one out of range."""
    try:
        return tuple(resolve_indices(values, count))
    except IndexOutOfRange as error:
        raise InvalidRequest(f"{param}[{error.position}]", str(error)) from error


class Inspection:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def attention(self, served: ServedModel, request: AttentionRequest, timing: Timing | None = None) -> Reply:
        config = served.model.config
        selection = AttentionSelection(
            layers=resolve(request.layers, config.n_layers, "layers"),
            heads=resolve(request.heads, config.n_heads, "heads"),
            aggregate=request.aggregate,
        )
        (encoding,) = await served.attention_tokens.encode(
            [request.text], [request.text_pair], truncate=request.truncate, param="text", indexed=False
        )
        shape = selection.shape(len(encoding.ids))
        n_values = math.prod(shape)
        limit = self.settings.max_attention_values
        if n_values > limit:
            L, H, T, _ = shape
            raise InvalidRequest(
                "layers",
                f"the response would hold {n_values:,} attention weights ({L} layers × {H} heads × {T} × {T} "
                f"tokens), more than the limit of {limit:,}: select fewer layers or heads, use aggregate 'mean', "
                "or send a shorter text",
            )
        weights = await served.queue.attention(encoding, selection, timing)
        if request.decimals is not None:
            weights = np.round(weights, request.decimals)
        response = construct(
            AttentionResponse,
            model=served.name,
            tokens=list(encoding.tokens),
            token_details=pair_token_infos(encoding),
            layers=list(selection.layers),
            heads=list(selection.heads),
            aggregate=selection.aggregate,
            shape=list(weights.shape),
            attention=weights,
        )
        return Reply(response, n_values)

    async def positional_encoding(
        self,
        served: ServedModel,
        kind: Literal["sinusoidal", "learned", "rotary"],
        length: int,
        d_model: int | None,
        base: float | None,
    ) -> Reply:
        config = served.model.config
        if kind == "learned":
            table = served.model.encoder.embeddings.position_table()
            if table is None:
                raise InvalidRequest(
                    "kind",
                    f"model {served.name!r} has no position table: its positions are {config.position_embedding} "
                    "(ask for kind=rotary)",
                )
            if length > table.size(0):
                raise InvalidRequest("length", f"must be at most {table.size(0)}, the model's positions, got {length}")
            encoding = table[:length].detach().float().cpu().numpy()
            response = construct(
                PositionalEncodingResponse,
                kind=kind,
                length=length,
                d_model=int(table.size(1)),
                base=None,
                encoding=encoding,
            )
            return Reply(response, encoding.size)

        settings = self.settings
        rotary = kind == "rotary"
        if base is None:
            base = config.rope_theta if rotary and config.position_embedding == "rotary" else 10000.0
        if d_model is None:
            d_model = config.head_dim if rotary else config.d_model
        if length > settings.pe_max_length:
            raise InvalidRequest("length", f"must be at most {settings.pe_max_length}, got {length}")
        if d_model > settings.pe_max_d_model:
            raise InvalidRequest("d_model", f"must be at most {settings.pe_max_d_model}, got {d_model}")
        if d_model % 2 != 0:
            raise InvalidRequest("d_model", f"must be even for the {kind} encoding, got {d_model}")
        if length * d_model > settings.pe_max_values:
            raise InvalidRequest(
                "length",
                f"length × d_model = {length * d_model:,} is more than the limit of {settings.pe_max_values:,}",
            )
        if not (math.isfinite(base) and base > 1):
            raise InvalidRequest("base", f"must be a finite number greater than 1, got {base}")
        formula = rotary_angles if rotary else sinusoidal_positional_encoding
        table = await asyncio.to_thread(formula, length, d_model, base)
        encoding = table.numpy()
        response = construct(
            PositionalEncodingResponse, kind=kind, length=length, d_model=d_model, base=base, encoding=encoding
        )
        return Reply(response, encoding.size)
