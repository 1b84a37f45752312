"""Tiny random-weight checkpoints of the encoder families beyond BERT, each a complete Hugging Face-layout
directory: config.json, model.safetensors, the family's own kind of tokenizer.json with its tokenizer config,
and the sentence-transformers files."""

from __future__ import annotations

import collections
import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

FAMILIES: tuple[str, ...] = ("roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "electra", "modernbert")
HEADS: tuple[str | None, ...] = (None, "sequence-classification", "masked-lm")
POOLINGS: tuple[str, ...] = ("mean", "cls", "max")
SUFFIXES: tuple[str, ...] = ("s", "es", "ed", "ing", "er", "ly", "en", "ion", "al", "ow")  # subword pieces

MAX_LENGTH = 64  # the tokenizers' model_max_length; the position tables hold at least this many positions
MAX_SEQ_LENGTH = 32  # sentence-transformers' max_seq_length

# The tokenizers' vocabularies come from these sentences and the sample texts.
CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A cat sat on the mat.",
    "Hello world!",
    "Attention is all you need.",
    "What does this head look at?",
    "It looks at the next token and the previous token.",
    "Each token embedding goes through every layer of the model.",
    "Layer norm keeps the hidden states small.",
    "The encoder reads the whole sentence at once.",
    "A sentence vector is the mean of its token vectors.",
    "The first token often collects the meaning of the sentence.",
    "Position embeddings tell the model where each word is.",
    "Rotary embeddings turn queries and keys by an angle.",
    "Local attention only looks at nearby words.",
    "Global attention looks at every word in the text.",
    "The dog and the cat are friends.",
    "The fox is quick and the dog is lazy.",
    "We split words into smaller pieces.",
    "Rare words become several pieces.",
    "Padding tokens are masked out.",
    "Two texts can be read together as a pair.",
    "Is the second sentence an answer to the first one?",
    "The service returns embeddings, tokens and attention maps.",
    "Models are loaded from a directory of files.",
    "Weights are stored as safetensors.",
    "Small random models make fast tests.",
    "The brown dog jumps over the quick cat.",
    "Hello, what does the model see in this sentence?",
    "Every head of every layer looks at the tokens in its own way.",
    "The lazy cat sat on the warm mat all day.",
    "Numbers like 1, 2 and 42 are tokens too.",
    "Questions end with a question mark?",
    "This is a short text.",
    "This is a much longer text with many more words than the short one.",
    "The model reads, the model writes, the model learns.",
    "Where does the attention of the last layer go?",
    "Tokens near the start see the first token.",
    "Words far away are outside the local window.",
    "Each family has its own tokenizer and its own special tokens.",
    "The quick brown fox jumps over the lazy dog again and again.",
)

SAMPLE_TEXTS: dict[str, str | tuple[str, str]] = {
    "short": "Hello world!",
    "sentence": "The quick brown fox jumps over the lazy dog.",
    "question": "What does this head look at?",
    # 20 to 32 tokens in every family: longer than ModernBERT's local window, within max_seq_length
    "long": "The quick brown fox jumps over the lazy dog and the cat sat on the mat, hello world: attention is all.",
    "rare": "Zebras ate 3 naïve rolls in 東京.",  # pieces, an accent, characters outside the vocabularies
    "pair": ("Is the second sentence an answer to the first one?", "A cat sat on the mat."),
    "short pair": ("Hello world!", "The dog."),
}

SMALL: dict[str, Any] = {
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "hidden_act": "gelu",
    "initializer_range": 0.02,
}


@dataclass(frozen=True)
class Family:
    """What one family needs: its config, its class names, its tokenizer's kind and special tokens."""

    model_type: str
    class_stem: str  # RobertaModel, RobertaForSequenceClassification, RobertaForMaskedLM
    tokenizer_class: str
    specials: dict[str, str]  # role (bos, eos, sep, cls, unk, pad, mask) -> token
    config: dict[str, Any]  # without vocab_size and the special tokens' ids, filled from the tokenizer
    model_input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    tokenizer_options: dict[str, Any] = field(default_factory=dict)  # extra tokenizer_config.json fields
    vocab_multiple: int = 1  # the config's vocab_size is the tokenizer's size rounded up to this


