"""BERT tokenizers' shortcut for plain ASCII text (model/spec/ascii_shortcut.py): the ids, segments and special marks
of transformers' tokenizer and of the tokenizers library's whole pipeline, for texts that take it and texts that
must not."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, normalizers, processors

from model import TextEncoder
from model.spec import ascii_shortcut
from model.spec.ascii_shortcut import AsciiShortcut
from model.spec.tokenizer import PackedTokens, TextTokenizer

# pieces that a plain text may hold, and pieces that must send a text the whole way (non-ASCII, control characters,
# added tokens in any case)
PLAIN = ["The", "QUICK", "brown", "fox's", "e-mail", "3.14", "x", "!?", "...", "(a)", "[b]", "{c}", "~`^|", "$5",
         "@home", "#tag", "a_b", "\t", "\n", "\r\n", "  ", "don't", "U.S.A.", "C++", "<p>", "\\n", "=>", "%", "*", "&",
         ";:", '"q"', "supercalifragilisticexpialidocious" * 4, "unaffable", "tokenisation"]  # fmt: skip
WHOLE = ["naïve", "café", "中文", "😀", "\x00", "\x0b", "\x0c", "\x1f", "\x7f", "[MASK]", "[mask]", "[Cls]",
         "x[SEP]y", "\u00a0", "ﬁ"]  # fmt: skip


def generated(rng: random.Random, n: int, whole_share: float = 0.03) -> list[str]:
    texts = []
    for _ in range(n):
        pieces = [
            rng.choice(WHOLE) if rng.random() < whole_share else rng.choice(PLAIN) for _ in range(rng.randint(0, 30))
        ]
        texts.append("".join(piece + rng.choice(["", " ", " ", "  "]) for piece in pieces))
    return texts


def test_plain_and_other_texts_get_transformers_ids_segments_and_special_marks(
    bundled_model: TextEncoder, hf_tokenizer
) -> None:
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(40)  # a fresh copy: its twins made here
    rng = random.Random(7)
    texts = generated(rng, 300)
    pairs = [rng.choice([None, *generated(rng, 3)]) or None for _ in texts]  # ("" as a pair: transformers, none)
    shortcut = tokenizer._shortcut
    assert shortcut is not None and shortcut.lowercase
    taken = [
        shortcut._prepared_input(text if pair is None else (text, pair)) is not None for text, pair in zip(texts, pairs)
    ]
    assert 100 < sum(taken) < 250  # both ways tried
    for truncate in (True, False):
        for special in (True, False):
            encodings = tokenizer.encode_unchecked(texts, pairs, truncate, special, token_text=False)
            for text, pair, encoding in zip(texts, pairs, encodings, strict=True):
                reference = hf_tokenizer(
                    text,
                    pair,
                    truncation="longest_first" if truncate else False,
                    max_length=40 if truncate else None,
                    add_special_tokens=special,
                    return_special_tokens_mask=True,
                )
                assert encoding.ids == reference["input_ids"], (text, pair)
                assert encoding.type_ids == reference["token_type_ids"], (text, pair)
                assert encoding.special_tokens_mask == reference["special_tokens_mask"], (text, pair)
    assert tokenizer._shortcut is shortcut and len(shortcut._twins) == 2  # the truncating copy's and the whole one's


def test_cut_at_the_start_as_the_whole_pipeline_cuts(bundled_model: TextEncoder) -> None:
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(12)
    texts = generated(random.Random(11), 120)
    fast = tokenizer.encode_unchecked(texts, left=True, token_text=False)
    whole = tokenizer.encode_unchecked(texts, left=True, token_text=True)  # the library's whole pipeline
    assert [e.ids for e in fast] == [e.ids for e in whole]
    assert max(len(e.ids) for e in fast) == 12 and fast[0].ids[0] == whole[0].ids[0] == 101


def test_a_cased_tokenizer_keeps_its_case(bundled_path) -> None:
    library = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    library.normalizer = normalizers.BertNormalizer(lowercase=False)
    library.no_padding()
    tokenizer = TextTokenizer(library, 64)
    assert tokenizer._shortcut is not None and not tokenizer._shortcut.lowercase
    texts = generated(random.Random(3), 150)
    fast = tokenizer.encode_unchecked(texts, truncate=False, token_text=False)
    whole = library.encode_batch(texts)
    assert [e.ids for e in fast] == [e.ids for e in whole]
    assert any(100 in e.ids for e in fast)  # upper-case words are [UNK] in the lower-case vocabulary, both ways
    assert [text.ids for text in tokenizer.encode_packed(texts, truncate=False)] == [e.ids for e in whole]
    assert tokenizer._words is not None and "QUICK" in tokenizer._words._kept  # kept as written, not lowered


def test_an_added_token_is_matched_as_the_whole_pipeline_matches_it(bundled_model: TextEncoder) -> None:
    tokenizer = bundled_model.card.tokenizer.with_special_tokens(["[unused0]"])
    texts = ["a [unused0] b", "A [UNUSED0] b", "[unused0]", "plain words, only."]
    assert [tokenizer._shortcut.prepared(text) for text in texts] == [None, None, None, "plain words, only."]  # type: ignore[union-attr]
    fast = tokenizer.encode_unchecked(texts, token_text=False)
    whole = tokenizer.encode_unchecked(texts, token_text=True)
    assert [e.ids for e in fast] == [e.ids for e in whole]
    assert fast[0].ids == [101, 1037, 1, 1038, 102]


@pytest.mark.parametrize(
    "normalizer",
    [normalizers.Sequence([normalizers.BertNormalizer()]), normalizers.Lowercase(), None],
    ids=["a sequence", "lower case alone", "none"],
)
def test_only_bert_normaliser_and_pre_tokenizer_take_it(bundled_path, normalizer) -> None:
    library = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    assert AsciiShortcut.of(library) is not None
    library.normalizer = normalizer
    assert AsciiShortcut.of(library) is None


def test_any_ascii_characters_get_the_whole_pipelines_ids(bundled_model: TextEncoder) -> None:
    """Strings of every ASCII character, letters and spaces the likelier, against the library's whole pipeline: runs
    of punctuation, digits among letters, every control character (each must send its text the whole way)."""
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(64)
    rng = random.Random(5)
    alphabet = [chr(c) for c in range(128)] + list("abcdefghij  ABC") * 16
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(600)]
    fast = tokenizer.encode_unchecked(texts, token_text=False)
    whole = tokenizer.encode_unchecked(texts, token_text=True)
    assert [e.ids for e in fast] == [e.ids for e in whole]
    taken = sum(tokenizer._shortcut.prepared(text) is not None for text in texts)  # type: ignore[union-attr]
    assert 100 < taken < 500  # both ways tried


def test_the_truncating_twin_is_made_at_load_not_on_the_first_request(bundled_path) -> None:
    """Making a twin takes ~18 ms: done when the tokenizer is built, a front end's first request does not pay it."""
    library = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    tokenizer = TextTokenizer(library, 64)
    shortcut = tokenizer._shortcut
    assert shortcut is not None and list(shortcut._twins) == [id(tokenizer._truncating)]
    made = shortcut._twins[id(tokenizer._truncating)]
    tokenizer.encode_unchecked(["a first request"], token_text=False)
    assert shortcut._twins == {id(tokenizer._truncating): made}  # used, not made again


