"""What a checkpoint directory says beside its weights, read without torch: sentence-transformers' modules
(modules.json, Pooling, Dense, SpladePooling, config_sentence_transformers.json) and BGE-M3's extra layers.

The services read these through the model's card (model/spec/card.py) in processes that compute nothing; the
modules that compute (model/nn/pooling.py, model/nn/heads.py) build on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from model.spec.config import DECODERS, HF_ACTIVATIONS, EncoderConfig

Pooling = Literal["mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean"]


POOLING_MODES: tuple[Pooling, ...] = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")


# sentence-transformers' 1_Pooling/config.json flags (as written before its pooling_mode key) and their modes.
ST_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


# Dense modules' activation_function values (torch classes, as sentence-transformers saves them) we run, and the
# activation (model/nn/encoder.py's ACTIVATIONS) each one is.
DENSE_ACTIVATIONS: dict[str, str] = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


# modules.json's kinds; any other is refused. MLMTransformer and SpladePooling make a SPLADE model (sparse_spec).
# MultiVectorMask makes a ColBERT model (model/spec/late_interaction.py).
KNOWN_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling", "MultiVectorMask")


# config_sentence_transformers.json's model_type of a ColBERT checkpoint: sentence-transformers', PyLate's (≤ 3)
MULTI_VECTOR_TYPES = ("MultiVectorEncoder", "ColBERT")


SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SparseSpec:
    """How a model makes sparse vectors. ``splade``: sentence-transformers' SpladePooling, over the real tokens the
    maximum or the sum of log(1 + relu(MLM logits)) for every vocabulary entry (``log1p_relu``: log1p once more).
    ``bge-m3``: BGE-M3's lexical weights, relu(sparse_linear(h)) for each token, the largest for each token id,
    the ``excluded`` ids (the tokenizer's cls, eos, pad and unk) left out."""

    kind: Literal["splade", "bge-m3"] = "splade"
    pooling: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"
    excluded: tuple[int, ...] = ()


BGE_M3_SPARSE = "sparse_linear.pt"  # BGE-M3's token-weight layer, beside its XLM-R checkpoint


BGE_M3_COLBERT = "colbert_linear.pt"  # BGE-M3's multi-vector projection


def sparse_spec(model_dir: Path, excluded: tuple[int, ...] = ()) -> SparseSpec | None:
    """The directory's sparse output: a SpladePooling module of its modules.json, or BGE-M3's sparse_linear.pt
    (``excluded``: the ids its lexical weights leave out); None where there is neither, ValueError for what is not
    served."""
    if (Path(model_dir) / BGE_M3_SPARSE).is_file():
        return SparseSpec(kind="bge-m3", excluded=excluded)
    paths = [path for kind, path in st_modules(Path(model_dir)) if kind == "SpladePooling"]
    if not paths:
        return None
    config_path = Path(model_dir) / paths[0] / "config.json"
    st = read_json(config_path) if config_path.is_file() else {}
    pooling, activation = st.get("pooling_strategy", "max"), st.get("activation_function", "relu")
    if pooling not in ("max", "sum") or activation not in SPLADE_ACTIVATIONS:
        raise ValueError(f"{config_path}: unsupported SpladePooling ({pooling!r}, {activation!r})")
    return SparseSpec("splade", pooling, activation)


@dataclass(frozen=True)
class DenseSpec:
    """A sentence-transformers Dense module as its config.json describes it (no weights)."""

    directory: Path = field(compare=False)  # where its config.json and weights are
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of DENSE_ACTIVATIONS

    @property
    def affine(self) -> bool:
        """Without an activation: the module maps a mean of vectors to the mean of their images."""
        return DENSE_ACTIVATIONS[self.activation] == "identity"

    @classmethod
    def read(cls, directory: Path, tokens: bool = False) -> DenseSpec:
        """A Dense module's config.json: on the sentence embedding, or with ``tokens`` on each token vector (a
        ColBERT projection; PyLate's configs, which name no input, project tokens); ValueError for what is not
        served."""
        st = read_json(directory / "config.json")
        wanted = "token_embeddings" if tokens else "sentence_embedding"
        if st.get("use_residual") or st.get("module_input_name", wanted) != wanted:
            on = "each token vector" if tokens else "the sentence embedding"
            raise ValueError(f"{directory}: only Dense modules on {on}, without residual, are served")
        activation = st.get("activation_function", "torch.nn.modules.activation.Tanh")  # sentence-transformers' default
        if activation not in DENSE_ACTIVATIONS:
            raise ValueError(
                f"{directory}: unsupported activation_function {activation!r} "
                f"(supported: {', '.join(DENSE_ACTIVATIONS)})"
            )
        if not (directory / "model.safetensors").is_file():
            raise ValueError(f"{directory} has no model.safetensors (weights in other formats are not read)")
        return cls(directory, int(st["in_features"]), int(st["out_features"]), bool(st.get("bias", True)), activation)


@dataclass(frozen=True)
class PoolingConfig:
    mode: Pooling = "mean"  # how token vectors become the sentence vector
    normalize: bool = True  # L2-normalise the sentence vector
    include_prompt: bool = True  # False: a prompt's tokens are left out of the pooling (sentence-transformers)
    dense: tuple[DenseSpec, ...] = ()  # the Dense modules after pooling, in order (their weights: Dense.load)

    @property
    def affine(self) -> bool:
        """Whether every Dense module is affine (none, or none with an activation)."""
        return all(spec.affine for spec in self.dense)

    def dimension(self, width: int) -> int:
        """The sentence vector's width for token vectors of ``width``: the last Dense module's output."""
        return self.dense[-1].out_features if self.dense else width

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> PoolingConfig:
        """The model's own pooling and Dense modules, from sentence-transformers' files: modules.json where there is
        one, else ``1_Pooling/config.json``, else mean pooling."""
        model_dir = Path(model_dir)
        modules = st_modules(model_dir)
        pooling_dirs = [path for kind, path in modules if kind == "Pooling"] or ["1_Pooling"]
        path = model_dir / pooling_dirs[0] / "config.json"
        mode, include_prompt = _pooling(path) if path.is_file() else ("mean", True)
        if multi_vector_layout(model_dir):  # its Dense modules project token vectors (late_interaction.py)
            return cls(mode=mode, include_prompt=include_prompt)
        dense = tuple(DenseSpec.read(model_dir / path) for kind, path in modules if kind == "Dense")
        return cls(mode=mode, include_prompt=include_prompt, dense=dense)


def st_config(model_dir: Path) -> dict[str, Any]:
    """config_sentence_transformers.json ({} where there is none)."""
    path = Path(model_dir) / "config_sentence_transformers.json"
    st = read_json(path) if path.is_file() else {}
    if not isinstance(st, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return st


def multi_vector_layout(model_dir: Path) -> bool:
    """Whether the directory is a ColBERT checkpoint as sentence-transformers' MultiVectorEncoder or PyLate saves
    it: its model_type says so, or its modules include a MultiVectorMask."""
    if st_config(model_dir).get("model_type") in MULTI_VECTOR_TYPES:
        return True
    return any(kind == "MultiVectorMask" for kind, _ in st_modules(Path(model_dir)))


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(value, dict | list):
        raise ValueError(f"{path} must hold a JSON object")
    return value  # type: ignore[return-value]


def st_modules(model_dir: Path) -> list[tuple[str, str]]:
    """modules.json's (kind, path) pairs in order: kind the class name (Transformer, Pooling, Dense, Normalize)."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return []
    entries = read_json(path)
    if not isinstance(entries, list):
        raise ValueError(f"{path} must hold a list of modules")
    modules = []
    for entry in sorted(entries, key=lambda entry: entry.get("idx", 0)):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if kind not in KNOWN_MODULES:
            raise ValueError(f"{path}: unsupported sentence-transformers module {entry.get('type')!r}")
        modules.append((kind, str(entry.get("path", ""))))
    return modules


def _pooling(path: Path) -> tuple[Pooling, bool]:
    """A Pooling module's mode and include_prompt: its ``pooling_mode`` key, or the older boolean flags."""
    st = read_json(path)
    mode = st.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        enabled = [flag for flag, value in st.items() if flag.startswith("pooling_mode_") and value]
        unsupported = [flag for flag in enabled if flag not in ST_POOLING_FLAGS]
        if unsupported:
            raise ValueError(f"{path}: unsupported pooling flags {unsupported}")
        modes = [ST_POOLING_FLAGS[flag] for flag in enabled]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        served = ", ".join(POOLING_MODES)
        raise ValueError(f"{path}: exactly one pooling mode of {served} is served, got {modes or 'none'}")
    return modes[0], bool(st.get("include_prompt", True))


HeadActivation = Literal["tanh", "gelu", "gelu_tanh", "relu", "silu"]


# What each encoder family's head does after pooling (the decoders' has no dense layer).
HEAD_ACTIVATIONS: dict[str, HeadActivation] = {
    "bert": "tanh",
    "roberta": "tanh",
    "xlm-roberta": "tanh",
    "camembert": "tanh",
    "mpnet": "tanh",
    "electra": "gelu",
    "distilbert": "relu",
}


@dataclass(frozen=True)
class HeadConfig:
    labels: tuple[str, ...]  # id2label, in id order
    multi_label: bool = False  # problem_type multi_label_classification: a sigmoid per label, not a softmax
    # the first token ([CLS], <s>); the mean (ModernBERT's option); or, as transformers scores a decoder, the last
    # token whose id is not the config's pad_token_id (the last real token where the config names none)
    pooling: Literal["first", "mean", "last"] = "first"
    activation: HeadActivation = "tanh"
    dense: bool = True  # a dense D → D layer and the activation before the output (none in the decoders)
    dense_bias: bool = True
    norm: bool = False  # ModernBERT: a LayerNorm after the activation
    out_bias: bool = True  # the decoders' ``score`` has none
    pad_token_id: int | None = None  # the decoders: which id does not count as the last token

    @classmethod
    def from_hf(cls, hf: dict[str, Any], config: EncoderConfig) -> HeadConfig | None:
        """The head of a ``…ForSequenceClassification`` config.json; None for other checkpoints."""
        architectures = hf.get("architectures") or []
        if not any(name.endswith("ForSequenceClassification") for name in architectures):
            return None
        id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(hf.get("num_labels", 2)))}
        labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
        multi_label = hf.get("problem_type") == "multi_label_classification"
        if config.family in DECODERS:
            pad_token_id = hf.get("pad_token_id")
            return cls(labels, multi_label, pooling="last", dense=False, out_bias=False, pad_token_id=pad_token_id)
        if config.family == "deberta-v2":
            if hf.get("pooler_hidden_size", config.d_model) != config.d_model:
                raise ValueError(f"unsupported config field 'pooler_hidden_size': {hf['pooler_hidden_size']!r}")
            return cls(labels, multi_label, activation=_activation(hf, "pooler_hidden_act", "gelu"))
        if config.family == "modernbert":
            pooling = hf.get("classifier_pooling", "cls")
            if pooling not in ("cls", "mean"):
                raise ValueError(f"unsupported config field 'classifier_pooling': {pooling!r} (supported: cls, mean)")
            return cls(
                labels,
                multi_label,
                pooling="first" if pooling == "cls" else "mean",
                activation=_activation(hf, "classifier_activation", "gelu"),
                dense_bias=bool(hf.get("classifier_bias", False)),
                norm=True,
            )
        return cls(labels, multi_label, activation=HEAD_ACTIVATIONS[config.family])


def _activation(hf: dict[str, Any], field: str, default: str) -> HeadActivation:
    value = hf.get(field, default)
    if value not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported config field {field!r}: {value!r}")
    return HF_ACTIVATIONS[value]


@dataclass(frozen=True)
class YesNoTemplate:
    """How a yes/no reranker reads a (query, document) pair: Qwen3-Reranker's model card template. Its prefix and
    suffix are fixed; between them the instruction, the query and the document, which alone is cut to fit."""

    prefix: str = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix: str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    instruction: str = "Given a web search query, retrieve relevant passages that answer the query"

    def head(self, instruction: str, query: str) -> str:
        """What comes before the document between the prefix and the suffix."""
        return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: "

    def formatted(self, instruction: str, query: str, document: str) -> str:
        """The whole string the model reads."""
        return self.prefix + self.head(instruction, query) + document + self.suffix


YES_NO = YesNoTemplate()