ROBERTA_SPECIALS = {
    "bos": "<s>",
    "eos": "</s>",
    "sep": "</s>",
    "cls": "<s>",
    "unk": "<unk>",
    "pad": "<pad>",
    "mask": "<mask>",
}
BERT_SPECIALS = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
ROBERTA_CONFIG = {
    **SMALL,
    "max_position_embeddings": MAX_LENGTH + 2,  # positions start after padding_idx = pad_token_id = 1
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "position_embedding_type": "absolute",
}
BERT_TOKENIZER = {"do_lower_case": True, "tokenize_chinese_chars": True, "strip_accents": None}

FAMILY_SPECS: dict[str, Family] = {
    "roberta": Family(
        "roberta",
        "Roberta",
        "RobertaTokenizer",
        ROBERTA_SPECIALS,
        ROBERTA_CONFIG,
        tokenizer_options={"add_prefix_space": False, "trim_offsets": True, "errors": "replace"},
    ),
    "xlm-roberta": Family("xlm-roberta", "XLMRoberta", "XLMRobertaTokenizer", ROBERTA_SPECIALS, ROBERTA_CONFIG),
    "camembert": Family(
        "camembert",
        "Camembert",
        "CamembertTokenizer",
        ROBERTA_SPECIALS,
        ROBERTA_CONFIG,
        tokenizer_options={"additional_special_tokens": ["<s>NOTUSED", "</s>NOTUSED", "<unk>NOTUSED"]},
    ),
    "distilbert": Family(
        "distilbert",
        "DistilBert",
        "DistilBertTokenizer",
        BERT_SPECIALS,
        {
            "dim": 16,
            "n_heads": 4,
            "n_layers": 2,
            "hidden_dim": 32,
            "activation": "gelu",
            "max_position_embeddings": MAX_LENGTH,
            "sinusoidal_pos_embds": False,
            "initializer_range": 0.02,
            "tie_weights_": True,
        },
        tokenizer_options=BERT_TOKENIZER,
    ),
    "mpnet": Family(
        "mpnet",
        "MPNet",
        "MPNetTokenizer",
        {**ROBERTA_SPECIALS, "unk": "[UNK]"},
        {
            **SMALL,
            "max_position_embeddings": MAX_LENGTH + 2,  # positions start after padding_idx = 1, as RoBERTa's
            "layer_norm_eps": 1e-5,
            "relative_attention_num_buckets": 32,
        },
        tokenizer_options=BERT_TOKENIZER,
    ),
    "electra": Family(
        "electra",
        "Electra",
        "ElectraTokenizer",
        BERT_SPECIALS,
        {
            **SMALL,
            "embedding_size": 8,  # smaller than hidden_size: the embeddings go through embeddings_project
            "max_position_embeddings": MAX_LENGTH,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "position_embedding_type": "absolute",
        },
        model_input_names=("input_ids", "token_type_ids", "attention_mask"),
        tokenizer_options=BERT_TOKENIZER,
    ),
    "modernbert": Family(
        "modernbert",
        "ModernBert",
        "PreTrainedTokenizerFast",
        {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"},
        {
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "intermediate_size": 32,
            "hidden_activation": "gelu",
            "max_position_embeddings": MAX_LENGTH,
            "global_attn_every_n_layers": 2,  # layers 0 and 2 global, layer 1 local
            "local_attention": 8,  # the whole window: a local layer sees 4 tokens each side
            "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0,
            "norm_eps": 1e-5,
            "norm_bias": False,
            "attention_bias": False,
            "mlp_bias": False,
            "classifier_pooling": "mean",
            "classifier_activation": "gelu",
            "classifier_bias": False,
            "decoder_bias": True,
            "initializer_range": 0.02,
        },
        tokenizer_options={"clean_up_tokenization_spaces": True},
        vocab_multiple=64,  # as ModernBERT's 50368 embedding rows for its 50280 + specials tokens
    ),
}


# ---- tokenizers ----


def _training_texts() -> list[str]:
    """CORPUS and, three times each, the sample texts but the rare one: their words become whole tokens."""
    samples = [
        part
        for key, text in SAMPLE_TEXTS.items()
        if key != "rare"
        for part in (text if isinstance(text, tuple) else (text,))
    ]
    return list(CORPUS) + samples * 3


def _alphabet() -> list[str]:
    """Letters, digits and punctuation: every text of them tokenises without the unknown token."""
    return [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?;:'\"-()")


def _word_counts(lowercase: bool) -> list[tuple[str, int]]:
    """The words of the training texts seen at least twice, punctuation split off, most frequent first."""
    counts: collections.Counter[str] = collections.Counter()
    for text in _training_texts():
        counts.update(re.findall(r"\w+", text.lower() if lowercase else text))
    return sorted(((word, count) for word, count in counts.items() if count >= 2), key=lambda item: (-item[1], item[0]))


def _id(tokenizer: Tokenizer, token: str) -> int:
    """The token's id; it must be in the vocabulary."""
    index = tokenizer.token_to_id(token)
    assert index is not None, f"{token!r} is not in the vocabulary"
    return index


def _add_to_vocab(tokenizer: Tokenizer, tokens: list[str]) -> Tokenizer:
    """Append tokens to the model's own vocabulary (not only as added tokens), as real checkpoints have them."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for token in tokens:
        if isinstance(vocab, list):  # Unigram: [piece, score] pairs
            vocab.append([token, 0.0])
        else:
            vocab[token] = len(vocab)
    return Tokenizer.from_str(json.dumps(data))


def _wordpiece(specials: list[str], unk: str, cls: str, sep: str, roberta_pairs: bool) -> Tokenizer:
    """A lowercasing WordPiece tokenizer; pairs as BERT's ``[CLS] A [SEP] B [SEP]`` (type ids 0 then 1) or as
    RoBERTa's ``<s> A </s> </s> B </s>`` (type ids all 0).

    Built by hand, not trained: tokenizers' WordPiece trainer gives a different vocabulary in every process."""
    letters = _alphabet()
    pieces = [*specials, *letters, *(word for word, _ in _word_counts(lowercase=True))]
    pieces += [f"##{c}" for c in letters if c.isalnum()] + [f"##{suffix}" for suffix in SUFFIXES]
    vocab = {piece: index for index, piece in enumerate(dict.fromkeys(pieces))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    cls_id, sep_id = vocab[cls], vocab[sep]
    if roberta_pairs:
        tokenizer.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id), True, False)
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, cls_id), (sep, sep_id)],
        )
    return tokenizer


