"""Text-embeddings-inference's HTTP API under /tei (the default model) and /models/{name}/tei (any served model).

Every route translates TEI's request into the native one, calls the same service as the native route, and
reshapes the answer into TEI's; errors take TEI's body ``{"error", "error_type"}`` and TEI's statuses
(``tei_errors``, the routers' error shape). TEI's clients (huggingface_hub's InferenceClient, LangChain's and
LlamaIndex's TEI classes) work unchanged with the URL http://host:port/tei.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from app import __version__
from app.engine.messages import Timing
from app.errors import ApiError, Failure, InvalidRequest, errors_in
from app.schemas import (
    ClassifyRequest,
    EncodeRequest,
    OpenAIEmbeddingsRequest,
    RerankRequest,
    SimilarityRequest,
    SparseEncodeRequest,
    blank,
)
from app.serialization import json_response
from app.services.embeddings import Embeddings
from app.serving.registry import ModelRegistry, ServedModel
from app.serving.tokenization import Reading, check_token_ids
from app.settings import Settings
from app.web.dependencies import EmbeddingsDep, InspectionDep, Registry, ResponderDep, TasksDep, get_registry
from app.web.responding import answer_value as answer

TAG = "text-embeddings-inference"
PREFIXES = ("/tei", "/models/{model_name:path}/tei")  # where the app serves these routes; names may hold a /

# our error type → text-embeddings-inference's error_type and status
TEI_ERRORS: dict[str, tuple[str, int]] = {
    "validation_error": ("Validation", 422),
    "payload_too_large": ("Validation", 413),
    "empty": ("Empty", 400),
    "wrong_model_kind": ("Backend", 424),
    "inference_failed": ("Backend", 424),
    "overloaded": ("Overloaded", 429),
    "not_ready": ("Unhealthy", 503),
    "timeout": ("Overloaded", 503),
}


def tei_errors(failure: Failure) -> Response:
    """text-embeddings-inference's ``{"error", "error_type"}``: its error_type and status where TEI has one for the
    error, else ours with Validation."""
    error_type, status = TEI_ERRORS.get(failure.type, ("Validation", failure.status))
    return json_response(
        {"error": failure.message, "error_type": error_type}, status_code=status, headers=failure.headers
    )


class Backend(ApiError):
    """TEI's 424: the model is not of the kind the route needs."""

    status_code = 424
    type = "wrong_model_kind"


class Empty(ApiError):
    """TEI's 400 for empty inputs."""

    status_code = 400
    type = "empty"


# ---- TEI's request shapes (lenient, as TEI's: unknown fields are ignored) ----

Direction = Literal["Left", "left", "Right", "right"]
InputType = str | list[int]
Input = InputType | list[InputType]


class TeiRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")


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


TEI_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": TeiError, "description": description}
    for status, description in {
        400: "empty inputs (Empty)",
        401: "missing or wrong API key",
        404: "no model of that name",
        413: "request body larger than the limit",
        422: "invalid input, a batch too large, a text too long without truncation (Validation)",
        424: "the model is not of the kind the route needs (Backend)",
        429: "overloaded (Overloaded)",
        503: "not ready, or timed out in the queue (Unhealthy)",
    }.items()
}


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


# ---- which model, of which kind ----


async def tei_model(request: Request, registry: Registry) -> ServedModel:
    """The model of /models/{name}/tei, or the default one for /tei."""
    return registry.get(request.path_params.get("model_name"))


Model = Annotated[ServedModel, Depends(tei_model)]


def kind(served: ServedModel) -> Literal["classifier", "reranker", "embedding"]:
    """The model as TEI sees it: a classifier (a head of several labels), a reranker (one label, or a yes/no
    causal LM), else an embedding model."""
    card = served.card
    if card.head is not None:
        return "classifier" if len(card.head.labels) > 1 else "reranker"
    return "reranker" if card.answers is not None else "embedding"


def splade(served: ServedModel) -> bool:
    return served.card.sparse is not None and served.card.sparse.kind == "splade"


