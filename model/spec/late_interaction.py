"""Late interaction (ColBERT): one vector per token, scored by MaxSim between a query's vectors and a document's.

A ColBERT checkpoint is a directory that sentence-transformers' ``MultiVectorEncoder`` loads: its own saves (the
modules Transformer, Dense on each token vector, MultiVectorMask, Normalize; the lengths and the query expansion in
the Transformer's ``sentence_bert_config.json``), or PyLate's (≤ 3: the modules Transformer and Dense; the prefixes,
lengths and expansion flags in ``config_sentence_transformers.json``, punctuation left out of documents, vectors
normalised). A text becomes the vectors of its scored tokens:

- a query: the "query" prompt before it, cut to the query length; with query expansion, filled up to the expansion
  length with the expansion token (the mask token), whose positions are scored even where the encoder's attention
  does not see them;
- a document: the document prompt before it, cut to the document length; the skiplist's tokens (punctuation) are
  not scored.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from model.spec.checkpoint import DenseSpec, read_json, st_config, st_modules

EXPANSION_KEYS = frozenset({"strategy", "attend", "token", "length"})
DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # encode_document's prompt: the first of these it has


@dataclass(frozen=True)
class QueryExpansion:
    """ColBERT's query expansion: a query of fewer than ``length`` tokens is filled up to it with ``token`` (the
    tokenizer's mask token when None); ``fixed`` also cuts a longer one to it. ``attend``: whether the encoder's
    attention sees the filler (else only MaxSim does)."""

    strategy: Literal["fixed", "min"]
    length: int
    attend: bool = False
    token: str | None = None

    @classmethod
    def read(cls, value: Any, where: Path) -> QueryExpansion | None:
        """sentence-transformers' ``query_expansion`` dict (None: off); ValueError for what it would refuse."""
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) - EXPANSION_KEYS:
            raise ValueError(f"{where}: query_expansion must be an object of {', '.join(sorted(EXPANSION_KEYS))}")
        strategy, length = value.get("strategy"), value.get("length")
        if strategy not in ("fixed", "min"):
            raise ValueError(f"{where}: query_expansion strategy must be 'fixed' or 'min', got {strategy!r}")
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"{where}: query_expansion length must be a positive integer, got {length!r}")
        attend, token = value.get("attend", False), value.get("token")
        if not isinstance(attend, bool) or not (token is None or isinstance(token, str)):
            raise ValueError(f"{where}: query_expansion attend must be a bool and token a string or null")
        return cls(strategy, length, attend, token)


@dataclass(frozen=True)
class LateInteraction:
    """How a ColBERT checkpoint makes and scores its vectors (see the module's docstring); ``skip_ids`` and
    ``expansion_id`` are resolved with the tokenizer (``resolved``)."""

    dense: tuple[DenseSpec, ...]  # the projections of each token vector, in order
    normalize: bool = True  # L2-normalise each vector
    query_length: int | None = None  # the longest query, special tokens included (the model's maximum when None)
    document_length: int | None = None
    expansion: QueryExpansion | None = None
    skiplist: tuple[str, ...] = ()  # tokens not scored ...
    skiplist_tasks: tuple[str, ...] = ("document",)  # ... on these sides
    mean: bool = False  # MaxSim averaged over the query's vectors (meanmaxsim) rather than summed
    prompts: dict[str, str] = field(default_factory=dict)  # the prompts, PyLate's prefixes before them
    prefixes: tuple[str, ...] = ()  # PyLate's prefix tokens ([unused0]), kept whole by the tokenizer
    skip_ids: frozenset[int] = frozenset()
    expansion_id: int | None = None

    def length(self, query: bool, maximum: int) -> int:
        """The longest text of a side, special tokens included: a fixed expansion's length for queries, else the
        side's length, never beyond the model's ``maximum``."""
        side: int | None
        if query and self.expansion is not None and self.expansion.strategy == "fixed":
            side = self.expansion.length
        else:
            side = self.query_length if query else self.document_length
        return min(side or maximum, maximum)

    def skips(self, query: bool) -> bool:
        """Whether the skiplist applies to this side."""
        return bool(self.skip_ids) and ("query" if query else "document") in self.skiplist_tasks

    def prompt_name(self, query: bool) -> str | None:
        """The prompt a side takes: "query" for queries, the first of DOCUMENT_PROMPTS for documents."""
        names = ("query",) if query else DOCUMENT_PROMPTS
        return next((name for name in names if name in self.prompts), None)