def _byte_level_bpe(specials: list[str], appended: list[str], modernbert: bool) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2 style, no unknown token); ``appended`` specials go after the merges."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(), trainer)
    tokenizer = _add_to_vocab(tokenizer, appended)
    tokenizer.decoder = decoders.ByteLevel()
    if modernbert:
        cls_id, sep_id = _id(tokenizer, "[CLS]"), _id(tokenizer, "[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0",
            pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
    else:
        sep_id, cls_id = _id(tokenizer, "</s>"), _id(tokenizer, "<s>")
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", sep_id), ("<s>", cls_id), trim_offsets=True, add_prefix_space=False
        )
    return tokenizer


def _unigram(specials: list[str], bos: str, eos: str) -> Tokenizer:
    """A SentencePiece-like Unigram tokenizer (``▁`` metaspace, case kept, no byte fallback) with XLM-R's
    templates; ``<mask>`` is the last piece.

    Built by hand, not trained: tokenizers' Unigram trainer keeps mostly letters on a few dozen sentences and
    gives a different vocabulary in every process. Words are scored by their frequency, then suffixes, then
    single characters; the pieces are sorted by score, as SentencePiece does."""
    words = _word_counts(lowercase=False)
    total = sum(count for _, count in words)
    scores = {f"▁{word}": math.log(count / total) for word, count in words}
    scores["▁"] = math.log(1 / total)
    scores.update(dict.fromkeys(SUFFIXES, -9.0))
    for character in _alphabet() + [chr(c) for c in range(ord("A"), ord("Z") + 1)]:
        scores.setdefault(character, -10.0)
    ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    vocab = [(token, 0.0) for token in specials] + ranked + [("<mask>", 0.0)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    bos_id, eos_id = _id(tokenizer, bos), _id(tokenizer, eos)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, bos_id), (eos, eos_id)],
    )
    return tokenizer


