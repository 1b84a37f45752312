"""The routes taken the short way in (app/web/fast_path.py), each with its schema and its function: the API's
hot routes, by path."""

from __future__ import annotations

from app.api import cohere, embeddings, openai_compat, tei
from app.schemas import EncodeRequest, OpenAIEmbeddingsRequest
from app.web.fast_path import HotRoute

HOT_ROUTES = {
    route.path: route
    for route in (
        HotRoute("/encode", EncodeRequest, embeddings.encode),
        HotRoute("/v1/embeddings", OpenAIEmbeddingsRequest, openai_compat.embeddings),
        HotRoute("/tei/embed", tei.EmbedRequest, tei.embed_default, tei.tei_errors),
        HotRoute("/v2/embed", cohere.CohereEmbedRequest, cohere.embed, cohere.cohere_errors),
    )
}
