"""Text-embeddings-inference's requests as the services' data and their answers in its shapes: its errors, the
kind of model it sees, how it reads texts and token ids, its tokens and its /info."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from starlette.responses import Response

from app import __version__
from app.api.tei.types import Input, Truncating
from app.errors import ApiError, Failure, InvalidRequest
from app.schemas import blank
from app.serialization import json_response
from app.serving.registry import ServedModel
from app.serving.tokenization import Reading, check_token_ids
from app.settings import Settings
from model import TextTokenizer

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
    "internal_error": ("Backend", 500),
}


# The tasks whose refusal by the services (CannotDo: a model without a head, or with a head of several labels where
# one is needed) TEI words its own way, as its 424 Backend: a route's check of the model's kind made once, by the
# services, and written here.
TEI_REFUSALS: dict[str, str] = {
    "classify": "Model is not a classifier model",  # /predict, Predict
    "rerank": "model is not a re-ranker model",  # /rerank, Rerank: a classifier of several labels
    "sparse": "Model is not an embedding model with SPLADE pooling",  # /embed_sparse, EmbedSparse
}


def backend_error(message: str) -> str:
    """An error of TEI's backend (a model not of the kind the call needs among them) as TEI writes it in its HTTP
    body and its gRPC status: its ``TextEmbeddingsError::Backend``'s words, "Backend error: " and the message."""
    return f"Backend error: {message}"


def tei_errors(failure: Failure) -> Response:
    """text-embeddings-inference's ``{"error", "error_type"}``: its error_type and status where TEI has one for the
    error, else ours with Validation."""
    refusal = TEI_REFUSALS.get(failure.refused_task or "")
    if refusal is not None:
        body = {"error": backend_error(refusal), "error_type": "Backend"}
        return json_response(body, status_code=424, headers=failure.headers)
    error_type, status = TEI_ERRORS.get(failure.type, ("Validation", failure.status))
    message = backend_error(failure.message) if error_type == "Backend" else failure.message
    return json_response({"error": message, "error_type": error_type}, status_code=status, headers=failure.headers)


class Backend(ApiError):
    """TEI's 424: the model is not of the kind the route needs."""

    status_code = 424
    type = "wrong_model_kind"


class Empty(ApiError):
    """TEI's 400 for empty inputs."""

    status_code = 400
    type = "empty"


def check_id_rows(
    tokenizer: TextTokenizer,
    rows: Sequence[Sequence[int]],
    param: str,
    field: str,
    places: Sequence[int] | None = None,
    bare: bool = False,
) -> None:
    """Token ids given to TEI's routes, as TEI checks them: no row empty (its 400 naming ``field``), then every id
    inside the vocabulary (our 422 naming the first outside it: ``check_token_ids``)."""
    if any(not row for row in rows):
        raise Empty(f"Input validation error: `{field}` cannot be empty")
    check_token_ids(tokenizer, rows, param, places=places, bare=bare)


def kind(served: ServedModel) -> Literal["classifier", "reranker", "embedding"]:
    """The model as TEI sees it: a classifier (a head of several labels), a reranker (one label, or a yes/no
    causal LM), else an embedding model."""
    card = served.card
    if card.head is not None:
        return "classifier" if len(card.head.labels) > 1 else "reranker"
    return "reranker" if card.answers is not None else "embedding"


def splade(served: ServedModel) -> bool:
    return served.card.sparse is not None and served.card.sparse.kind == "splade"


# TEI's refusals of a model that is not of the kind a route needs (its 424 Backend, in its words) where the services
# would serve it, each written once for the HTTP routes and the gRPC methods. They are TEI's rules, not the services':
# the native routes embed with a classifier's encoder, say, which TEI refuses. Where the services refuse the model
# too (a classifier for /predict, sparse output for /embed_sparse) their refusal is TEI's (TEI_REFUSALS).


def need_embedding(served: ServedModel) -> None:
    """/similarity's rule (and, within ``can_embed`` and ``can_embed_all``, /embed's and /embed_all's): an embedding
    model."""
    if kind(served) != "embedding":
        raise Backend("Model is not an embedding model")


def can_embed(served: ServedModel, normalize: bool, dimensions: int | None) -> None:
    """/embed's rule (Embed's): an embedding model, not normalised where it is SPLADE, its ``dimensions`` positive."""
    need_embedding(served)
    if splade(served) and normalize:
        raise Backend("`normalize` is not available for SPLADE models")
    if dimensions is not None and dimensions < 1:
        raise InvalidRequest("dimensions", "`dimensions` should be positive")


def can_embed_all(served: ServedModel) -> None:
    """/embed_all's rule (EmbedAll's): an embedding model that is not SPLADE."""
    need_embedding(served)
    if splade(served):
        raise Backend("`embed_all` is not available for SPLADE models")


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
        check_id_rows(tokenizer, rows, "inputs", "inputs")
        return [tokenizer.decode(row, skip_special_tokens=False) for row in rows], True
    else:
        raise InvalidRequest("inputs", "texts or token ids, not both in one batch")
    if any(blank(text) for text in texts):
        raise Empty("Input validation error: `inputs` cannot be empty")
    return texts, False


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


def tei_info(served: ServedModel, settings: Settings) -> dict[str, Any]:
    """The served model as TEI's /info describes it (its gRPC Info the same, app/api/tei/grpc)."""
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
