"""Request and response bodies: the HTTP contract of API.md, with limits and examples for /docs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from tokenizers import Encoding

from app.errors import EntryError
from model import Pooling, TextTokenizer


def blank(text: str) -> bool:
    """Empty, or whitespace alone: no token of its own for the tokenizer, so nothing to embed (API.md, "Texts")."""
    return not text or text.isspace()


def _text(text: str) -> str:
    """A text the tokenizer can take: not empty nor whitespace alone, and valid Unicode (JSON's \\ud800 escapes
    allow lone surrogates, which no UTF-8 tokenizer accepts)."""
    if blank(text):
        raise ValueError("must not be empty" if not text else "must not be empty: it holds whitespace alone")
    return _unicode(text)


def _unicode(text: str) -> str:
    """Valid Unicode: no lone surrogate."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"is not valid Unicode: character {error.start} is a lone surrogate "
                f"(U+{ord(text[error.start]):04X}); send well-formed text"
            ) from None
    return text


def _one_or_many(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ValueError("must be a string or a list of strings")
    return value


Text = Annotated[str, AfterValidator(_text)]
Prompt = Annotated[str, AfterValidator(_unicode)]  # may be empty, as sentence-transformers' document prompts are


def _entries(value: list[Any], check: Any) -> None:
    """Apply ``check`` to each entry; an error names the entry (``input[1]``, or ``input[1][0]`` within it)."""
    for index, item in enumerate(value):
        try:
            check(item)
        except EntryError as error:
            raise EntryError((index, *error.path), error.problem) from None
        except ValueError as error:
            raise EntryError((index,), str(error)) from None


def _text_or_none(item: Any) -> None:
    if item is not None:
        if not isinstance(item, str):
            raise ValueError("must be a string or null")
        _text(item)


def _second_segments(value: Any) -> Any:
    """text_pair: null, one text for every text, or one text (or null) per text."""
    if value is None:
        return value
    if isinstance(value, str):
        return _text(value)
    if not isinstance(value, list):
        raise ValueError("must be a string, a list of strings (or nulls), or null")
    _entries(value, _text_or_none)
    return value


def _token_id(item: Any) -> None:
    if not isinstance(item, int) or isinstance(item, bool) or item < 0:
        raise ValueError(f"must be a token id (an integer ≥ 0), got {item!r}")


def _token_ids(item: Any) -> None:
    if not isinstance(item, list) or not item:
        raise ValueError("must be a non-empty list of token ids")
    _entries(item, _token_id)


def _embeddings_input(value: Any) -> Any:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids (OpenAI's input)."""
    if isinstance(value, str):
        return _text(value)
    if not isinstance(value, list) or not value:
        raise ValueError(
            "must be a string, a list of strings, a list of token ids or a list of lists of token ids, not empty"
        )
    if all(isinstance(item, str) for item in value):
        _entries(value, _text)
    elif all(isinstance(item, list) for item in value):
        _entries(value, _token_ids)
    else:
        _entries(value, _token_id)
    return value


TextsOrIds = Annotated[str | list[str] | list[int] | list[list[int]], BeforeValidator(_embeddings_input)]
TextPair = Annotated[str | list[str | None] | None, BeforeValidator(_second_segments)]
Texts = Annotated[
    list[Text],
    BeforeValidator(_one_or_many),
    Field(min_length=1),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            ],
            "description": "one text or a list of texts (1 to max_batch_texts, 256 by default), none empty",
        }
    ),
]