# ---- texts and pairs by their words' pieces (WordPieces, TextTokenizer.encode_packed) ----


def rows_of(packed: PackedTokens) -> list[tuple[list[int], list[int]]]:
    return [(text.ids, text.type_ids) for text in packed]


@pytest.mark.parametrize("truncate", [True, False], ids=["truncated", "whole"])
@pytest.mark.parametrize("special", [True, False], ids=["special tokens", "none"])
@pytest.mark.parametrize("paired", [False, True], ids=["single", "pairs"])
def test_packed_texts_get_transformers_ids_and_segments(
    bundled_model: TextEncoder, hf_tokenizer, monkeypatch, truncate: bool, special: bool, paired: bool
) -> None:
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(40)
    rng = random.Random(13)
    texts = generated(rng, 400)
    # ("" as a pair: transformers reads none, the library an empty second segment; the library's pairs of "" are
    # held to it in test_words_pieces_for_a_fixed_template)
    pairs = [rng.choice([None, *generated(rng, 3)]) or None for _ in texts] if paired else None
    packed = tokenizer.encode_packed(texts, pairs, truncate, special)
    assert isinstance(packed, PackedTokens) and len(packed) == len(texts)
    expected = []
    for text, pair in zip(texts, pairs or [None] * len(texts)):
        reference = hf_tokenizer(
            text,
            pair,
            truncation="longest_first" if truncate else False,
            max_length=40 if truncate else None,
            add_special_tokens=special,
        )
        expected.append((reference["input_ids"], reference["token_type_ids"]))
    assert rows_of(packed) == expected
    words = tokenizer._words
    assert words is not None and len(words._kept) > 30  # the plain texts' words kept
    assert max(len(text.ids) for text in packed) > 40 or truncate  # texts longer than the limit among them
    assert any(1 in text.type_ids for text in packed) is paired
    # again, every plain text's words kept now (but the one longer than the kept ones): none asked of the library
    again = [i for i, text in enumerate(texts) if "supercalifragilistic" not in text + str(pairs and pairs[i])]
    asked = []
    monkeypatch.setattr(words, "_asking", lambda *args: asked.append(args))
    again_pairs = [pairs[i] for i in again] if pairs else None
    assert rows_of(tokenizer.encode_packed([texts[i] for i in again], again_pairs, truncate, special)) == [
        expected[i] for i in again
    ]
    assert not asked and 150 < len(again) < len(texts)


