"""Tiny random-weight checkpoints of the families beyond BERT (the encoders, DeBERTa and the decoders), each a
complete Hugging Face-layout directory: config.json, model.safetensors, the family's own kind of tokenizer.json
with its tokenizer config, and the sentence-transformers files."""

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

ENCODERS: tuple[str, ...] = ("roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "electra", "modernbert")
# The decoders, each as its published embedders configure it; embeddinggemma is Gemma 3 made bidirectional.
DECODERS: tuple[str, ...] = ("qwen2", "qwen3", "llama", "mistral", "gemma3_text", "embeddinggemma", "qwen3-reranker")
FAMILIES: tuple[str, ...] = (*ENCODERS, "deberta-v2", *DECODERS)
HEADS: tuple[str | None, ...] = (None, "sequence-classification", "masked-lm", "causal-lm")
POOLINGS: tuple[str, ...] = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")
# The template's tokens: Qwen's chat markers, its reasoning tags, and the reranker's two answers.
QWEN_TOKENS: tuple[str, ...] = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
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
    heads: tuple[str | None, ...] = (None, "sequence-classification", "masked-lm")  # the checkpoints it comes as
    pooling: str = "mean"  # its embedders' sentence-transformers pooling
    prompts: dict[str, str] = field(default_factory=dict)  # its embedders' prompts
    dense: tuple[int, ...] = ()  # widths of its embedders' Dense modules after pooling (EmbeddingGemma's)
    config_pad: bool = True  # config.json names the padding token (Llama's and Mistral's do not: their tokenizers do)


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

DECODER_HEADS: tuple[str | None, ...] = (None, "sequence-classification", "causal-lm")
DECODER_CONFIG: dict[str, Any] = {
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "max_position_embeddings": MAX_LENGTH,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
}
QWEN_SPECIALS = {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
}
GEMMA_SPECIALS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}
GEMMA_CONFIG: dict[str, Any] = {
    **DECODER_CONFIG,
    "num_key_value_heads": 1,
    "head_dim": 8,  # wider than hidden_size / heads
    "query_pre_attn_scalar": 8,
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 6,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}

FAMILY_SPECS.update(
    {
        "deberta-v2": Family(
            "deberta-v2",
            "DebertaV2",
            "PreTrainedTokenizerFast",
            {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"},
            {
                **SMALL,
                "max_position_embeddings": MAX_LENGTH,
                "type_vocab_size": 0,
                "layer_norm_eps": 1e-7,
                "relative_attention": True,
                "position_buckets": 8,  # log buckets beyond 4 tokens apart, within the sample texts
                "max_relative_positions": MAX_LENGTH,
                "pos_att_type": ["p2c", "c2p"],
                "share_att_key": True,
                "norm_rel_ebd": "layer_norm",
                "position_biased_input": False,
                "pooler_hidden_size": 16,
                "pooler_hidden_act": "gelu",
            },
        ),
        "qwen2": Family(  # gte-Qwen2: grouped-query attention, q/k/v biases, a sliding window on the upper layer
            "qwen2",
            "Qwen2",
            "PreTrainedTokenizerFast",
            QWEN_SPECIALS,
            {
                **DECODER_CONFIG,
                "num_key_value_heads": 2,
                "rope_theta": 1_000_000.0,  # the older field, not rope_parameters
                "use_sliding_window": True,
                "sliding_window": 6,
                "max_window_layers": 1,  # layer 1 attends within the window
            },
            heads=DECODER_HEADS,
            pooling="lasttoken",
        ),
        "qwen3": Family(  # Qwen3-Embedding and Qwen3-Reranker: per-head q/k norms, Dh ≠ D / H, a tied LM head
            "qwen3",
            "Qwen3",
            "PreTrainedTokenizerFast",
            QWEN_SPECIALS,
            {
                **DECODER_CONFIG,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "rope_theta": 1_000_000.0,
                "tie_word_embeddings": True,
            },
            tokenizer_options={"padding_side": "left"},
            heads=DECODER_HEADS,
            pooling="lasttoken",
            prompts=QWEN3_PROMPTS,
        ),
        "qwen3-reranker": Family(  # Qwen3-Reranker: a causal LM read for yes or no; its tokenizer adds no token
            "qwen3",
            "Qwen3",
            "PreTrainedTokenizerFast",
            QWEN_SPECIALS,
            {
                **DECODER_CONFIG,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "rope_theta": 1_000_000.0,
                "tie_word_embeddings": True,
                "max_position_embeddings": 512,  # the reranker's template alone takes ~100 of these tokens
            },
            tokenizer_options={"padding_side": "left", "model_max_length": 512},
            heads=("causal-lm",),
        ),
        "llama": Family(  # multi-query attention, biases on, llama3 rope scaling
            "llama",
            "Llama",
            "PreTrainedTokenizerFast",
            {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": "<|end_of_text|>"},
            {
                **DECODER_CONFIG,
                "num_key_value_heads": 1,
                "attention_bias": True,
                "mlp_bias": True,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8,
                },
            },
            heads=DECODER_HEADS,
            pooling="mean",
            config_pad=False,
        ),
        "mistral": Family(  # e5-mistral: every layer within a sliding window, <s> … </s>
            "mistral",
            "Mistral",
            "PreTrainedTokenizerFast",
            {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "</s>"},
            {**DECODER_CONFIG, "num_key_value_heads": 2, "sliding_window": 6},
            heads=DECODER_HEADS,
            pooling="lasttoken",
            config_pad=False,
        ),
        "gemma3_text": Family(
            "gemma3_text", "Gemma3", "PreTrainedTokenizerFast", GEMMA_SPECIALS, GEMMA_CONFIG, heads=DECODER_HEADS
        ),
        "embeddinggemma": Family(  # bidirectional, mean pooling, two Dense modules, prompts
            "gemma3_text",
            "Gemma3",
            "PreTrainedTokenizerFast",
            GEMMA_SPECIALS,
            {**GEMMA_CONFIG, "use_bidirectional_attention": True, "sliding_window": 8},
            heads=(None,),
            prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
            dense=(32, 16),
        ),
    }
)


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


def _template(single: str, pair: str, tokenizer: Tokenizer, specials: list[str]) -> processors.TemplateProcessing:
    """A post-processor writing ``single`` and ``pair`` (tokenizers' template syntax) with these special tokens."""
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(token, _id(tokenizer, token)) for token in specials]
    )