class Request(BaseModel):
    """Strict: a wrong type is a 422, not a silent conversion; an unknown field is a 422, not ignored."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @property
    def admitted_texts(self) -> int:
        """What admission counts this request as (ENCODER_MAX_QUEUE_TEXTS): its texts, else one. Every API's route
        that translates into this request is counted the same."""
        texts = getattr(self, "texts", None)
        return len(texts) if isinstance(texts, list) else 1


# ---- /encode ----

PROMPT_NAME = (
    "a prompt of the model's sentence-transformers config (e5's query and passage, Qwen3-Embedding's query) put "
    "before each text; the model's default prompt when null"
)
PROMPT = "a literal prompt put before each text, as sentence-transformers' encode(prompt=...); not with prompt_name"


class Chunking(Request):
    overlap: int = Field(
        0, ge=0, description="content tokens each window shares with the one before (at most half a window's content)"
    )


CHUNKING = (
    "embed a text longer than the model's window in windows of the window's length (special tokens included), "
    "each pooled alone, then their mean weighted by their tokens, normalised as the model normalises; a text "
    "that fits is embedded as without chunking. Not with a prompt or return_token_embeddings"
)
EncodingFormat = Literal["float", "base64", "binary", "ubinary"]
ENCODING_FORMAT = (
    "float: numbers; base64: little-endian float32 bytes of each vector; binary / ubinary: each vector's signs "
    "(x > 0 is 1) packed 8 to a byte, as int8 (byte - 128) or uint8 numbers, as sentence-transformers' "
    "quantize_embeddings (dimensions then a multiple of 8)"
)


class EncodeRequest(Request):
    texts: Texts
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    pooling: Pooling | None = Field(
        None,
        description="how token vectors become one sentence vector (sentence-transformers' modes); the model's own "
        "(mean for MiniLM, the last token for Qwen3-Embedding) when null",
    )
    normalize: bool = Field(True, description="L2-normalise the sentence embedding")
    layer: int = Field(-1, description="hidden state: 0 = embeddings, 1..L = output of layer l, negative from the end")
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")
    return_tokens: bool = Field(False, description="add each text's tokens")
    return_token_embeddings: bool = Field(False, description="add each text's per-token vectors (no padding rows)")
    encoding_format: EncodingFormat = Field("float", description=ENCODING_FORMAT)
    dimensions: int | None = Field(
        None, ge=1, description="keep the first `dimensions` components (Matryoshka), then L2-normalise again"
    )
    prompt_name: str | None = Field(None, description=PROMPT_NAME)
    prompt: Prompt | None = Field(None, description=PROMPT)
    chunking: Chunking | None = Field(None, description=CHUNKING)

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"texts": ["The quick brown fox.", "A lazy dog."]}]},
    )


class TokenInfo(BaseModel):
    id: int
    text: str
    start: int = Field(description="character offset where the token starts in its own segment's text")
    end: int = Field(description="character offset where the token ends (exclusive)")
    special: bool = Field(description="[CLS], [SEP] and other added tokens")


class PairTokenInfo(TokenInfo):
    segment: int = Field(description="0 for the text, 1 for text_pair")


def token_infos(encoding: Encoding) -> list[TokenInfo]:
    """A text's tokens as the native answers list them."""
    return [
        TokenInfo.model_construct(id=t.id, text=t.text, start=t.start, end=t.end, special=t.special)
        for t in TextTokenizer.tokens(encoding)
    ]


def pair_token_infos(encoding: Encoding) -> list[PairTokenInfo]:
    """A text's (or pair's) tokens with their segments, as the native answers list them."""
    return [
        PairTokenInfo.model_construct(
            id=t.id, text=t.text, start=t.start, end=t.end, special=t.special, segment=t.segment
        )
        for t in TextTokenizer.tokens(encoding)
    ]


class Embedding(BaseModel):
    index: int
    embedding: list[float] | list[int] | str = Field(
        description="floats, base64 of little-endian float32 bytes, or packed signs (binary, ubinary)"
    )
    tokens: list[TokenInfo] | None = Field(None, description="only with return_tokens")
    token_embeddings: list[list[float] | list[int] | str] | None = Field(
        None, description="only with return_token_embeddings; in the encoding_format of the embedding"
    )


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


