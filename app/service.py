"""What the endpoints compute, on plain data: requests in, JSON-ready dicts (numpy arrays inside) out.

Tokenisation runs in a worker thread, model work on the engine's inference thread, so the event loop
only validates and hands over. Raises ``InvalidRequest`` for bad input.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import torch
from tokenizers import Encoding

from app import __version__
from app.engine import EncodeOptions, Engine, Timing
from app.errors import InvalidRequest, Overloaded
from app.metrics import Metrics
from app.schemas import AttentionRequest, EncodeRequest, TokenizeRequest
from app.serialization import base64_float32
from app.settings import Settings
from model import TextEncoder, TextTokenizer, TooManyTokensError, sinusoidal_positional_encoding

logger = logging.getLogger(__name__)


def token_dicts(encoding: Encoding, with_segment: bool = False) -> list[dict[str, Any]]:
    return [
        {"id": t.id, "text": t.text, "start": t.start, "end": t.end, "special": t.special}
        | ({"segment": t.segment} if with_segment else {})
        for t in TextTokenizer.tokens(encoding)
    ]


def resolve_indices(values: Sequence[int] | None, count: int, param: str) -> list[int]:
    """Layer or head indices, negative ones counted from the end; all of them when None."""
    if values is None:
        return list(range(count))
    resolved = []
    for position, value in enumerate(values):
        if not -count <= value < count:
            raise InvalidRequest(f"{param}[{position}]", f"{value} is out of range: there are {count} ({-count} to {count - 1})")
        resolved.append(value % count)
    return resolved


def attention_rollout(attention: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema (2020): per layer, head mean plus identity with rows renormalised, multiplied up.

    (L, H, T, T) → (L, T, T), entry l being the rollout through layers 0..l.
    """
    T = attention.size(-1)
    mixed = attention.mean(dim=1) + torch.eye(T, dtype=attention.dtype, device=attention.device)  # (L, T, T)
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)
    rollout = [mixed[0]]
    for layer in mixed[1:]:
        rollout.append(layer @ rollout[-1])
    return torch.stack(rollout)  # (L, T, T)


