"""The routes taken the short way in (app/web/fast_path.py), each with its schema, its function and its router's
error shape: the API's hot routes, by path."""

from __future__ import annotations

from app.api import embeddings
from app.api.cohere import routes as cohere
from app.api.openai import routes as openai
from app.api.tei import routes as tei
from app.errors import shape_of
from app.schemas import EncodeRequest
from app.web.fast_path import HotRoute

HOT_ROUTES = {
    route.path: route
    for route in (
        HotRoute("/encode", EncodeRequest, embeddings.encode),
        HotRoute("/v1/embeddings", openai.OpenAIEmbeddingsRequest, openai.embeddings),
        HotRoute("/tei/embed", tei.EmbedRequest, tei.embed_default, shape_of(tei.router)),
        HotRoute("/v2/embed", cohere.CohereEmbedRequest, cohere.embed, shape_of(cohere.router)),
    )
}