def _byte_level_bpe(specials: list[str], appended: list[str], kind: str) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2 style, no unknown token); ``appended`` specials go after the merges.

    ``kind`` is whose templates: RoBERTa's ``<s> A </s></s> B </s>``, ModernBERT's ``[CLS] A [SEP] B [SEP]``,
    Qwen's embedders' ``A <|endoftext|>`` (the end-of-text token appended), Llama 3's ``<|begin_of_text|> A``,
    or none at all (``plain``: Qwen3's base tokenizer, which the reranker keeps)."""
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
    if kind == "modernbert":
        tokenizer.post_processor = _template(
            "[CLS]:0 $A:0 [SEP]:0", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", tokenizer, ["[CLS]", "[SEP]"]
        )
    elif kind == "qwen":
        eos = "<|endoftext|>"
        tokenizer.post_processor = _template(f"$A:0 {eos}:0", f"$A:0 {eos}:0 $B:1 {eos}:1", tokenizer, [eos])
    elif kind == "plain":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    elif kind == "llama":
        bos = "<|begin_of_text|>"
        tokenizer.post_processor = _template(f"{bos}:0 $A:0", f"{bos}:0 $A:0 {bos}:1 $B:1", tokenizer, [bos])
    else:
        sep_id, cls_id = _id(tokenizer, "</s>"), _id(tokenizer, "<s>")
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", sep_id), ("<s>", cls_id), trim_offsets=True, add_prefix_space=False
        )
    return tokenizer