@functools.cache
def _family_tokenizer_json(family: str) -> str:
    """The family's tokenizer as tokenizer.json text, built once per process."""
    if family in ("distilbert", "electra"):
        tokenizer = _wordpiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[UNK]", "[CLS]", "[SEP]", False)
    elif family == "mpnet":
        # MPNet's vocabulary: <s> <pad> </s> <unk> first, then BERT's (whose [UNK] is the unknown token), <mask> last
        specials = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]"]
        tokenizer = _add_to_vocab(_wordpiece(specials, "[UNK]", "<s>", "</s>", True), ["<mask>"])
    elif family == "roberta":
        tokenizer = _byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>"], ["<mask>"], modernbert=False)
    elif family == "modernbert":
        appended = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        tokenizer = _byte_level_bpe(["<|endoftext|>"], appended, modernbert=True)
    elif family == "xlm-roberta":
        tokenizer = _unigram(["<s>", "<pad>", "</s>", "<unk>"], "<s>", "</s>")
    elif family == "camembert":
        # CamemBERT's fairseq layout: <s> and </s> are ids 5 and 6, the NOTUSED ones 0 and 2
        specials = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>"]
        tokenizer = _unigram(specials, "<s>", "</s>")
    else:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    mask = FAMILY_SPECS[family].specials["mask"]
    others = [token for token in FAMILY_SPECS[family].specials.values() if token != mask]
    # the mask token takes the space before it, as in the real checkpoints (BERT's [MASK] does not)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in dict.fromkeys(others)])
    lstrip = family not in ("distilbert", "electra")
    tokenizer.add_special_tokens([AddedToken(mask, lstrip=lstrip, special=True, normalized=False)])
    return tokenizer.to_str()


def family_tokenizer(family: str) -> Tokenizer:
    """The family's own kind of tokenizer (WordPiece, byte-level BPE or Unigram) over CORPUS and SAMPLE_TEXTS;
    the same in every process."""
    return Tokenizer.from_str(_family_tokenizer_json(family))


def _added_tokens_decoder(tokenizer: Tokenizer) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json's ``added_tokens_decoder``: the tokenizer's added tokens by id."""
    return {
        str(index): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for index, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }


def _write_tokenizer(directory: Path, family: str, tokenizer: Tokenizer) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json, as AutoTokenizer reads them."""
    spec = FAMILY_SPECS[family]
    tokenizer.save(str(directory / "tokenizer.json"))
    special_map: dict[str, Any] = {f"{role}_token": token for role, token in spec.specials.items()}
    special_map["mask_token"] = {
        "content": spec.specials["mask"],
        "lstrip": family not in ("distilbert", "electra"),
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }
    if "additional_special_tokens" in spec.tokenizer_options:
        special_map["additional_special_tokens"] = spec.tokenizer_options["additional_special_tokens"]
    tokenizer_config = {
        "tokenizer_class": spec.tokenizer_class,
        **{f"{role}_token": token for role, token in spec.specials.items()},
        "clean_up_tokenization_spaces": False,
        **spec.tokenizer_options,
        "model_max_length": MAX_LENGTH,
        "model_input_names": list(spec.model_input_names),  # no token_type_ids but for ELECTRA
        "added_tokens_decoder": _added_tokens_decoder(tokenizer),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2, ensure_ascii=False))


# ---- sentence-transformers files ----


def _write_sentence_transformers(directory: Path, dimension: int, pooling: str) -> None:
    """modules.json (Transformer + Pooling), sentence_bert_config.json and 1_Pooling/config.json."""
    import sentence_transformers
    import transformers

    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, indent=2)
    )
    versions = {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "pytorch": torch.__version__,
    }
    st_config = {"__version__": versions, "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    flags = {
        "word_embedding_dimension": dimension,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(flags, indent=2))


# ---- the model ----


