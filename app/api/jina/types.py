"""Jina's rerank shapes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class JinaRerankRequest(BaseModel):
    # unknown fields ignored, a value of the wrong type refused rather than converted
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True


class JinaDocument(BaseModel):
    text: str


class JinaRank(BaseModel):
    index: int
    relevance_score: float
    document: JinaDocument | None = None


class JinaRerankResponse(BaseModel):
    model: str
    results: list[JinaRank]
    usage: dict[str, int]