def usage_of(tokens: int) -> dict[str, int]:
    """The tokens a request was computed on, as OpenAI counts them: a Usage's fields as a dict, in its order (orjson
    writes it natively, in a fifth of the time a model takes to be made and written)."""
    return {"prompt_tokens": tokens, "total_tokens": tokens}


# ---- /encode/late-chunks ----

Span = Annotated[list[int], Field(min_length=2, max_length=2)]


class LateChunksRequest(Request):
    text: Text
    chunks: list[Span] | None = Field(
        None,
        min_length=1,
        description="character spans [start, end) of the text; null: split after each '.', '!', '?' or newline "
        "followed by whitespace",
    )
    model: str | None = Field(None, description="a served model's name; the default model when null")
    normalize: bool = Field(True, description="L2-normalise each chunk's embedding")

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "Berlin is a city. It is the capital of Germany.", "chunks": None}]}
    )


class LateChunk(BaseModel):
    index: int
    start: int
    end: int
    embedding: list[float]


class LateChunksResponse(BaseModel):
    model: str
    data: list[LateChunk]
    usage: Usage


# ---- /encode/multi-vector ----


class MultiVectorRequest(Request):
    texts: Texts
    model: str | None = Field(None, description="a served multi-vector model's name; the default model when null")
    is_query: bool = Field(False, description="encode as queries (models that tell queries from documents)")
    encoding_format: EncodingFormat = Field("float", description=ENCODING_FORMAT)
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")


class MultiVectorEmbedding(BaseModel):
    index: int
    embeddings: list[list[float] | list[int] | str] = Field(description="one vector a token, in encoding_format")
    tokens: list[str] = Field(description="the token each vector is of")


class MultiVectorResponse(BaseModel):
    model: str
    dim: int
    data: list[MultiVectorEmbedding]
    usage: Usage


# ---- /encode/sparse ----


class SparseEncodeRequest(Request):
    texts: Texts
    model: str | None = Field(None, description="a served SPLADE model's name; the default model when null")
    top_k: int | None = Field(None, ge=1, description="keep only the largest top_k weights of each text")
    return_tokens: bool = Field(False, description="add the vocabulary entry of each index")
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")

    model_config = ConfigDict(json_schema_extra={"examples": [{"texts": ["The quick brown fox."], "top_k": 64}]})


class SparseEmbedding(BaseModel):
    index: int
    indices: list[int] = Field(description="vocabulary ids with a non-zero weight, ascending")
    values: list[float] = Field(description="their weights")
    tokens: list[str] | None = Field(None, description="only with return_tokens: the vocabulary entry of each index")


class SparseEncodeResponse(BaseModel):
    model: str
    data: list[SparseEmbedding]
    usage: Usage


class EncodeResponse(BaseModel):
    model: str
    dim: int
    data: list[Embedding]
    usage: Usage


# ---- /attention ----


class AttentionRequest(Request):
    text: Text
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    text_pair: Text | None = Field(None, description="optional second segment (sentence B)")
    layers: list[int] | None = Field(
        None, min_length=1, description="layers to return (0-based, negative from the end); all when null"
    )
    heads: list[int] | None = Field(None, min_length=1, description="heads to return (0-based); all when null")
    aggregate: Literal["none", "mean", "rollout"] = Field(
        "none",
        description="mean: average over the selected heads; rollout: attention rollout (Abnar & Zuidema 2020) "
        "up to each selected layer",
    )
    weighting: Literal["attention", "norm"] = Field(
        "attention",
        description="norm: each weight times the norm of the head's transformed value vector, ‖α_ij f_h(x_j)‖ "
        "(Kobayashi et al. 2020); rows then do not sum to 1",
    )
    level: Literal["token", "word"] = Field(
        "token",
        description="word: the tokens of one word merged, rows averaged and columns summed (Clark et al. 2019); "
        "special tokens stay alone",
    )
    decimals: int | None = Field(None, ge=0, le=8, description="round every weight to this many decimals")
    truncate: bool = Field(True, description="cut a text longer than the maximum; with false it is a 422")

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "The quick brown fox", "layers": [-1], "aggregate": "mean"}]},
    )


