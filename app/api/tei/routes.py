"""Text-embeddings-inference's HTTP routes, under /tei (the default model) and /models/{name}/tei (any served
model): each translates TEI's request into the native one, calls the same service as the native route, and writes
the answer in TEI's shape; its errors in TEI's (``tei_errors``, the routers' error shape)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import ValidationError
from starlette.responses import Response

from app.api.tei.translate import (
    Empty,
    can_embed,
    can_embed_all,
    check_id_rows,
    kind,
    need_embedding,
    reading,
    simple_tokens,
    splade,
    strings,
    tei_errors,
    tei_info,
    truncates,
)
from app.api.tei.types import (
    TEI_RESPONSES,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    Prediction,
    PredictRequest,
    Rank,
    SimilarityParameters,
    SimpleToken,
    SparseValue,
    TeiInfo,
    TeiRerankRequest,
    TeiSimilarityRequest,
    TeiTokenizeRequest,
)
from app.errors import InvalidRequest, errors_in, refusal
from app.schemas import ClassifyRequest, EncodeRequest, RerankRequest, SimilarityRequest, SparseEncodeRequest, blank
from app.serialization import json_response
from app.services.embeddings import Embeddings, Pooled
from app.serving.registry import ModelRegistry, ServedModel
from app.web.dependencies import EmbeddingsDep, InspectionDep, Registry, ResponderDep, TasksDep, get_registry
from app.web.responding import answer_value as answer

TAG = "text-embeddings-inference"
PREFIXES = ("/tei", "/models/{model_name:path}/tei")  # where the app serves these routes; names may hold a /


async def tei_model(request: Request, registry: Registry) -> ServedModel:
    """The model of /models/{name}/tei, or the default one for /tei."""
    return registry.get(request.path_params.get("model_name"))


Model = Annotated[ServedModel, Depends(tei_model)]


router = APIRouter(tags=[TAG], responses=TEI_RESPONSES, route_class=errors_in(tei_errors))


@router.post("/embed", response_model=list[list[float]], summary="TEI: pooled embeddings, [[float]]")
async def embed(
    body: EmbedRequest, request: Request, served: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    can_embed(served, body.normalize, body.dimensions)
    inputs = body.inputs
    ids = not isinstance(inputs, str) and any(not isinstance(item, str) for item in inputs)
    if ids:  # token ids, pooled and normalised as they are, texts beside them as TEI mixes them
        items: list[Any] = [inputs] if inputs and isinstance(inputs[0], int) else list(inputs)
        if not body.normalize:
            raise InvalidRequest("normalize", "token ids are taken normalised")
        if body.prompt_name is not None:
            raise InvalidRequest("prompt_name", "not with token ids")
        id_rows = [index for index, item in enumerate(items) if not isinstance(item, str)]
        text_rows = [index for index, item in enumerate(items) if isinstance(item, str)]
        if any(blank(items[index]) for index in text_rows):
            raise Empty("Input validation error: `inputs` cannot be empty")
        # named by their place in `inputs`, not in the batch of ids handed on
        check_id_rows(served.card.tokenizer, [items[index] for index in id_rows], "inputs", "inputs", places=id_rows)
        native_ids = Pooled(ids=[items[i] for i in id_rows], dimensions=body.dimensions)
        native_texts = (
            EncodeRequest(texts=[items[i] for i in text_rows], truncate=truncates(body), dimensions=body.dimensions)
            if text_rows
            else None
        )

        served = served.read_as(reading(body))

        async def mixed() -> Any:
            vectors: list[Any] = [None] * len(items)
            by_ids = await embeddings.pooled(served, native_ids)
            for index, vector in zip(id_rows, by_ids.vectors, strict=True):
                vectors[index] = vector
            if native_texts is not None:
                by_texts = await embeddings.encode(served, native_texts)
                for index, vector in zip(text_rows, by_texts.vectors, strict=True):
                    vectors[index] = vector
            return vectors

        admitted = len(id_rows) + (native_texts.admitted_texts if native_texts is not None else 0)
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

    async def work() -> Any:
        return list((await embeddings.encode(served, native)).vectors)

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
    can_embed_all(served)
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

    async def work() -> Any:
        return (await embeddings.encode(served, native)).token_vectors

    return await answer(request, responder, work, native.admitted_texts)


@router.post(
    "/embed_sparse", response_model=list[list[SparseValue]], summary="TEI: sparse embeddings, [[{index, value}]]"
)
async def embed_sparse(
    body: EmbedAllRequest, request: Request, served: Model, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    texts, ids = strings(body.inputs, served)
    if body.prompt_name is not None:  # the prompt's text before each, as TEI puts it
        if ids:
            raise InvalidRequest("prompt_name", "applies to texts, not token ids")
        texts, _ = Embeddings.prompted(served, texts, body.prompt_name)
    native = SparseEncodeRequest(texts=texts, truncate=truncates(body))

    served = served.read_as(reading(body, ids))

    async def work() -> Any:
        encoded = await embeddings.sparse(served, native)
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

    async def work() -> Any:
        labelled = await tasks.classify(served, native)
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

    async def work() -> Any:
        ranked = await tasks.rerank(served, native)
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

    async def work() -> Any:
        return (await inspection.similarity(served, native)).scores

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


@router.post("/decode", response_model=list[str], summary="TEI: token ids back to text")
async def decode(body: DecodeRequest, served: Model) -> Response:
    ids = body.ids
    bare = not ids or isinstance(ids[0], int)  # one row of ids, not a list of rows
    rows: list[list[int]] = [ids] if bare else ids  # type: ignore[list-item,assignment]
    tokenizer = served.card.tokenizer
    check_id_rows(tokenizer, rows, "ids", "input_ids", bare=bare)
    return json_response([tokenizer.decode(row, skip_special_tokens=body.skip_special_tokens) for row in rows])


@router.get("/info", response_model=TeiInfo, summary="TEI: the served model")
async def info(request: Request, served: Model) -> Response:
    return json_response(tei_info(served, request.app.state.settings))


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
    except ValidationError as error:  # worded as every other route's refusal
        raise refusal(error) from None


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
