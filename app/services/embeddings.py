"""/encode and /tokenize: texts to tokens, sentence vectors and token vectors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from tokenizers import Encoding

from app.engine.messages import Task
from app.errors import InvalidRequest, ModelLacks
from app.schemas import (
    EncodeRequest,
    LateChunksRequest,
    MultiVectorRequest,
    SparseEncodeRequest,
    TokenizeRequest,
)
from app.serving.registry import ServedModel
from app.serving.tokenization import check_token_ids
from app.settings import Settings
from model import (
    EmbeddedTexts,
    EmbeddingSpec,
    MultiVectorOptions,
    MultiVectors,
    PackedTokens,
    SparseOptions,
    SparseVector,
    TextEmbedding,
    TokenSequence,
    keep_dimensions,
    sentence_rows,
    token_rows,
    unit_rows,
)


@dataclass(frozen=True, slots=True)
class SideTokens:
    """A text's tokens as a multi-vector model reads it on one side (EmbeddingsService.side_tokens)."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]


@dataclass(frozen=True)
class Embedded:
    """Texts' embeddings as the service computes them, for any API to write: the vectors (each text's first
    ``dimensions`` where asked), each text's tokens and, where asked, its tokens' vectors."""

    model: str  # the served model's name
    vectors: np.ndarray  # (B, D) float32
    encodings: Sequence[TokenSequence]  # each text's tokens, as the request gave or the tokenizer made them
    token_vectors: list[np.ndarray | None]  # each text's (T, D) token vectors, where asked
    tokens_used: int  # the tokens computed, as OpenAI counts them: every window's, where a text was chunked


@dataclass(frozen=True)
class Pooled:
    """What ``Embeddings.pooled`` embeds: texts or rows of token ids (never both), as an API that takes either
    hands them over (OpenAI's /v1/embeddings; TEI's token ids)."""

    texts: list[str] | None = None
    ids: list[list[int]] | None = None
    one: bool = False  # one bare string or one bare row of ids: errors name ``input``, not ``input[0]``
    dimensions: int | None = None  # keep the first components, then normalise again
    encoding_format: str = "float"  # binary formats ask for a multiple of 8 dimensions
    prompt_name: str | None = None
    prompt: str | None = None
    chunk_overlap: int | None = None  # texts longer than the window embedded in windows overlapping by this many


@dataclass(frozen=True)
class Chunked:
    """A text's chunks (late chunking): each chunk's span of the text and its embedding."""

    model: str
    spans: list[tuple[int, int]]  # each chunk's start and end in the text
    vectors: list[np.ndarray]  # each chunk's embedding (D,)
    tokens_used: int


@dataclass(frozen=True)
class TokenVectors:
    """Texts' vectors, one per token (multi-vector models), each with its token."""

    model: str
    vectors: list[np.ndarray]  # each text's (n, D')
    tokens: list[list[str]]  # each text's tokens, one per vector
    tokens_used: int


@dataclass(frozen=True)
class Tokenised:
    """Texts (or pairs) as the model's tokenizer reads them."""

    model: str
    encodings: list[Encoding]


@dataclass(frozen=True)
class SparseEncoded:
    """Texts' sparse vectors, for any API to write."""

    model: str
    vectors: list[SparseVector]  # each text's vocabulary ids and weights
    entries: list[list[str]] | None  # each vector's vocabulary entries, where asked
    tokens_used: int


def tokens_in(encodings: Sequence[TokenSequence]) -> int:
    if isinstance(encodings, PackedTokens):
        return int(encodings.starts[-1] - encodings.starts[0])
    return sum(len(e.ids) for e in encodings)


def second_segments(texts: Sequence[str], text_pair: str | Sequence[str | None] | None) -> list[str | None] | None:
    """``text_pair`` as one entry per text (one string for all, or a list of them), or a 422."""
    if text_pair is None or isinstance(text_pair, str):
        return None if text_pair is None else [text_pair] * len(texts)
    if len(text_pair) != len(texts):
        entries, n = ("entry" if len(text_pair) == 1 else "entries"), len(texts)
        raise InvalidRequest("text_pair", f"has {len(text_pair)} {entries} for {n} text{'' if n == 1 else 's'}")
    return list(text_pair)