class Word(BaseModel):
    text: str = Field(description="the word as it appears in its segment's text; a special token's own string")
    tokens: list[int] = Field(description="positions of its tokens in token_details")


class AttentionResponse(BaseModel):
    model: str
    tokens: list[str] = Field(description="the tokens, or with level word the words, that the rows and columns are")
    token_details: list[PairTokenInfo]
    words: list[Word] | None = Field(None, description="only with level word: each word's tokens")
    layers: list[int]
    heads: list[int]
    aggregate: str
    weighting: str
    level: str
    shape: list[int] = Field(description="[layers, heads (1 when aggregated), tokens, tokens]")
    attention: list[list[list[list[float]]]] = Field(description="attention[l][h][i][j]: weight query i puts on key j")


class HeadStatisticsRequest(Request):
    texts: Texts
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"texts": ["The quick brown fox.", "It jumps over the lazy dog."]}]}
    )


class HeadStatisticsResponse(BaseModel):
    model: str
    layers: int
    heads: int
    n_texts: int
    statistics: dict[str, list[list[float | None]]] = Field(
        description="name → [layer][head]: the mean over query positions, then over the texts (API.md); entropy, "
        "distance, to_cls, to_sep, to_punctuation, to_self, to_previous, to_next"
    )


class NeuronRequest(Request):
    text: Text
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    text_pair: Text | None = Field(None, description="optional second segment (sentence B)")
    layer: int = Field(0, description="the layer (0-based, negative from the end)")
    head: int = Field(0, description="the head (0-based, negative from the end)")
    truncate: bool = Field(True, description="cut a text longer than the maximum; with false it is a 422")

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "The cat sat on the mat", "layer": 2, "head": 5}]}
    )


class NeuronResponse(BaseModel):
    model: str
    tokens: list[str]
    token_details: list[PairTokenInfo]
    layer: int = Field(description="absolute layer index")
    head: int = Field(description="absolute head index")
    scale: float = Field(
        description="what the dot products are multiplied by: 1/√Dh (Gemma: query_pre_attn_scalar^-½; DeBERTa: "
        "1/√(3 Dh))"
    )
    queries: list[list[float]] = Field(
        description="(T, Dh): the head's slice of the query projection (normed per head for Qwen3 and Gemma, rotated "
        "for rotary models)"
    )
    keys: list[list[float]] = Field(
        description="(T, Dh): its key/value head's slice of the key projection (normed and rotated likewise); query "
        "heads of one group (grouped-query attention) share it"
    )
    values: list[list[float]] = Field(description="(T, Dh): its key/value head's slice of the value projection")
    scores: list[list[float]] = Field(
        description="(T, T): scale · queries · keysᵀ, plus the position bias where the model has one, before masking "
        "and softmax"
    )
    attention: list[list[float]] = Field(description="(T, T): softmax of the masked scores; equals /attention's slice")
    context: list[list[float]] = Field(description="(T, Dh): attention · values")


# ---- /similarity ----


class SimilarityRequest(Request):
    source: Text
    texts: Texts
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    explain: bool = Field(
        False, description="add each score's source tokens × text tokens contributions, which sum to the score"
    )
    prompt_name: str | None = Field(
        None, description=PROMPT_NAME + " (a multi-vector model: its query and document prompts, always)"
    )
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"source": "A fox jumps.", "texts": ["The quick brown fox.", "A lazy dog."], "explain": True}]
        }
    )

    @property
    def admitted_texts(self) -> int:
        return len(self.texts) + 1  # the source too


class Explanation(BaseModel):
    source_tokens: list[str]
    tokens: list[str]
    contributions: list[list[float]] = Field(
        description="[i][j]: the part of the score due to source token i and text token j; they sum to the score"
    )
    method: str = Field(
        description="how the pooling's cosine splits into token pairs (docs/guide.md, Similarity explained): "
        "mean_pooling_exact (API.md's formula), weighted_mean_exact, max_pooling_component_holders, cls_token, "
        "last_token, or maxsim (a multi-vector model: each source vector's best match)"
    )