def family_config(family: str, tokenizer: Tokenizer, **config_overrides: Any) -> dict[str, Any]:
    """config.json as the family's published checkpoints write it: sizes, special token ids, vocab_size."""
    spec = FAMILY_SPECS[family]
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {role: _id(tokenizer, token) for role, token in spec.specials.items()}
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [f"{spec.class_stem}Model"],
        "vocab_size": math.ceil(size / spec.vocab_multiple) * spec.vocab_multiple,
        **spec.config,
        "pad_token_id": ids["pad"],
    }
    if "bos" in ids:
        config.update(bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    if family == "modernbert":
        config.update(
            bos_token_id=ids["cls"], eos_token_id=ids["sep"], cls_token_id=ids["cls"], sep_token_id=ids["sep"]
        )
    config.update(config_overrides)
    return config


def _randomize(model: torch.nn.Module, config: dict[str, Any]) -> None:
    """Random weights, not the initialiser's ones and zeros, so that every weight matters: matrices and
    embeddings from normal(0, 0.5), biases from normal(0, 0.1), LayerNorm scales from normal(1, 0.2).

    With LayerNorm scales and biases from normal(0, 0.5) too, attention turns near uniform and the last hidden
    states nearly the same for every token. DistilBERT's sinusoidal position table stays as computed: the
    checkpoint stores it."""
    sinusoidal = bool(config.get("sinusoidal_pos_embds"))
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, parameter in module.named_parameters(recurse=False):
                if sinusoidal and module_name.endswith("position_embeddings"):
                    continue
                if isinstance(module, torch.nn.LayerNorm) and name == "weight":
                    parameter.normal_(1.0, 0.2)
                elif name == "bias":
                    parameter.normal_(0.0, 0.1)
                else:
                    parameter.normal_(0.0, 0.5)


def write_family_model(
    directory: Path,
    family: str,
    *,
    seed: int = 0,
    head: str | None = None,
    pooling: str = "mean",
    sinusoidal: bool = False,
    **config_overrides: Any,
) -> Path:
    """A random-weight model of ``family`` in Hugging Face layout, loadable by transformers' Auto classes and
    sentence-transformers.

    ``head``: None for the bare model (``RobertaModel``), "sequence-classification" (``num_labels`` from the
    overrides, default 2) or "masked-lm"; their tensor names carry the base model's prefix. ``pooling``: the
    sentence-transformers pooling (mean, cls or max). ``sinusoidal``: DistilBERT's fixed sinusoidal positions.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    if family not in FAMILY_SPECS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    if sinusoidal and family != "distilbert":
        raise ValueError("sinusoidal position embeddings are DistilBERT's option")
    spec = FAMILY_SPECS[family]
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = family_tokenizer(family)
    if family == "distilbert":
        config_overrides = {"sinusoidal_pos_embds": sinusoidal, **config_overrides}
    config = family_config(family, tokenizer, **config_overrides)
    auto: Any = AutoModel
    if head == "sequence-classification":
        num_labels = int(config.pop("num_labels", 2))
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
        config["architectures"] = [f"{spec.class_stem}ForSequenceClassification"]
        auto = AutoModelForSequenceClassification
    elif head == "masked-lm":
        config["architectures"] = [f"{spec.class_stem}ForMaskedLM"]
        auto = AutoModelForMaskedLM
    fields = {key: value for key, value in config.items() if key != "model_type"}
    hf_config = AutoConfig.for_model(spec.model_type, **fields)
    torch.manual_seed(seed)
    model = auto.from_config(hf_config, attn_implementation="eager")
    _randomize(model, config)
    model.save_pretrained(directory, safe_serialization=True)
    # config.json as published checkpoints have it (ModernBERT: global_attn_every_n_layers, *_rope_theta),
    # which transformers reads back into its own fields
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(directory, family, tokenizer)
    dimension = int(config.get("dim", config.get("hidden_size", 16)))
    _write_sentence_transformers(directory, dimension, pooling)
    return directory


def hf_model(directory: Path) -> Any:
    """transformers' bare model (a ``PreTrainedModel``) for the directory, the base model of a head checkpoint,
    with eager attention so that it can return attention probabilities, in eval mode.

    From a head checkpoint, the pooler of RoBERTa-likes and MPNet is missing and newly initialised."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(directory, attn_implementation="eager").eval()


if __name__ == "__main__":  # python -m tests.families: the tensor names each family and head saves
    import re
    import tempfile

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as scratch:
        for family in FAMILIES:
            for head in HEADS:
                path = write_family_model(Path(scratch) / f"{family}-{head}", family, head=head)
                with safe_open(str(path / "model.safetensors"), "pt") as weights:
                    names = dict.fromkeys(re.sub(r"\.\d+\.", ".{i}.", name) for name in sorted(weights.keys()))
                print(f"{family} {head or 'bare'}: {', '.join(names)}")
