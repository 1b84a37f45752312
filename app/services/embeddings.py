"""/encode and /tokenize: texts to tokens, sentence vectors and token vectors."""

from __future__ import annotations

from typing import Any

from tokenizers import Encoding

from app.errors import InvalidRequest
from app.registry import ServedModel
from app.schemas import (
    Embedding,
    EncodeRequest,
    EncodeResponse,
    PairTokenInfo,
    Reply,
    TokenInfo,
    Tokenized,
    TokenizeRequest,
    TokenizeResponse,
    Usage,
)
from app.serialization import base64_float32, construct
from app.settings import Settings
from app.work_queue import Timing
from model import EmbeddingSpec, TextTokenizer


def token_infos(encoding: Encoding) -> list[TokenInfo]:
    return [
        construct(TokenInfo, id=t.id, text=t.text, start=t.start, end=t.end, special=t.special)
        for t in TextTokenizer.tokens(encoding)
    ]


def pair_token_infos(encoding: Encoding) -> list[PairTokenInfo]:
    return [
        construct(PairTokenInfo, id=t.id, text=t.text, start=t.start, end=t.end, special=t.special, segment=t.segment)
        for t in TextTokenizer.tokens(encoding)
    ]


class Embeddings:
    def __init__(self, settings: Settings) -> None:
        self.max_batch_texts = settings.max_batch_texts

    def check_batch(self, n_texts: int) -> None:
        if n_texts > self.max_batch_texts:
            raise InvalidRequest("texts", f"at most {self.max_batch_texts} texts per request, got {n_texts}")

    async def encode(self, served: ServedModel, request: EncodeRequest, timing: Timing | None = None) -> Reply:
        model = served.model
        self.check_batch(len(request.texts))
        try:
            layer = model.resolve_layer(request.layer)
        except ValueError as error:
            raise InvalidRequest("layer", str(error).removeprefix("layer ")) from error
        spec = EmbeddingSpec(
            layer=layer,
            pooling=request.pooling or model.pooling.mode,
            normalize=request.normalize,
            token_vectors=request.return_token_embeddings,
        )
        encodings = await served.tokens.encode(request.texts, truncate=request.truncate, param="texts")
        results = await served.queue.embed(encodings, spec, timing)

        as_base64 = request.encoding_format == "base64"
        data = []
        n_values = 0
        for index, (encoding, result) in enumerate(zip(encodings, results)):
            item: dict[str, Any] = {
                "index": index,
                "embedding": base64_float32(result.sentence) if as_base64 else result.sentence,
            }
            if request.return_tokens:
                item["tokens"] = token_infos(encoding)
            if result.tokens is not None:
                item["token_embeddings"] = [base64_float32(v) for v in result.tokens] if as_base64 else result.tokens
                n_values += result.tokens.size
            n_values += result.sentence.size
            data.append(construct(Embedding, **item))
        n_tokens = sum(len(e.ids) for e in encodings)
        response = construct(
            EncodeResponse,
            model=served.name,
            dim=model.config.d_model,
            data=data,
            usage=construct(Usage, prompt_tokens=n_tokens, total_tokens=n_tokens),
        )
        return Reply(response, n_values)

    async def tokenize(self, served: ServedModel, request: TokenizeRequest) -> Reply:
        self.check_batch(len(request.texts))
        pairs: list[str | None] | None
        if request.text_pair is None or isinstance(request.text_pair, str):
            pairs = None if request.text_pair is None else [request.text_pair] * len(request.texts)
        else:
            pairs = list(request.text_pair)
            if len(pairs) != len(request.texts):
                raise InvalidRequest("text_pair", f"has {len(pairs)} entries for {len(request.texts)} texts")
        encodings = await served.tokens.encode(request.texts, pairs, truncate=request.truncate, param="texts")
        response = construct(
            TokenizeResponse,
            model=served.name,
            data=[construct(Tokenized, index=i, tokens=pair_token_infos(e)) for i, e in enumerate(encodings)],
        )
        return Reply(response)
