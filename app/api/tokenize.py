from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.schemas import ERROR_RESPONSES, Reply, Tokenized, TokenizeRequest, TokenizeResponse, pair_token_infos
from app.serialization import construct
from app.services.embeddings import Tokenised
from app.web.dependencies import EmbeddingsDep, Registry, ResponderDep
from app.web.responding import rendered

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(
    body: TokenizeRequest, request: Request, registry: Registry, embeddings: EmbeddingsDep, responder: ResponderDep
) -> Response:
    """The model's tokens for one or more texts (optionally paired), with ids, character spans and segments."""
    return await responder.serve(request, registry, body, rendered(embeddings.tokenize, tokenized))


def tokenized(request: TokenizeRequest, tokenised: Tokenised) -> Reply:
    """/tokenize's answer: each text's tokens with their ids, spans, segments and whether they are special."""
    data = [construct(Tokenized, index=i, tokens=pair_token_infos(e)) for i, e in enumerate(tokenised.encodings)]
    return Reply(construct(TokenizeResponse, model=tokenised.model, data=data))
