"""Cohere's v2 embed and rerank shapes, and its error's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import ERROR_DESCRIPTIONS, error_responses

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
EMBEDDING_TYPES = ("float", "base64", "binary", "ubinary")  # the ones served


def floats() -> list[EmbeddingType]:
    """embedding_types' default: float alone."""
    return ["float"]


class CohereRequest(BaseModel):
    # unknown fields ignored, a value of the wrong type refused rather than converted
    model_config = ConfigDict(strict=True, extra="ignore")


class CohereEmbedRequest(CohereRequest):
    model: str = Field(description="a served model's name")
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"]
    texts: list[str] | None = None
    images: list[str] | None = None
    embedding_types: list[EmbeddingType] = Field(default_factory=lambda: floats())
    output_dimension: int | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None


class CohereRerankRequest(CohereRequest):
    model: str = Field(description="a served model's name")
    query: str
    documents: list[str]
    top_n: int | None = None
    max_tokens_per_doc: int | None = None


class CohereError(BaseModel):
    message: str


COHERE_RESPONSES = error_responses(CohereError, ERROR_DESCRIPTIONS)  # the statuses of ours, in Cohere's shape


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: dict[str, list[list[float]] | list[list[int]] | list[str]]
    texts: list[str]
    meta: dict[str, Any]
    response_type: Literal["embeddings_by_type"]


class CohereRank(BaseModel):
    index: int
    relevance_score: float


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereRank]
    meta: dict[str, Any]