def need_embedding(served: ServedModel) -> None:
    if kind(served) != "embedding":
        raise Backend("Model is not an embedding model")


def truncates(body: Truncating) -> bool:
    """TEI's truncate (null: the server's auto-truncate, true by default)."""
    return True if body.truncate is None else body.truncate


def reading(body: Truncating, plain: bool = False) -> Reading:
    """How the route's texts are read: cut at their start for truncation_direction Left; ``plain``: without the
    post-processor's special tokens (decoded token ids)."""
    return Reading(left=body.truncation_direction.lower() == "left", plain=plain)


def strings(inputs: Input, served: ServedModel | None = None) -> tuple[list[str], bool]:
    """TEI's inputs as texts, and whether they are decoded token ids: one string or a list of them, or (with
    ``served``) token ids, which TEI decodes, special tokens kept, and reads again without adding any."""
    if isinstance(inputs, str):
        texts = [inputs]
    elif inputs and all(isinstance(item, str) for item in inputs):
        texts = [item for item in inputs if isinstance(item, str)]
    elif not inputs:
        raise Empty("Input validation error: `inputs` cannot be empty")
    elif served is not None and all(not isinstance(item, str) for item in inputs):
        rows: list[list[int]] = [inputs] if isinstance(inputs[0], int) else inputs  # type: ignore[assignment]
        tokenizer = served.card.tokenizer
        if any(not row for row in rows):
            raise Empty("Input validation error: `inputs` cannot be empty")
        check_token_ids(tokenizer, rows, "inputs")
        return [tokenizer.decode(row, skip_special_tokens=False) for row in rows], True
    else:
        raise InvalidRequest("inputs", "texts or token ids, not both in one batch")
    if any(blank(text) for text in texts):
        raise Empty("Input validation error: `inputs` cannot be empty")
    return texts, False


# ---- the routes ----

router = APIRouter(tags=[TAG], responses=TEI_RESPONSES, route_class=errors_in(tei_errors))