class Similarity(BaseModel):
    index: int
    score: float = Field(
        description="cosine similarity of the source's and the text's sentence embeddings; on a multi-vector model "
        "MaxSim, the source read as a query and the text as a document (as /rerank scores)"
    )
    explanation: Explanation | None = Field(None, description="only with explain")


class SimilarityResponse(BaseModel):
    model: str
    data: list[Similarity]
    usage: Usage


# ---- /positional-encoding ----


class PositionalEncodingResponse(BaseModel):
    kind: Literal["sinusoidal", "learned", "rotary", "relative"]
    length: int
    d_model: int = Field(
        description="the encoding's width; for rotary, the width of the rotated head vectors; for relative, length"
    )
    base: float | None = Field(description="the wavelength base; null for the learned table and relative buckets")
    buckets: int | None = Field(
        None, description="relative only: how many buckets there are (MPNet's buckets, DeBERTa's 2 × position_buckets)"
    )
    encoding: list[list[float]] | list[list[int]] = Field(
        description="encoding[pos][k]; for rotary, (length, d_model / 2): the angle pos / base^(2k/d_model) by "
        "which the pair of components (k, k + d_model/2) of every head's query and key is rotated at pos; for "
        "relative, (length, length): the bucket that query i and key j use (MPNet's bias row, DeBERTa's relative "
        "embedding row)"
    )


# ---- /tokenize ----


class TokenizeRequest(Request):
    texts: Texts
    model: str | None = Field(None, description="a served model's name (see /v1/models); the default model when null")
    text_pair: TextPair = Field(None, description="a second segment for every text, or one per text (null for none)")
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")


class Tokenized(BaseModel):
    index: int
    tokens: list[PairTokenInfo]


class TokenizeResponse(BaseModel):
    model: str
    data: list[Tokenized]


# ---- /rerank, /classify ----


RerankMethod = Literal["cross-encoder", "yes-no", "maxsim", "sparse-dot", "cosine"]
RERANK_METHOD = (
    "cross-encoder: the sigmoid of a classifier's one logit; yes-no: the sigmoid of logit(yes) − logit(no) at the last "
    "token of the model card's template; maxsim: over the query's vectors the best dot product with a document's, "
    "averaged (BGE-M3); sparse-dot: the dot product of the sparse vectors; cosine: the cosine of the query's and "
    "the document's embeddings"
)


EXPLAIN_SCORES = (
    "add each result's explanation: which tokens made its score (integrated gradients, as /explain with its "
    "defaults); at most ENCODER_MAX_EXPLAINED_TEXTS (16) texts"
)


class RerankRequest(Request):
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)] = Field(
        description="1 to max_batch_texts non-empty documents"
    )
    model: str | None = Field(
        None,
        description="a cross-encoder (a sequence classifier with one output), or a causal LM read for yes or no "
        "(Qwen3-Reranker)",
    )
    top_n: int | None = Field(None, ge=1, description="keep the best top_n; all when null")
    return_documents: bool = Field(False, description="add each document's text")
    raw_scores: bool = Field(False, description="the logit (for yes-no, logit(yes) − logit(no)) instead of its sigmoid")
    truncate: bool = Field(
        True,
        description="cut a pair longer than the maximum (for yes-no, the document, never the template); false: 422",
    )
    instruction: Text | None = Field(
        None,
        description="yes-no rerankers: the task in the template's <Instruct> line; 'Given a web search query, "
        "retrieve relevant passages that answer the query' when null",
    )
    method: RerankMethod | None = Field(
        None, description="how to score, one the model supports (/info's rerank is its own); the model's when null"
    )
    explain: bool = Field(False, description=EXPLAIN_SCORES)

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"query": "What is a fox?", "documents": ["A fox is an animal.", "Paris."]}]}
    )

    @property
    def admitted_texts(self) -> int:
        return len(self.documents)


