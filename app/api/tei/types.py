"""Text-embeddings-inference's request and answer shapes (as TEI's: unknown fields are ignored, wrong types refused)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import error_responses

Direction = Literal["Left", "left", "Right", "right"]
InputType = str | list[int]
Input = InputType | list[InputType]


class TeiRequest(BaseModel):
    # as TEI's own (serde): unknown fields ignored, a value of the wrong type refused (a bool is not a token id,
    # 0 is not false, "3" is not 3)
    model_config = ConfigDict(strict=True, extra="ignore")


class Truncating(TeiRequest):
    truncate: bool | None = Field(None, description="cut inputs past the model's maximum; null: true, as TEI's default")
    truncation_direction: Direction = Field("Right", description="only Right (the end) is cut here")


class EmbedAllRequest(Truncating):
    inputs: Input
    prompt_name: str | None = None


class EmbedRequest(EmbedAllRequest):
    normalize: bool = True
    dimensions: int | None = None


class PredictRequest(Truncating):
    inputs: str | list[str] | list[list[str]]
    raw_scores: bool = False


class TeiRerankRequest(Truncating):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False


class SimilarityInput(TeiRequest):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(Truncating):
    prompt_name: str | None = None


class TeiSimilarityRequest(TeiRequest):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TeiTokenizeRequest(TeiRequest):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(TeiRequest):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


# ---- TEI's response shapes (documented; the routes write them directly) ----


class TeiError(BaseModel):
    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


TEI_RESPONSES = error_responses(
    TeiError,
    {
        400: "empty inputs (Empty)",
        401: "missing or wrong API key",
        404: "no model of that name",
        413: "request body larger than the limit",
        422: "invalid input, a batch too large, a text too long without truncation (Validation)",
        424: "the model is not of the kind the route needs (Backend)",
        429: "overloaded (Overloaded)",
        503: "not ready, or timed out in the queue (Unhealthy)",
    },
)


class SparseValue(BaseModel):
    index: int
    value: float


class Prediction(BaseModel):
    score: float
    label: str


class Rank(BaseModel):
    index: int
    text: str | None = None
    score: float


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TeiInfo(BaseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str
    served_model_name: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None
