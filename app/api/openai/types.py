"""OpenAI's embeddings API's shapes: /v1/embeddings' request and answer, /v1/models' list."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import (
    CHUNKING,
    ENCODING_FORMAT,
    PROMPT,
    PROMPT_NAME,
    Chunking,
    EncodingFormat,
    Prompt,
    Request,
    TextsOrIds,
    Usage,
)


class OpenAIEmbeddingsRequest(Request):
    input: TextsOrIds = Field(
        description="a string, a list of strings, a list of token ids, or a list of lists of token ids"
    )
    model: str | None = Field(None, description="a name from /v1/models; the default model when null")
    encoding_format: EncodingFormat = Field("float", description=ENCODING_FORMAT)
    dimensions: int | None = Field(None, ge=1, description="keep the first components, then L2-normalise again")
    prompt_name: str | None = Field(None, description=PROMPT_NAME)
    prompt: Prompt | None = Field(None, description=PROMPT)
    user: str | None = Field(None, description="accepted and ignored")
    chunking: Chunking | None = Field(None, description=CHUNKING + "; strings only (token ids are taken as they are)")

    model_config = ConfigDict(json_schema_extra={"examples": [{"input": ["The quick brown fox."]}]})

    @property
    def admitted_texts(self) -> int:
        return 1 if isinstance(self.input, str) or isinstance(self.input[0], int) else len(self.input)


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "encoder-service"


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]
