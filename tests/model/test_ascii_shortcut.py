"""BERT tokenizers' shortcut for plain ASCII text (model/spec/ascii_shortcut.py): the ids, segments and special marks
of transformers' tokenizer and of the tokenizers library's whole pipeline, for texts that take it and texts that
must not."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, normalizers

from model import TextEncoder
from model.spec.ascii_shortcut import AsciiShortcut
from model.spec.tokenizer import TextTokenizer

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