SENTENCE_END = re.compile(r"[.!?\n](?=\s)")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The text cut after each '.', '!', '?' or newline that whitespace follows: late chunking's default chunks."""
    cuts = [match.end() for match in SENTENCE_END.finditer(text)]
    bounds = [0, *cuts, len(text)]
    return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]


class Embeddings:
    def __init__(self, settings: Settings) -> None:
        self.max_batch_texts = settings.max_batch_texts
        self.max_vectors = settings.max_vectors_per_request
        self.max_sparse_weights = settings.max_sparse_weights_per_request

    def check_batch(self, n_texts: int, param: str = "texts") -> None:
        if n_texts > self.max_batch_texts:
            raise InvalidRequest(param, f"at most {self.max_batch_texts} texts per request, got {n_texts}")

    async def encode(self, served: ServedModel, request: EncodeRequest) -> Embedded:
        """/encode's embeddings (pooled as the request asks, prompted, chunked, cut to ``dimensions``)."""
        model = served.card
        self.check_batch(len(request.texts))
        try:
            layer = model.resolve_layer(request.layer)
        except ValueError as error:
            raise InvalidRequest("layer", str(error).removeprefix("layer ")) from error
        self.check_dimensions(request.dimensions, model.dimension, request.encoding_format)
        texts, skip = self.prompted(served, request.texts, request.prompt_name, request.prompt)
        spec = EmbeddingSpec(
            layer=layer,
            pooling=request.pooling or model.pooling.mode,
            normalize=request.normalize,
            token_vectors=request.return_token_embeddings,
            skip=skip,
        )
        counted: Sequence[TokenSequence]
        encodings: Sequence[TokenSequence]
        if request.chunking is not None:
            self.check_unprompted(served, request.prompt_name, request.prompt)
            if request.return_token_embeddings:
                raise InvalidRequest("chunking", "not with return_token_embeddings (a text's tokens span windows)")
            whole = await served.tokens.encode(texts, param="texts", whole=True)
            sentences, counted = await self.chunked(served, whole, spec, request.chunking.overlap)
            encodings = whole
            results: Sequence[TextEmbedding] = EmbeddedTexts(sentences)
        else:
            encodings = await served.tokens.encode(
                texts, truncate=request.truncate, param="texts", token_text=request.return_tokens
            )
            results = await served.queue.run(Task("embed", encodings, spec))
            sentences, counted = sentence_rows(results), encodings  # (B, D)
        if request.dimensions is not None:
            sentences = keep_dimensions(sentences, request.dimensions, normalize_again=request.normalize)
        tokens = token_rows(results)
        return Embedded(served.name, sentences, encodings, tokens, tokens_in(counted))

    async def chunked(
        self,
        served: ServedModel,
        encodings: Sequence[Encoding],
        spec: EmbeddingSpec,
        overlap: int,
        param: str = "texts",
    ) -> tuple[np.ndarray, list[TokenSequence]]:
        """Each text's embedding from windows of the model's length (``TextTokenizer.windows``): each window pooled
        alone, unnormalised, then their mean weighted by their tokens, normalised where ``spec`` normalises. Returns
        the embeddings (B, D) and every window (what the usage counts)."""
        tokenizer = served.card.tokenizer
        room = min(tokenizer.window_content(encoding) for encoding in encodings)
        if overlap > room // 2:
            raise InvalidRequest("chunking.overlap", f"at most half a window's {room} content tokens, got {overlap}")
        windows = [tokenizer.windows(encoding, overlap) for encoding in encodings]
        flat = [window for text in windows for window in text]
        if len(flat) > self.max_batch_texts:
            raise InvalidRequest(
                param,
                f"the texts make {len(flat)} windows of {tokenizer.max_tokens} tokens, at most {self.max_batch_texts} "
                "a request: send fewer or shorter texts",
            )
        pooled = await served.queue.run(Task("embed", flat, replace(spec, normalize=False)))
        sentences, start = [], 0
        for text in windows:
            vectors = sentence_rows(pooled[start : start + len(text)])  # (k, D)
            weights = np.array([len(window.ids) for window in text], dtype=np.float32)  # (k,)
            sentences.append(weights @ vectors / weights.sum())
            start += len(text)
        embeddings = np.stack(sentences).astype(np.float32)  # (B, D)
        return (unit_rows(embeddings) if spec.normalize else embeddings), flat

    @staticmethod
    def prompted(
        served: ServedModel, texts: list[str], prompt_name: str | None, prompt: str | None = None
    ) -> tuple[list[str], int]:
        """The texts with the prompt before each (``prompt``, the one named, or the model's default), and how many
        first tokens the pooling leaves out (a prompt's, where the model excludes prompts); 422 for a prompt the
        model does not have, or for both ``prompt`` and ``prompt_name``."""
        if prompt is not None and prompt_name is not None:
            raise InvalidRequest("prompt", "give prompt or prompt_name, not both")
        model = served.card
        try:
            before = model.prompt(prompt_name, prompt)
        except KeyError:
            have = ", ".join(model.prompts) or "none"
            raise InvalidRequest(
                "prompt_name", f"model {served.name!r} has no prompt {prompt_name!r} (its prompts: {have})"
            ) from None
        return model.prompted(texts, None, before), model.prompt_skip(before)

    @staticmethod
    def check_unprompted(served: ServedModel, prompt_name: str | None, prompt: str | None) -> None:
        """Chunking takes texts without a prompt (a window would hold the prompt or not by where it falls): 422."""
        if served.card.prompt(prompt_name, prompt) is not None:
            raise InvalidRequest("chunking", "not with a prompt (the model's default one included)")

    @staticmethod
    def check_dimensions(dimensions: int | None, width: int, encoding_format: str = "float") -> None:
        if dimensions is not None and not 1 <= dimensions <= width:
            raise InvalidRequest("dimensions", f"must be between 1 and the model's width {width}, got {dimensions}")
        if dimensions is not None and dimensions % 8 and encoding_format in ("binary", "ubinary"):
            raise InvalidRequest(
                "dimensions", f"must be a multiple of 8 with encoding_format {encoding_format}, got {dimensions}"
            )

    async def pooled(self, served: ServedModel, inputs: Pooled) -> Embedded:
        """The model's pooled, normalised embeddings of texts (truncated) or of token ids (as they are), errors
        naming ``input``: what OpenAI's /v1/embeddings and TEI's token ids compute."""
        model = served.card
        self.check_dimensions(inputs.dimensions, model.dimension, inputs.encoding_format)
        encodings: list[TokenSequence]
        skip = 0
        chunked = inputs.chunk_overlap is not None
        if inputs.texts is not None and inputs.one:
            text, skip = self.prompted(served, inputs.texts, inputs.prompt_name, inputs.prompt)
            encodings = list(
                await served.tokens.encode(text, param="input", indexed=False, whole=chunked, token_text=chunked)
            )
        elif inputs.texts is not None:
            self.check_batch(len(inputs.texts), "input")
            texts, skip = self.prompted(served, inputs.texts, inputs.prompt_name, inputs.prompt)
            encodings = list(await served.tokens.encode(texts, param="input", whole=chunked, token_text=chunked))
        else:
            rows = inputs.ids or []
            self.check_batch(len(rows), "input")
            check_token_ids(model.tokenizer, rows, "input", bare=inputs.one)
            encodings = [model.tokenizer.from_ids(row) for row in rows]
        spec = EmbeddingSpec(layer=model.config.n_layers, pooling=model.pooling.mode, normalize=True, skip=skip)
        counted: Sequence[TokenSequence] = encodings
        texts_given = [e for e in encodings if isinstance(e, Encoding)]
        if inputs.chunk_overlap is not None and len(texts_given) == len(encodings):  # token ids go as they are
            self.check_unprompted(served, inputs.prompt_name, inputs.prompt)
            overlap = inputs.chunk_overlap
            sentences, counted = await self.chunked(served, texts_given, spec, overlap, "input")
        else:
            results = await served.queue.run(Task("embed", encodings, spec))
            sentences = sentence_rows(results)  # (B, D)
        if inputs.dimensions is not None:
            sentences = keep_dimensions(sentences, inputs.dimensions)
        return Embedded(served.name, sentences, encodings, [None] * len(encodings), tokens_in(counted))

    async def late_chunks(self, served: ServedModel, request: LateChunksRequest) -> Chunked:
        """Late chunking: one pass over the whole text (in windows overlapping by half where it is longer than the
        model's), then each chunk the mean of the final vectors of the tokens wholly inside it."""
        model = served.card
        text = request.text
        (encoding,) = await served.tokens.encode([text], param="text", indexed=False, whole=True)
        tokens = [
            (position, start, end)
            for position, ((start, end), special) in enumerate(zip(encoding.offsets, encoding.special_tokens_mask))
            if not special and end > start
        ]
        spans = sentence_spans(text) if request.chunks is None else [(start, end) for start, end in request.chunks]
        chunks: list[tuple[int, int, list[int]]] = []  # (start, end, token positions)
        for index, (start, end) in enumerate(spans):
            inside = [position for position, s, e in tokens if start <= s and e <= end]
            if request.chunks is None:
                if inside:
                    chunks.append((start, end, inside))
                continue
            name = f"chunks[{index}]"
            if not 0 <= start < end <= len(text):
                raise InvalidRequest(name, f"must be a span 0 <= start < end <= {len(text)} of the text")
            if any(s < end and start < e for s, e, _ in chunks):
                raise InvalidRequest(name, "overlaps another chunk")
            if not inside:
                raise InvalidRequest(name, "holds no token of the text")
            chunks.append((start, end, inside))
        if not chunks:
            raise InvalidRequest("text", "holds no chunk with a token")
        tokenizer = model.tokenizer
        overlap = tokenizer.window_content(encoding) // 2
        windows = tokenizer.windows(encoding, overlap)
        if len(windows) > self.max_batch_texts:
            raise InvalidRequest(
                "text",
                f"makes {len(windows)} windows of {tokenizer.max_tokens} tokens, at most {self.max_batch_texts} a "
                "request: send a shorter text",
            )
        lead = next((i for i, special in enumerate(encoding.special_tokens_mask) if not special), 0)
        room, step = tokenizer.window_content(encoding), max(tokenizer.window_content(encoding) - overlap, 1)
        # window w holds the content positions [lead + w × step, lead + w × step + room), at its own lead + offset
        placed: list[tuple[int, int]] = []  # each chunk's window and the first position's offset in it
        for index, (_, _, inside) in enumerate(chunks):
            first, last = inside[0], inside[-1]
            centre = (first + last) / 2
            best = None
            for w in range(len(windows)):
                low = 0 if len(windows) == 1 else lead + w * step
                high = len(encoding.ids) if len(windows) == 1 else low + room
                if low <= first and last < high:
                    margin = min(centre - low, high - centre)
                    if best is None or margin > best[0]:
                        best = (margin, w, (0 if len(windows) == 1 else lead) - low)
            if best is None:
                raise InvalidRequest(
                    f"chunks[{index}]" if request.chunks is not None else "text",
                    f"a chunk of {last - first + 1} tokens is longer than half the model's window of "
                    f"{tokenizer.max_tokens}: send shorter chunks",
                )
            placed.append((best[1], best[2]))
        spec = EmbeddingSpec(layer=model.config.n_layers, pooling="mean", normalize=False, token_vectors=True)
        results = await served.queue.run(Task("embed", windows, spec))
        embeddings = []
        for (_, _, inside), (window, shift) in zip(chunks, placed):
            vectors = results[window].tokens[[position + shift for position in inside]]  # (n, D)
            embedding = vectors.mean(axis=0)
            embeddings.append(unit_rows(embedding) if request.normalize else embedding)
        spans = [(start, end) for start, end, _ in chunks]
        return Chunked(served.name, spans, embeddings, tokens_in(windows))

    async def multi_vector(self, served: ServedModel, request: MultiVectorRequest) -> TokenVectors:
        """A multi-vector model's vectors (a ColBERT checkpoint's, BGE-M3's), with the token each is of."""
        model = served.card
        if model.multi_vector is None:
            raise ModelLacks(
                served.name, "multi-vector output (a ColBERT checkpoint, or BGE-M3's colbert_linear.pt)", "multi_vector"
            )
        self.check_batch(len(request.texts))
        sides, results, tokens = await self.late_vectors(
            served, request.texts, query=request.is_query, truncate=request.truncate
        )
        return TokenVectors(served.name, [result.vectors for result in results], list(tokens), tokens_in(sides))

    async def late_vectors(
        self,
        served: ServedModel,
        texts: Sequence[str],
        *,
        query: bool,
        truncate: bool,
        param: str = "texts",
        indexed: bool = True,
    ) -> tuple[list[SideTokens], list[MultiVectors], list[list[str]]]:
        """A multi-vector model's vectors of texts read as queries or as documents (``side_tokens``), and the token
        each vector is of (the expansion token for a query's filler)."""
        sides = await self.side_tokens(served, texts, query=query, truncate=truncate, param=param, indexed=indexed)
        late, limit = served.card.late_interaction, self.max_vectors
        floor = late.expansion.length if query and late is not None and late.expansion is not None else 0
        vectors = sum(max(len(side.ids), floor) for side in sides)  # at most: a document loses its skiplist's
        if vectors > limit:
            raise InvalidRequest(
                param,
                f"these texts would give {vectors:,} token vectors, more than the limit of {limit:,} a request: send "
                "fewer or shorter texts",
            )
        results = await served.queue.run(Task("multi_vector", sides, MultiVectorOptions(query=query)))
        tokenizer = served.card.tokenizer
        filler = (
            "" if late is None or late.expansion_id is None else tokenizer.vocabulary_entries([late.expansion_id])[0]
        )
        tokens = [
            [side.tokens[p] if p < len(side.tokens) else filler for p in result.positions.tolist()]
            for side, result in zip(sides, results, strict=True)
        ]
        return sides, list(results), tokens

    @staticmethod
    async def side_tokens(
        served: ServedModel, texts: Sequence[str], *, query: bool, truncate: bool, param: str, indexed: bool
    ) -> list[SideTokens]:
        """Texts tokenised as a multi-vector model reads them as queries (``query``) or as documents: a ColBERT
        checkpoint's side prompt before each, cut to the side's length (LateInteraction.length) as transformers
        truncates, the special tokens around kept; BGE-M3 reads both sides alike. Without ``truncate`` a text too
        long is a 422 naming it."""
        model = served.card
        late = model.late_interaction
        if late is None:
            encodings = await served.tokens.encode(texts, truncate=truncate, param=param, indexed=indexed)
            return [SideTokens(list(e.ids), list(e.type_ids), list(e.tokens)) for e in encodings]
        name = late.prompt_name(query)
        prompted = list(texts) if name is None else [model.prompts[name] + text for text in texts]
        encodings = await served.tokens.encode(prompted, param=param, indexed=indexed, whole=True)
        limit = late.length(query, model.max_tokens)
        sides = []
        for index, encoding in enumerate(encodings):
            n = len(encoding.ids)
            if n > limit and not truncate:
                where = f"{param}[{index}]" if indexed else param
                side = "query" if query else "document"
                message = f"has {n} tokens, more than the {side} maximum of {limit} (send truncate: true to cut it)"
                raise InvalidRequest(where, message)
            kept = model.tokenizer.cut(encoding, limit)
            ids, types, tokens = encoding.ids, encoding.type_ids, encoding.tokens
            sides.append(SideTokens([ids[p] for p in kept], [types[p] for p in kept], [tokens[p] for p in kept]))
        return sides

    async def sparse(self, served: ServedModel, request: SparseEncodeRequest) -> SparseEncoded:
        """A sparse model's vectors (SPLADE's, BGE-M3's): vocabulary ids and weights (and, on request, the vocabulary
        entries)."""
        model = served.card
        if model.sparse is None:
            raise ModelLacks(
                served.name,
                "sparse output (a SPLADE model's, a masked LM with SpladePooling, or BGE-M3's lexical weights)",
                "sparse",
            )
        self.check_batch(len(request.texts))
        encodings = await served.tokens.encode(
            request.texts, truncate=request.truncate, param="texts", token_text=False
        )
        options = SparseOptions(request.top_k)
        vectors = await served.queue.run(Task("sparse", encodings, options))
        weights = sum(vector.indices.size for vector in vectors)
        if weights > self.max_sparse_weights:
            raise InvalidRequest(
                "texts",
                f"these texts' sparse vectors hold {weights:,} non-zero weights, more than the limit of "
                f"{self.max_sparse_weights:,} a request: send fewer texts, or top_k to keep each text's largest",
            )
        entries = None
        if request.return_tokens:
            entries = [model.tokenizer.vocabulary_entries(vector.indices.tolist()) for vector in vectors]
        return SparseEncoded(served.name, list(vectors), entries, tokens_in(encodings))

    async def tokenize(self, served: ServedModel, request: TokenizeRequest) -> Tokenised:
        """The texts (or pairs) tokenised; nothing is computed."""
        self.check_batch(len(request.texts))
        pairs = second_segments(request.texts, request.text_pair)
        encodings = await served.tokens.encode(request.texts, pairs, truncate=request.truncate, param="texts")
        return Tokenised(served.name, list(encodings))