def read_late_interaction(model_dir: Path) -> LateInteraction | None:
    """The directory's ColBERT layout (see the module's docstring), None where it is not one; ValueError naming
    what is not served."""
    model_dir = Path(model_dir)
    st = st_config(model_dir)
    modules = st_modules(model_dir)
    pylate = st.get("model_type") == "ColBERT"  # PyLate ≤ 3: the knobs at the top level, no mask module
    if not pylate and st.get("model_type") != "MultiVectorEncoder" and all(k != "MultiVectorMask" for k, _ in modules):
        return None
    transformer = next((path for kind, path in modules if kind == "Transformer"), "")
    bert_config_path = model_dir / transformer / "sentence_bert_config.json"
    saved = read_json(bert_config_path) if bert_config_path.is_file() else {}
    knobs = {**legacy_knobs(st), **saved}  # the module's own values win
    dense = tuple(DenseSpec.read(model_dir / path, tokens=True) for kind, path in modules if kind == "Dense")
    mask_paths = [path for kind, path in modules if kind == "MultiVectorMask"]
    mask: dict[str, Any] = {}
    if mask_paths and (model_dir / mask_paths[0] / "config.json").is_file():
        mask = read_json(model_dir / mask_paths[0] / "config.json")
    if mask.get("keep_only_token_ids"):
        raise ValueError(f"{model_dir}: keep_only_token_ids (image-patch documents) is not served")
    words = mask.get("skiplist_words") if mask_paths else st.get("skiplist_words")
    if words is None and pylate:
        words = list(string.punctuation)  # PyLate's default
    tasks = mask.get("skiplist_tasks") or ["document"]
    tasks = [tasks] if isinstance(tasks, str) else tasks
    prompts = dict(st.get("prompts") or {})
    prefixes = []
    for prefix_key, prompt_key in (("query_prefix", "query"), ("document_prefix", "document")):
        if prefix_key in st:
            prefix = st[prefix_key] or ""
            prefixes.append(prefix)
            prompts[prompt_key] = prefix + (prompts.get(prompt_key) or "").removeprefix(prefix)
    expansion = QueryExpansion.read(knobs.get("query_expansion"), bert_config_path)
    query_length = knobs.get("query_length")
    if expansion is not None and query_length is not None and query_length < expansion.length:
        raise ValueError(f"{model_dir}: query_length {query_length} is below query_expansion's {expansion.length}")
    similarity = st.get("similarity_fn_name")
    return LateInteraction(
        dense=dense,
        normalize=pylate or any(kind == "Normalize" for kind, _ in modules),
        query_length=query_length,
        document_length=knobs.get("document_length"),
        expansion=expansion,
        skiplist=tuple(str(word) for word in words or ()),
        skiplist_tasks=tuple(str(task) for task in tasks),
        mean=similarity == "meanmaxsim",
        prompts=prompts,
        prefixes=tuple(prefix for prefix in prefixes if prefix.strip()),
    )


def legacy_knobs(st: dict[str, Any]) -> dict[str, Any]:
    """PyLate's top-level lengths and expansion flags as the Transformer module's keys, as sentence-transformers
    translates them: expansion on (fixed, to ``query_length`` or 32) unless ``do_query_expansion`` is false."""
    knobs = {key: st[key] for key in ("query_length", "document_length") if st.get(key) is not None}
    if "query_expansion" in st:
        knobs["query_expansion"] = st["query_expansion"]
        return knobs
    markers: tuple[str, ...] = ("query_length", "document_length", "do_query_expansion", "query_prefix")
    markers += ("attend_to_expansion_tokens", "attend_to_mask_tokens", "document_prefix", "skiplist_words")
    if not any(key in st for key in markers):
        return knobs
    if st.get("do_query_expansion") is False:
        knobs["query_expansion"] = None
    else:
        attend = st.get("attend_to_expansion_tokens", st.get("attend_to_mask_tokens"))
        length = knobs.pop("query_length", None) or 32
        knobs["query_expansion"] = {"strategy": "fixed", "attend": bool(attend), "length": length}
    return knobs


def maxsim(query: np.ndarray, document: np.ndarray, mean: bool = False) -> float:
    """MaxSim: for each of the query's vectors (q, D) the largest dot product with one of the document's (d, D),
    summed, or with ``mean`` averaged over the query's vectors; 0 where either side has none."""
    if len(query) == 0 or len(document) == 0:
        return 0.0
    best = (query @ document.T).max(axis=1)  # (q,)
    return float(best.mean() if mean else best.sum())