def test_packed_texts_cut_at_the_start_as_the_whole_pipeline_cuts(bundled_model: TextEncoder) -> None:
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(12)
    texts = generated(random.Random(17), 150)
    packed = tokenizer.encode_packed(texts, left=True)
    whole = tokenizer.encode_unchecked(texts, left=True, token_text=True)  # the library's whole pipeline
    assert [text.ids for text in packed] == [e.ids for e in whole]


def test_kept_words_stay_bounded_and_right_as_the_store_starts_again(bundled_model: TextEncoder, monkeypatch) -> None:
    """Words never seen twice (here random letters and digits) fill the store, which starts again at its bound;
    words longer than the kept ones' bound are asked each time. Every text's ids stay the library's."""
    monkeypatch.setattr(ascii_shortcut, "KEPT_WORDS", 64)
    tokenizer = bundled_model.card.tokenizer.with_max_tokens(512)
    words = tokenizer._words
    assert words is not None
    rng = random.Random(19)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosis" * 2  # longer than LONGEST_KEPT
    sizes = []
    for _ in range(20):
        texts = [
            " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(0, 12)))
            + f" {long_word}, the end."
            for _ in range(8)
        ]
        packed = tokenizer.encode_packed(texts)
        assert [text.ids for text in packed] == [e.ids for e in tokenizer.encode_unchecked(texts, token_text=True)]
        sizes.append(len(words._kept))
    assert max(sizes) <= 64 and min(sizes) < max(sizes)  # bounded, and started again on the way
    assert long_word not in words._kept


@pytest.mark.parametrize(
    ("single", "pair", "taken"),
    [
        ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", True),
        ("$A [SEP]", "$A [SEP] $B [SEP]", True),
        ("$A", "$A $B:1", True),
        ("[CLS]:1 $A:1 [SEP]:1", "[CLS]:1 $A:1 [SEP]:0 $B:0 [SEP]:1", True),
        ("$A [SEP] $A", "[CLS] $A [SEP] $B:1 [SEP]:1", False),
        ("[CLS] $A [SEP]", "[CLS] $B:1 [SEP] $A [SEP]", False),
    ],
    ids=["bert", "trailing only", "none", "other segments", "a text twice", "the second first"],
)
def test_words_pieces_for_a_fixed_template(bundled_path, single: str, pair: str, taken: bool) -> None:
    library = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    library.no_padding()
    library.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[("[CLS]", 101), ("[SEP]", 102)]
    )
    tokenizer = TextTokenizer(library, 512)
    assert (tokenizer._words is not None) is taken
    rng = random.Random(23)
    texts = generated(rng, 60)
    pairs = [rng.choice([None, "", *generated(rng, 3)]) for _ in texts]
    for given in (None, pairs):
        packed = tokenizer.encode_packed(texts, given)
        whole = library.encode_batch(
            texts if given is None else [t if p is None else (t, p) for t, p in zip(texts, given)]
        )
        assert rows_of(packed) == [(e.ids, e.type_ids) for e in whole]


def test_a_tokenizer_without_the_shortcut_packs_the_library_s_encodings(bundled_path) -> None:
    library = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    library.normalizer = normalizers.Lowercase()
    library.no_padding()
    tokenizer = TextTokenizer(library, 512)
    assert tokenizer._shortcut is None and tokenizer._words is None
    texts = generated(random.Random(29), 40)
    assert [text.ids for text in tokenizer.encode_packed(texts)] == [e.ids for e in library.encode_batch(texts)]