@router.post("/embed", response_model=list[list[float]], summary="TEI: pooled embeddings, [[float]]")
async def embed(
    body: EmbedRequest, request: Request, served: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    need_embedding(served)
    if splade(served) and body.normalize:
        raise Backend("`normalize` is not available for SPLADE models")
    if body.dimensions is not None and body.dimensions < 1:
        raise InvalidRequest("dimensions", "`dimensions` should be positive")
    inputs = body.inputs
    ids = not isinstance(inputs, str) and any(not isinstance(item, str) for item in inputs)
    if ids:  # token ids, as OpenAI's route takes them (always normalised), texts beside them as TEI mixes them
        items: list[Any] = [inputs] if inputs and isinstance(inputs[0], int) else list(inputs)
        if not body.normalize:
            raise InvalidRequest("normalize", "token ids are taken normalised")
        if body.prompt_name is not None:
            raise InvalidRequest("prompt_name", "not with token ids")
        id_rows = [index for index, item in enumerate(items) if not isinstance(item, str)]
        text_rows = [index for index, item in enumerate(items) if isinstance(item, str)]
        if any(blank(items[index]) for index in text_rows):
            raise Empty("Input validation error: `inputs` cannot be empty")
        if any(not items[index] for index in id_rows):
            raise Empty("Input validation error: `inputs` cannot be empty")
        # named by their place in `inputs`, not in the batch of ids handed on
        check_token_ids(served.card.tokenizer, [items[index] for index in id_rows], "inputs", places=id_rows)
        native_ids = OpenAIEmbeddingsRequest(input=[items[i] for i in id_rows], dimensions=body.dimensions)
        native_texts = (
            EncodeRequest(texts=[items[i] for i in text_rows], truncate=truncates(body), dimensions=body.dimensions)
            if text_rows
            else None
        )

        served = served.read_as(reading(body))

        async def mixed(timing: Timing) -> Any:
            vectors: list[Any] = [None] * len(items)
            by_ids = await embeddings.openai(served, native_ids, timing)
            for index, vector in zip(id_rows, by_ids.vectors, strict=True):
                vectors[index] = vector
            if native_texts is not None:
                by_texts = await embeddings.encode(served, native_texts, timing)
                for index, vector in zip(text_rows, by_texts.vectors, strict=True):
                    vectors[index] = vector
            return vectors

        admitted = native_ids.admitted_texts + (native_texts.admitted_texts if native_texts is not None else 0)
        return await answer(request, responder, mixed, admitted)
    texts, _ = strings(inputs)
    native = EncodeRequest(
        texts=texts,
        normalize=body.normalize,
        truncate=truncates(body),
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
    )

    served = served.read_as(reading(body))

    async def work(timing: Timing) -> Any:
        return list((await embeddings.encode(served, native, timing)).vectors)

    return await answer(request, responder, work, native.admitted_texts)


async def embed_default(
    body: EmbedRequest, request: Request, registry: ModelRegistry, embeddings: Any, responder: Any
) -> Response:
    """/tei/embed for the default model: the short way in (app/web/fast_path.py) calls it."""
    return await embed(body, request, registry.get(None), embeddings, responder)


@router.post("/embed_all", response_model=list[list[list[float]]], summary="TEI: every token's vector, [[[float]]]")
async def embed_all(
    body: EmbedAllRequest, request: Request, served: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    need_embedding(served)
    if splade(served):
        raise Backend("`embed_all` is not available for SPLADE models")
    texts, ids = strings(body.inputs, served)
    if ids and body.prompt_name is not None:
        raise InvalidRequest("prompt_name", "not with token ids")
    native = EncodeRequest(
        texts=texts,
        normalize=False,
        truncate=truncates(body),
        return_token_embeddings=True,
        prompt_name=body.prompt_name,
    )

    served = served.read_as(reading(body, ids))

    async def work(timing: Timing) -> Any:
        return (await embeddings.encode(served, native, timing)).token_vectors

    return await answer(request, responder, work, native.admitted_texts)


@router.post(
    "/embed_sparse", response_model=list[list[SparseValue]], summary="TEI: sparse embeddings, [[{index, value}]]"
)
async def embed_sparse(
    body: EmbedAllRequest, request: Request, served: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    if served.card.sparse is None:
        raise Backend("Model is not an embedding model with SPLADE pooling")
    texts, ids = strings(body.inputs, served)
    if body.prompt_name is not None:  # the prompt's text before each, as TEI puts it
        if ids:
            raise InvalidRequest("prompt_name", "applies to texts, not token ids")
        texts, _ = Embeddings.prompted(served, texts, body.prompt_name)
    native = SparseEncodeRequest(texts=texts, truncate=truncates(body))

    served = served.read_as(reading(body, ids))

    async def work(timing: Timing) -> Any:
        encoded = await embeddings.sparse(served, native, timing)
        return [
            [{"index": int(i), "value": float(v)} for i, v in zip(vector.indices, vector.values, strict=True)]
            for vector in encoded.vectors
        ]

    return await answer(request, responder, work, native.admitted_texts)


@router.post(
    "/predict",
    response_model=list[Prediction] | list[list[Prediction]],
    summary="TEI: the labels' scores of a text or a pair, best first",
)
async def predict(
    body: PredictRequest, request: Request, served: Model, tasks: TasksDep, responder: ResponderDep
) -> Response:
    if served.card.head is None:
        raise Backend("Model is not a classifier model")
    inputs = body.inputs
    if isinstance(inputs, str) or all(isinstance(item, str) for item in inputs):
        single = [inputs] if isinstance(inputs, str) else list(inputs)
        if not 1 <= len(single) <= 2:
            raise InvalidRequest("inputs", "one string, a pair of strings, or a batch of them")
        batch, one = [single], True
    else:
        batch, one = [list(item) for item in inputs], False
        if not batch or any(not 1 <= len(item) <= 2 for item in batch):
            raise InvalidRequest("inputs", "a batch holds single strings and pairs: lists of one or two strings")
    texts = [str(item[0]) for item in batch]
    pairs = [str(item[1]) if len(item) == 2 else None for item in batch]
    native = ClassifyRequest(
        texts=texts,
        text_pair=pairs if any(pair is not None for pair in pairs) else None,
        truncate=truncates(body),
        raw_scores=body.raw_scores,
    )

    served = served.read_as(reading(body))

    async def work(timing: Timing) -> Any:
        labelled = await tasks.classify(served, native, timing)
        ranked = [[{"score": score, "label": label} for label, score in labels] for labels in labelled.labels]
        return ranked[0] if one else ranked

    return await answer(request, responder, work, native.admitted_texts)


@router.post("/rerank", response_model=list[Rank], summary="TEI: the texts' relevance to the query, best first")
async def rerank(
    body: TeiRerankRequest, request: Request, served: Model, tasks: TasksDep, responder: ResponderDep
) -> Response:
    if not body.texts:
        raise Empty("`texts` cannot be empty")
    native = RerankRequest(
        query=body.query,
        documents=body.texts,
        raw_scores=body.raw_scores,
        return_documents=body.return_text,
        truncate=truncates(body),
    )

    served = served.read_as(reading(body))

    async def work(timing: Timing) -> Any:
        ranked = await tasks.rerank(served, native, timing)
        ranks = []
        for index in ranked.order:
            rank: dict[str, Any] = {"index": index}
            if body.return_text:
                rank["text"] = body.texts[index]
            rank["score"] = float(ranked.scores[index])
            ranks.append(rank)
        return ranks

    return await answer(request, responder, work, native.admitted_texts)


@router.post(
    "/similarity", response_model=list[float], summary="TEI: the cosine of the source sentence with each sentence"
)
async def similarity(
    body: TeiSimilarityRequest, request: Request, served: Model, inspection: InspectionDep, responder: ResponderDep
) -> Response:
    need_embedding(served)
    if not body.inputs.sentences:
        raise Empty("`inputs.sentences` cannot be empty")
    parameters = body.parameters or SimilarityParameters()
    native = SimilarityRequest(
        source=body.inputs.source_sentence,
        texts=body.inputs.sentences,
        truncate=truncates(parameters),
        prompt_name=parameters.prompt_name,
    )

    served = served.read_as(reading(parameters))

    async def work(timing: Timing) -> Any:
        return (await inspection.similarity(served, native, timing)).scores

    return await answer(request, responder, work, native.admitted_texts)


@router.post("/tokenize", response_model=list[list[SimpleToken]], summary="TEI: tokens with byte offsets")
async def tokenize(body: TeiTokenizeRequest, served: Model) -> Response:
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts or any(blank(text) for text in texts):
        raise Empty("`inputs` cannot be empty")
    prompted, _ = Embeddings.prompted(served, texts, body.prompt_name)  # the model's default prompt too, as /embed
    encodings = await served.tokens.encode(prompted, whole=True, special_tokens=body.add_special_tokens)
    result = [simple_tokens(text, encoding) for text, encoding in zip(prompted, encodings, strict=True)]
    return json_response(result)


def simple_tokens(text: str, encoding: Any) -> list[dict[str, Any]]:
    """A text's tokens as TEI's SimpleToken: id, the text it covers, whether special, and its byte offsets in the
    UTF-8 text (none for a special token)."""
    tokens = []
    for id_, token, (start, end), special in zip(
        encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
    ):
        if special:
            tokens.append({"id": id_, "text": token, "special": True, "start": None, "stop": None})
        else:  # TEI's offsets count bytes of the UTF-8 text
            first = len(text[:start].encode("utf-8"))
            piece = text[start:end]
            tokens.append(
                {"id": id_, "text": piece, "special": False, "start": first, "stop": first + len(piece.encode("utf-8"))}
            )
    return tokens


@router.post("/decode", response_model=list[str], summary="TEI: token ids back to text")
async def decode(body: DecodeRequest, served: Model) -> Response:
    ids = body.ids
    bare = not ids or isinstance(ids[0], int)  # one row of ids, not a list of rows
    rows: list[list[int]] = [ids] if bare else ids  # type: ignore[list-item,assignment]
    if not rows or any(not row for row in rows):
        raise Empty("Input validation error: `input_ids` cannot be empty")
    tokenizer = served.card.tokenizer
    check_token_ids(tokenizer, rows, "ids", bare=bare)
    return json_response([tokenizer.decode(row, skip_special_tokens=body.skip_special_tokens) for row in rows])


@router.get("/info", response_model=TeiInfo, summary="TEI: the served model")
async def info(request: Request, served: Model) -> Response:
    return json_response(tei_info(served, request.app.state.settings))


def tei_info(served: ServedModel, settings: Settings) -> dict[str, Any]:
    """The served model as TEI's /info describes it (its gRPC Info the same, app/api/tei_grpc)."""
    card = served.card
    model_type: dict[str, Any]
    if kind(served) == "embedding":
        pooling = "splade" if splade(served) else {"lasttoken": "last_token"}.get(card.pooling.mode, card.pooling.mode)
        model_type = {"embedding": {"pooling": pooling}}
    else:
        labels = card.head.labels if card.head is not None else ["yes"]
        table: dict[str, dict[str, Any]] = {"id2label": {str(i): label for i, label in enumerate(labels)}}
        table["label2id"] = {label: i for i, label in enumerate(labels)}
        model_type = {kind(served): table}
    return {
        "model_id": served.name,
        "model_sha": None,
        "model_dtype": served.facts.weights_dtype,
        "served_model_name": served.name,
        "model_type": model_type,
        "max_concurrent_requests": settings.max_queue_texts,
        "max_input_length": card.max_tokens,
        "max_batch_tokens": served.facts.max_batch_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": settings.max_batch_texts,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }


@router.post(
    "",
    response_model=list[list[float]] | list[list[SparseValue]] | list[Prediction] | list[Rank] | list[float],
    summary="TEI: the model's own route, as TEI dispatches POST / (predict, rerank, embed_sparse, embed)",
)
async def dispatch(
    request: Request,
    served: Model,
    embeddings: EmbeddingsDep,
    tasks: TasksDep,
    inspection: InspectionDep,
    responder: ResponderDep,
    payload: Annotated[dict[str, Any], Body()],
) -> Response:
    """A classifier predicts, a reranker reranks, a SPLADE model gives sparse embeddings, any other embeds (or,
    given sentence similarity's body, compares)."""
    model_kind = kind(served)
    try:
        inputs = payload.get("inputs") if isinstance(payload, dict) else None
        if model_kind == "embedding" and isinstance(inputs, dict) and "source_sentence" in inputs:
            # sentence similarity's body (TEI dispatches it so when started for that task)
            body = TeiSimilarityRequest.model_validate(payload)
            return await similarity(body, request, served, inspection, responder)
        if model_kind == "classifier":
            return await predict(PredictRequest.model_validate(payload), request, served, tasks, responder)
        if model_kind == "reranker":
            return await rerank(TeiRerankRequest.model_validate(payload), request, served, tasks, responder)
        if splade(served):
            sparse = EmbedAllRequest.model_validate(payload)
            return await embed_sparse(sparse, request, served, embeddings, responder)
        return await embed(EmbedRequest.model_validate(payload), request, served, embeddings, responder)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InvalidRequest(where, str(first.get("msg", "invalid"))) from None


health_router = APIRouter(
    tags=[TAG],
    responses={status: TEI_RESPONSES[status] for status in (404, 503)},
    route_class=errors_in(tei_errors),
)


@health_router.head("/health", include_in_schema=False)  # as GET; not a second operation in the schema
@health_router.get(
    "/health",
    response_class=Response,
    responses={200: {"description": "ready (no body)"}},
    summary="TEI: 200 when the model is ready, else 503",
)
async def health(request: Request) -> Response:
    registry: ModelRegistry = await get_registry(request)
    registry.get(request.path_params.get("model_name"))
    return Response(status_code=200)