def _unigram(specials: list[str], single: str, pair: str, template_tokens: list[str], mask: str | None) -> Tokenizer:
    """A SentencePiece-like Unigram tokenizer (``▁`` metaspace, case kept, no byte fallback) with the family's
    templates (XLM-R's ``<s> A </s></s> B </s>``, DeBERTa's, Gemma's, Mistral's); ``mask`` is the last piece.

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
    vocab = [(token, 0.0) for token in specials] + ranked + ([(mask, 0.0)] if mask else [])
    tokenizer = Tokenizer(
        models.Unigram(
            vocab, unk_id=next(i for i, t in enumerate(specials) if t in ("<unk>", "[UNK]")), byte_fallback=False
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    tokenizer.post_processor = _template(single, pair, tokenizer, template_tokens)
    return tokenizer


XLMR_TEMPLATES = ("<s> $A </s>", "<s> $A </s> </s> $B </s>", ["<s>", "</s>"])


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
        tokenizer = _byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>"], ["<mask>"], "roberta")
    elif family == "modernbert":
        appended = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        tokenizer = _byte_level_bpe(["<|endoftext|>"], appended, "modernbert")
    elif family == "xlm-roberta":
        tokenizer = _unigram(["<s>", "<pad>", "</s>", "<unk>"], *XLMR_TEMPLATES, "<mask>")
    elif family == "camembert":
        # CamemBERT's fairseq layout: <s> and </s> are ids 5 and 6, the NOTUSED ones 0 and 2
        specials = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>"]
        tokenizer = _unigram(specials, *XLMR_TEMPLATES, "<mask>")
    elif family == "deberta-v2":  # DeBERTa-v3's SentencePiece vocabulary: [PAD] [CLS] [SEP] [UNK] first
        pair = "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"
        tokenizer = _unigram(["[PAD]", "[CLS]", "[SEP]", "[UNK]"], "[CLS] $A [SEP]", pair, ["[CLS]", "[SEP]"], "[MASK]")
    elif family in ("qwen2", "qwen3", "qwen3-reranker"):  # the reranker's answers are plain vocabulary tokens
        kind = "plain" if family == "qwen3-reranker" else "qwen"
        tokenizer = _byte_level_bpe(["<|endoftext|>", *QWEN_TOKENS[:2]], ["yes", "no"], kind)
        tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in QWEN_TOKENS[2:]])
    elif family == "llama":
        tokenizer = _byte_level_bpe(["<|begin_of_text|>", "<|end_of_text|>"], ["yes", "no"], "llama")
    elif family == "mistral":  # e5-mistral: <s> first, </s> appended
        tokenizer = _unigram(["<unk>", "<s>", "</s>"], "<s> $A </s>", "<s> $A </s> $B:1 </s>:1", ["<s>", "</s>"], None)
    elif family in ("gemma3_text", "embeddinggemma"):  # EmbeddingGemma: <bos> first, <eos> appended
        specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
        tokenizer = _unigram(specials, "<bos> $A <eos>", "<bos> $A <eos> $B:1 <eos>:1", ["<bos>", "<eos>"], None)
        tokenizer = _add_to_vocab(tokenizer, ["yes", "no"])  # the reranker's answers
    else:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    roles = FAMILY_SPECS[family].specials
    mask = roles.get("mask")
    others = [token for role, token in roles.items() if role != "mask"]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in dict.fromkeys(others)])
    if mask is not None:
        # the mask token takes the space before it, as in the real checkpoints (BERT's [MASK] does not)
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
    if "mask" in spec.specials:
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
        "model_max_length": MAX_LENGTH,
        **spec.tokenizer_options,
        "model_input_names": list(spec.model_input_names),  # no token_type_ids but for ELECTRA
        "added_tokens_decoder": _added_tokens_decoder(tokenizer),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2, ensure_ascii=False))


# ---- sentence-transformers files ----


def _write_sentence_transformers(directory: Path, family: str, dimension: int, pooling: str, seed: int) -> None:
    """modules.json (Transformer, Pooling, the family's Dense modules, Normalize where it has Dense modules or is a
    decoder), sentence_bert_config.json, config_sentence_transformers.json with its prompts, and each module's
    folder. The encoders' Pooling as their published checkpoints write it (the boolean flags), the newer
    families' as sentence-transformers writes it now (``pooling_mode``); Dense modules by sentence-transformers."""
    import sentence_transformers
    import transformers
    from sentence_transformers.base.modules import Dense

    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    spec = FAMILY_SPECS[family]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    torch.manual_seed(seed + 1)
    width = dimension
    for out_features in spec.dense:
        path = f"{len(modules)}_Dense"
        (directory / path).mkdir(exist_ok=True)
        Dense(width, out_features, bias=False, activation_function=torch.nn.Identity()).save(str(directory / path))
        modules.append(
            {"idx": len(modules), "name": str(len(modules)), "path": path, "type": f"{Dense.__module__}.Dense"}
        )
        width = out_features
    if spec.dense or family in DECODERS:
        path = f"{len(modules)}_Normalize"
        (directory / path).mkdir(exist_ok=True)
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": path,
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, indent=2)
    )
    versions = {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "pytorch": torch.__version__,
    }
    st_config = {
        "__version__": versions,
        "prompts": dict(spec.prompts),
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    if family in ENCODERS:
        flags: dict[str, Any] = {
            "word_embedding_dimension": dimension,
            **{flag: pooling == mode for flag, mode in ST_POOLING_FLAGS.items()},
            "include_prompt": True,
        }
    else:
        flags = {"embedding_dimension": dimension, "pooling_mode": pooling, "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(flags, indent=2))


ST_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


# ---- the model ----


def family_config(family: str, tokenizer: Tokenizer, **config_overrides: Any) -> dict[str, Any]:
    """config.json as the family's published checkpoints write it: sizes, special token ids, vocab_size."""
    spec = FAMILY_SPECS[family]
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {role: _id(tokenizer, token) for role, token in spec.specials.items()}
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [f"{spec.class_stem}{'TextModel' if spec.model_type == 'gemma3_text' else 'Model'}"],
        "vocab_size": math.ceil(size / spec.vocab_multiple) * spec.vocab_multiple,
        **spec.config,
    }
    if spec.config_pad:  # Llama's and Mistral's configs name no padding token
        config["pad_token_id"] = ids["pad"]
    if "bos" in ids:
        config["bos_token_id"] = ids["bos"]
    if "eos" in ids:
        config["eos_token_id"] = ids["eos"]
    if family == "modernbert":
        config.update(
            bos_token_id=ids["cls"], eos_token_id=ids["sep"], cls_token_id=ids["cls"], sep_token_id=ids["sep"]
        )
    config.update(config_overrides)
    return config


def _randomize(model: torch.nn.Module, config: dict[str, Any]) -> None:
    """Random weights, not the initialiser's ones and zeros, so that every weight matters: matrices and
    embeddings from normal(0, 0.5), biases from normal(0, 0.1), norm scales from normal(1, 0.2) (Gemma's, stored
    as w − 1, from normal(0, 0.2)).

    With LayerNorm scales and biases from normal(0, 0.5) too, attention turns near uniform and the last hidden
    states nearly the same for every token. DistilBERT's sinusoidal position table stays as computed: the
    checkpoint stores it."""
    sinusoidal = bool(config.get("sinusoidal_pos_embds"))
    with torch.no_grad():
        for module_name, module in model.named_modules():
            kind = type(module).__name__
            for name, parameter in module.named_parameters(recurse=False):
                if sinusoidal and module_name.endswith("position_embeddings"):
                    continue
                if kind.endswith(("LayerNorm", "RMSNorm")) and name == "weight":
                    parameter.normal_(0.0 if kind.startswith("Gemma") else 1.0, 0.2)
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
    pooling: str | None = None,
    sinusoidal: bool = False,
    **config_overrides: Any,
) -> Path:
    """A random-weight model of ``family`` in Hugging Face layout, loadable by transformers' Auto classes and
    sentence-transformers.

    ``head``: None for the bare model (``RobertaModel``), "sequence-classification" (``num_labels`` from the
    overrides, default 2), "masked-lm" (encoders) or "causal-lm" (decoders); their tensor names carry the base
    model's prefix. ``pooling``: the sentence-transformers pooling (the family's own by default: mean, or the
    last token for Qwen's and Mistral's embedders). ``sinusoidal``: DistilBERT's fixed sinusoidal positions.
    """
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    if family not in FAMILY_SPECS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if head not in FAMILY_SPECS[family].heads:
        raise ValueError(f"{family} comes as {FAMILY_SPECS[family].heads}, not {head!r}")
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
    elif head == "causal-lm":
        config["architectures"] = [f"{spec.class_stem}ForCausalLM"]
        auto = AutoModelForCausalLM
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
    if head != "causal-lm":  # a causal LM is a reranker here, not a sentence-transformers embedder
        dimension = int(config.get("dim", config.get("hidden_size", 16)))
        _write_sentence_transformers(directory, family, dimension, pooling or spec.pooling, seed)
    return directory


