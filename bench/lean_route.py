"""The leanest FastAPI route that does what /encode does without a model: the yardstick of ``bench.frontend``.

It parses the same body into a pydantic model (texts, one or a list, and the options /encode takes) and answers
the same JSON shape, one 32-float embedding a text (the width of bench.frontend's model) and the usage, serialised
with orjson, as the service serialises. No model, no queue, no tokenizer.
"""

from __future__ import annotations

from typing import Literal

import orjson
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.responses import Response

VECTOR = [0.1767767] * 32  # one unit-length 32-float embedding

app = FastAPI()


class EncodeBody(BaseModel):
    texts: str | list[str]
    model: str | None = None
    pooling: Literal["mean", "cls", "max"] | None = None
    normalize: bool = True
    truncate: bool = True
    encoding_format: Literal["float", "base64"] = "float"


@app.post("/encode")
async def encode(body: EncodeBody) -> Response:
    texts = [body.texts] if isinstance(body.texts, str) else body.texts
    n = sum(len(text.split()) for text in texts)
    answer = {
        "model": "tiny",
        "dim": len(VECTOR),
        "data": [{"index": i, "embedding": VECTOR} for i in range(len(texts))],
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }
    return Response(orjson.dumps(answer), media_type="application/json")


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