class ScoreExplanation(BaseModel):
    tokens: list[str]
    attributions: list[float] = Field(description="each token's share of the score (integrated gradients)")
    score: float = Field(description="the logit explained (a yes/no reranker: yes − no)")
    baseline_score: float | None
    convergence_delta: float | None


class RerankResult(BaseModel):
    index: int = Field(description="the document's position in the request")
    relevance_score: float
    document: str | None = Field(None, description="only with return_documents")
    explanation: ScoreExplanation | None = Field(None, description="only with explain")


class RerankResponse(BaseModel):
    model: str
    method: RerankMethod = Field(description=RERANK_METHOD)
    results: list[RerankResult] = Field(description="best first")
    usage: Usage


class ClassifyRequest(Request):
    texts: Texts
    text_pair: TextPair = Field(None, description="a second segment (NLI's hypothesis) for every text, or one per text")
    model: str | None = Field(None, description="a sequence classifier")
    top_k: int | None = Field(None, ge=1, description="keep the top_k labels; all when null")
    truncate: bool = Field(True, description="cut texts longer than the maximum; with false such a text is a 422")
    raw_scores: bool = Field(False, description="the head's logits instead of the probabilities")
    explain: bool = Field(False, description=EXPLAIN_SCORES + " (of its top label)")


class LabelScore(BaseModel):
    label: str
    score: float


class Classified(BaseModel):
    index: int
    labels: list[LabelScore] = Field(description="best first")
    explanation: ScoreExplanation | None = Field(None, description="only with explain: of the top label")


class ClassifyResponse(BaseModel):
    model: str
    data: list[Classified]
    usage: Usage


class ExplainRequest(Request):
    text: Text
    text_pair: Text | None = Field(None, description="the second text: a reranker's document, NLI's hypothesis")
    model: str | None = Field(None, description="a cross-encoder, a classifier or a yes/no reranker")
    target: int | str | None = Field(
        None, description="the output explained: a label's index or name; null: the only output, or the top label"
    )
    method: Literal["integrated_gradients", "gradient_x_input"] = Field(
        "integrated_gradients", description="integrated gradients (Gauss–Legendre), or gradient × input"
    )
    steps: int = Field(50, description="integrated gradients' steps, 1 to ENCODER_MAX_EXPLAIN_STEPS (256)")
    truncate: bool = Field(True, description="cut a text (or pair) longer than the maximum; with false it is a 422")

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "Where do foxes live?", "text_pair": "Foxes live in dens."}]}
    )


class ExplainTarget(BaseModel):
    index: int
    label: str


class ExplainResponse(BaseModel):
    model: str
    target: ExplainTarget | None = Field(description="the label explained; null for a yes/no reranker's one score")
    method: str
    steps: int | None = Field(description="integrated gradients' steps; null for gradient × input")
    tokens: list[str]
    attributions: list[float] = Field(description="each token's share of the score, summed over the hidden size")
    score: float = Field(description="the explained logit at the input (a yes/no reranker: yes − no)")
    baseline_score: float | None = Field(description="the same at the baseline (integrated gradients)")
    convergence_delta: float | None = Field(
        description="sum(attributions) − (score − baseline_score): the quadrature's error (integrated gradients)"
    )
    usage: Usage


# ---- /info, /health ----