def stored_in_bfloat16(directory: Path) -> Path:
    """The checkpoint at ``directory`` written again with every tensor in bfloat16, as decoders ship."""
    from safetensors.torch import load_file, save_file

    weights = load_file(directory / "model.safetensors")
    save_file({name: t.to(torch.bfloat16) for name, t in weights.items()}, directory / "model.safetensors")
    return directory


def hf_model(directory: Path) -> Any:
    """transformers' bare model (a ``PreTrainedModel``) for the directory, the base model of a head checkpoint,
    with eager attention so that it can return attention probabilities, in eval mode.

    From a head checkpoint, the pooler of RoBERTa-likes and MPNet is missing and newly initialised. In float32,
    whatever dtype the checkpoint stores."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()


if __name__ == "__main__":  # python -m tests.families: the tensor names each family and head saves
    import re
    import tempfile

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as scratch:
        for family in FAMILIES:
            for head in FAMILY_SPECS[family].heads:
                path = write_family_model(Path(scratch) / f"{family}-{head}", family, head=head)
                with safe_open(str(path / "model.safetensors"), "pt") as weights:
                    names = dict.fromkeys(re.sub(r"\.\d+\.", ".{i}.", name) for name in sorted(weights.keys()))
                print(f"{family} {head or 'bare'}: {', '.join(names)}")