class EncoderService:
    """The model behind the endpoints, with the limits in force."""

    def __init__(self, model: TextEncoder, settings: Settings, metrics: Metrics | None = None) -> None:
        self.model = model
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.max_attention_tokens = min(settings.max_attention_tokens or model.max_tokens, model.max_tokens)
        self.attention_tokenizer = (
            model.tokenizer
            if self.max_attention_tokens == model.max_tokens
            else model.tokenizer.with_max_tokens(self.max_attention_tokens)
        )
        self.engine = Engine(
            model,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            max_wait=settings.batch_wait_ms / 1000,
            on_batch=self.metrics.observe_batch,
            on_drop=self.metrics.dropped_texts.inc,
        )
        self.admitted = 0  # texts admitted and not yet answered
        self.metrics.queue_texts.set_function(self.engine.pending)
        self.metrics.admitted_texts.set_function(lambda: self.admitted)
        config = model.config
        self.metrics.model.info({
            "name": model.name, "device": str(model.device), "dtype": str(model.dtype).removeprefix("torch."),
            "layers": str(config.n_layers), "heads": str(config.n_heads), "hidden_size": str(config.d_model),
            "max_tokens": str(model.max_tokens),
        })

    @asynccontextmanager
    async def admit(self, n_texts: int) -> AsyncIterator[None]:
        """Count a request's texts in; an immediate 429 when they would pass ``max_queue_texts``.

        A single request larger than the whole queue is still admitted when nothing else is in, so that
        a limit below max_batch_texts cannot make a valid request impossible.
        """
        limit = self.settings.max_queue_texts
        if self.admitted and self.admitted + n_texts > limit:
            raise Overloaded(
                f"the work queue is full ({self.admitted} texts in, at most {limit}); retry after the Retry-After seconds",
                headers={"Retry-After": str(self.retry_after())},
            )
        self.admitted += n_texts
        try:
            yield
        finally:
            self.admitted -= n_texts

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained, from the recent pass rate (at least 1)."""
        stats = self.engine.stats
        if not stats.batches:
            return 1
        seconds_per_text = stats.compute_seconds / max(stats.batched_texts, 1)
        return max(1, min(60, round(self.admitted * seconds_per_text)))

    def close(self) -> None:
        """Finish the queued work and stop the inference thread."""
        self.engine.stop()

    def warm_up(self) -> None:
        """One forward pass on both attention paths, so the first request pays no start-up cost."""
        self.model.embed(["warm up"])
        self.model.forward(self.model.tokenizer.pad(self.model.tokenizer.encode(["warm up"])), return_attentions=True)

    # ---- helpers ----

    def _encode_texts(
        self, tokenizer: TextTokenizer, texts: Sequence[str], pairs: Sequence[str | None] | None, truncate: bool,
        param: str,
    ) -> list[Encoding]:
        try:
            return tokenizer.encode(texts, pairs, truncate=truncate)
        except TooManyTokensError as error:
            raise self._too_long(param, error) from error

    @staticmethod
    def _too_long(param: str, error: TooManyTokensError) -> InvalidRequest:
        name = f"{param}[{error.index}]" if param == "texts" else param
        return InvalidRequest(
            name, f"has {error.n_tokens} tokens, more than the maximum of {error.max_tokens} (send truncate: true to cut it)"
        )

    def _check_batch_size(self, texts: Sequence[str]) -> None:
        if len(texts) > self.settings.max_batch_texts:
            raise InvalidRequest("texts", f"at most {self.settings.max_batch_texts} texts per request, got {len(texts)}")

    # ---- endpoints ----

    async def encode(self, request: EncodeRequest, timing: Timing | None = None) -> dict[str, Any]:
        self._check_batch_size(request.texts)
        try:
            n_layers = self.model.resolve_layer(request.layer)
        except ValueError as error:
            raise InvalidRequest("layer", str(error).removeprefix("layer ")) from error
        options = EncodeOptions(
            n_layers=n_layers,
            pooling=request.pooling or self.model.pooling.mode,
            normalize=request.normalize,
            token_vectors=request.return_token_embeddings,
        )
        try:
            encodings, results = await self.engine.encode(request.texts, options, request.truncate, timing)
        except TooManyTokensError as error:
            raise self._too_long("texts", error) from error

        as_base64 = request.encoding_format == "base64"
        data = []
        for index, (encoding, result) in enumerate(zip(encodings, results)):
            item: dict[str, Any] = {
                "index": index,
                "embedding": base64_float32(result.embedding) if as_base64 else result.embedding,
            }
            if request.return_tokens:
                item["tokens"] = token_dicts(encoding)
            if request.return_token_embeddings:
                vectors = result.token_vectors
                item["token_embeddings"] = [base64_float32(v) for v in vectors] if as_base64 else vectors
            data.append(item)
        n_tokens = sum(len(e.ids) for e in encodings)
        return {
            "model": self.model.name,
            "dim": self.model.config.d_model,
            "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    async def attention(self, request: AttentionRequest, timing: Timing | None = None) -> dict[str, Any]:
        config = self.model.config
        layers = resolve_indices(request.layers, config.n_layers, "layers")
        heads = resolve_indices(request.heads, config.n_heads, "heads")
        encoding = (
            await asyncio.to_thread(
                self._encode_texts, self.attention_tokenizer, [request.text], [request.text_pair], request.truncate, "text"
            )
        )[0]
        T = len(encoding.ids)
        head_axis = len(heads) if request.aggregate == "none" else 1
        n_values = len(layers) * head_axis * T * T
        if n_values > self.settings.max_attention_values:
            raise InvalidRequest(
                "layers",
                f"the response would hold {n_values:,} attention weights ({len(layers)} layers × {head_axis} heads × "
                f"{T} × {T} tokens), more than the limit of {self.settings.max_attention_values:,}: select fewer "
                "layers or heads, use aggregate 'mean', or send a shorter text",
            )

        weights = await self.engine.call(
            lambda: self._attention_weights(encoding, layers, heads, request.aggregate), timing
        )
        if request.decimals is not None:
            weights = np.round(weights, request.decimals)
        return {
            "model": self.model.name,
            "tokens": list(encoding.tokens),
            "token_details": token_dicts(encoding, with_segment=True),
            "layers": layers,
            "heads": heads,
            "aggregate": request.aggregate,
            "shape": list(weights.shape),
            "attention": weights,
        }

    def _attention_weights(self, encoding: Encoding, layers: list[int], heads: list[int], aggregate: str) -> np.ndarray:
        """On the inference thread: the explicit attention path, then selection and aggregation."""
        batch = self.attention_tokenizer.pad([encoding])
        output = self.model.forward(batch, return_attentions=True, n_layers=max(layers) + 1)
        computed = torch.stack(output.attentions)[:, 0].float()  # (L', H, T, T), L' = max(layers) + 1
        selected = computed[:, heads]  # (L', H', T, T)
        if aggregate == "none":
            result = selected[layers]  # (L, H', T, T)
        elif aggregate == "mean":
            result = selected[layers].mean(dim=1, keepdim=True)  # (L, 1, T, T)
        else:
            result = attention_rollout(selected)[layers].unsqueeze(1)  # (L, 1, T, T)
        return result.cpu().numpy()

    def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        self._check_batch_size(request.texts)
        pairs: list[str | None] | None
        if request.text_pair is None or isinstance(request.text_pair, str):
            pairs = None if request.text_pair is None else [request.text_pair] * len(request.texts)
        else:
            pairs = list(request.text_pair)
            if len(pairs) != len(request.texts):
                raise InvalidRequest("text_pair", f"has {len(pairs)} entries for {len(request.texts)} texts")
        encodings = self._encode_texts(self.model.tokenizer, request.texts, pairs, request.truncate, "texts")
        return {
            "model": self.model.name,
            "data": [{"index": i, "tokens": token_dicts(e, with_segment=True)} for i, e in enumerate(encodings)],
        }

    def positional_encoding(self, kind: str, length: int, d_model: int | None, base: float) -> dict[str, Any]:
        settings = self.settings
        if kind == "learned":
            table = self.model.encoder.embeddings.position_table()
            if length > table.size(0):
                raise InvalidRequest("length", f"must be at most {table.size(0)}, the model's positions, got {length}")
            encoding = table[:length].detach().float().cpu().numpy()
            return {"kind": kind, "length": length, "d_model": int(table.size(1)), "base": None, "encoding": encoding}

        d_model = self.model.config.d_model if d_model is None else d_model
        if length > settings.pe_max_length:
            raise InvalidRequest("length", f"must be at most {settings.pe_max_length}, got {length}")
        if d_model > settings.pe_max_d_model:
            raise InvalidRequest("d_model", f"must be at most {settings.pe_max_d_model}, got {d_model}")
        if d_model % 2 != 0:
            raise InvalidRequest("d_model", f"must be even for the sinusoidal encoding, got {d_model}")
        if length * d_model > settings.pe_max_values:
            raise InvalidRequest(
                "length", f"length × d_model = {length * d_model:,} is more than the limit of {settings.pe_max_values:,}"
            )
        if not (math.isfinite(base) and base > 1):
            raise InvalidRequest("base", f"must be a finite number greater than 1, got {base}")
        encoding = sinusoidal_positional_encoding(length, d_model, base).numpy()
        return {"kind": kind, "length": length, "d_model": d_model, "base": base, "encoding": encoding}

    def info(self) -> dict[str, Any]:
        model, config, settings = self.model, self.model.config, self.settings
        return {
            "model": model.name,
            "path": str(model.path),
            "architecture": {
                "layers": config.n_layers,
                "heads": config.n_heads,
                "hidden_size": config.d_model,
                "intermediate_size": config.d_ff,
                "vocab_size": config.vocab_size,
                "max_positions": config.max_positions,
                "position_embedding": config.position_embedding,
                "activation": config.activation,
                "pooling": model.pooling.mode,
                "normalize": model.pooling.normalize,
            },
            "device": str(model.device),
            "dtype": str(model.dtype).removeprefix("torch."),
            "limits": {
                "max_batch_texts": settings.max_batch_texts,
                "max_tokens_per_text": model.max_tokens,
                "max_attention_tokens": self.max_attention_tokens,
                "max_attention_values": settings.max_attention_values,
                "max_body_bytes": settings.max_body_bytes,
                "pe_max_length": settings.pe_max_length,
                "pe_max_d_model": settings.pe_max_d_model,
                "pe_max_values": settings.pe_max_values,
                "max_queue_texts": settings.max_queue_texts,
                "request_timeout_s": settings.request_timeout_s,
            },
            "auth": bool(settings.api_keys),
            "version": __version__,
        }