class Architecture(BaseModel):
    layers: int
    heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    position_embedding: str
    family: str = Field(description="the checkpoint's model_type: bert, roberta, …, deberta-v2, qwen3, gemma3_text")
    position_encoding: str = Field(
        description="learned, learned_offset (counted from the padding index + 1), relative_buckets, rotary, "
        "disentangled (DeBERTa's relative terms) or sinusoidal"
    )
    activation: str
    pooling: str
    normalize: bool
    attention: Literal["bidirectional", "causal"] = Field(
        description="causal: query i sees keys j ≤ i (the decoders, unless their config makes them bidirectional)"
    )
    kv_heads: int = Field(description="key/value heads; fewer than heads under grouped-query attention")
    head_dim: int = Field(description="the width of one head's query, key and value")
    norm: Literal["layernorm", "rmsnorm"]
    sliding_window: int | None = Field(description="the config's sliding window, where some layers have one")
    local_layers: list[int] = Field(description="the layers (0-based) that attend within the sliding window")
    dimension: int = Field(description="the sentence embeddings' width (the last Dense module's output, else hidden)")


class Limits(BaseModel):
    max_batch_texts: int
    max_windows_per_request: int = Field(
        description="windows of the model's length a request may make: chunking's and late chunking's (a 422 beyond)"
    )
    max_tokens_per_text: int
    max_attention_tokens: int
    max_attention_values: int
    max_attention_values_binary: int
    max_head_statistics_values: int
    max_explanation_values: int
    max_vectors_per_request: int = Field(
        description="token vectors of one multi-vector request (a 422 beyond): what bounds its answer's size"
    )
    max_sparse_weights_per_request: int = Field(
        description="non-zero weights of one /encode/sparse answer, over its texts (a 422 beyond; top_k narrows)"
    )
    max_body_bytes: int
    pe_max_length: int
    pe_max_d_model: int
    pe_max_values: int
    max_queue_texts: int
    max_batch_tokens: int = Field(description="padded tokens in one forward pass of merged work, as in force")
    request_timeout_s: float


class InfoResponse(BaseModel):
    model: str
    path: str
    architecture: Architecture
    device: str
    dtype: str = Field(description="what the matrix products run in")
    weights_dtype: str = Field(
        description="what the embedding pass's weights are kept in (float32 on the CPU under a lower dtype, unless "
        "the checkpoint stores that dtype)"
    )
    explicit_weights_dtype: str = Field(
        description="what the explicit paths' weights are kept in (they compute in float32 either way)"
    )
    runtime: str = Field(
        description="what computes the embedding pass: openvino, torch (traced), torch (CUDA graphs) or torch, or "
        "openvino for one text and torch (traced) for more; the explicit paths run on torch"
    )
    rerank: RerankMethod | None = Field(description="how /rerank scores with this model, if it can")
    sparse: Literal["splade", "bge-m3"] | None = Field(
        None, description="what /encode/sparse computes with this model, if it can"
    )
    multi_vector: Literal["colbert", "bge-m3"] | None = Field(
        None, description="what /encode/multi-vector computes with this model, if it can"
    )
    limits: Limits
    auth: bool = Field(description="whether requests need an API key")
    version: str


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ErrorDetail(BaseModel):
    type: str = Field(examples=["validation_error"])
    message: str = Field(examples=["texts[3]: must not be empty"])
    param: str | None = Field(None, examples=["texts[3]"])


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_responses(shape: type[BaseModel], descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A router's error answers for the OpenAPI document: each status, its body's shape and what it means."""
    return {status: {"model": shape, "description": description} for status, description in descriptions.items()}


ERROR_DESCRIPTIONS = {
    401: "missing or wrong API key",
    404: "no model of that name (model_not_found)",
    413: "request body larger than the limit",
    422: "invalid input",
    429: "overloaded: retry after the Retry-After header's seconds",
    503: "not ready (model loading, shutting down), timed out in the queue, or the model failed on this request",
}
ERROR_RESPONSES = error_responses(ErrorResponse, ERROR_DESCRIPTIONS)


@dataclass(frozen=True)
class Reply:
    """What a service returns: a typed response and how many numbers it holds (large ones are
    serialised off the event loop)."""

    body: Any  # a response model, its fields as a dict (/encode's, /v1/embeddings'), or another API's JSON value
    n_values: int = 0
    archive: dict[str, Any] | None = None  # arrays to answer as a NumPy .npz archive instead of the JSON body
