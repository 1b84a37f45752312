"""The tokenizer wrapper against transformers' tokenizer for the same tokenizer.json."""

from __future__ import annotations

import numpy as np
import pytest

from model import PackedTokens, TextEncoder, TokenIds, TooManyTokensError

TEXTS = ["Hello, world!", "Tokenisation: naïve café, 3.14 and émigrés.", "x"]


def test_batch_ids_tokens_offsets_and_special_mask_equal_transformers(bundled_model: TextEncoder, hf_tokenizer) -> None:
    encodings = bundled_model.card.tokenizer.encode(TEXTS)
    for text, encoding in zip(TEXTS, encodings, strict=True):
        reference = hf_tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert encoding.ids == reference["input_ids"]
        assert encoding.tokens == hf_tokenizer.convert_ids_to_tokens(reference["input_ids"])
        assert [tuple(o) for o in encoding.offsets] == [tuple(o) for o in reference["offset_mapping"]]
        assert encoding.special_tokens_mask == reference["special_tokens_mask"]


def test_token_details_carry_text_spans_and_segments(bundled_model: TextEncoder) -> None:
    text, pair = "The fox", "It ran"
    tokens = bundled_model.card.tokenizer.tokens(bundled_model.card.tokenizer.encode([text], [pair])[0])
    assert [t.text for t in tokens] == ["[CLS]", "the", "fox", "[SEP]", "it", "ran", "[SEP]"]
    assert [t.segment for t in tokens] == [0, 0, 0, 0, 1, 1, 1]
    assert [t.special for t in tokens] == [True, False, False, True, False, False, True]
    for token in tokens:
        if not token.special:
            source = text if token.segment == 0 else pair
            assert source[token.start : token.end].lower() == token.text


def test_truncation_cuts_to_max_tokens_like_transformers(bundled_model: TextEncoder, hf_tokenizer) -> None:
    long_a, long_b = "alpha " * 300, "beta " * 100
    single = bundled_model.card.tokenizer.encode([long_a])[0]
    assert len(single.ids) == 256 and single.tokens[-1] == "[SEP]"
    pair = bundled_model.card.tokenizer.encode([long_a], [long_b])[0]
    reference = hf_tokenizer(long_a, long_b, truncation="longest_first", max_length=256)
    assert pair.ids == reference["input_ids"]


def test_truncate_false_names_the_text_and_its_token_count(bundled_model: TextEncoder) -> None:
    with pytest.raises(TooManyTokensError, match="text 1 has 302 tokens, more than the maximum of 256") as error:
        bundled_model.card.tokenizer.encode(["fine", "word " * 300], truncate=False)
    assert (error.value.index, error.value.n_tokens, error.value.max_tokens) == (1, 302, 256)


def test_pad_builds_right_padded_arrays(bundled_model: TextEncoder) -> None:
    encodings = bundled_model.card.tokenizer.encode(["a b c d e", "a"], [None, "b"])
    batch = bundled_model.card.tokenizer.pad(encodings)
    assert batch.input_ids.shape == batch.attention_mask.shape == batch.token_type_ids.shape == (2, 7)
    np.testing.assert_array_equal(batch.attention_mask, [[1] * 7, [1, 1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(batch.input_ids[1, 5:], [0, 0])
    np.testing.assert_array_equal(batch.token_type_ids[1], [0, 0, 0, 1, 1, 0, 0])
    assert batch.n_tokens == 12


def test_pair_count_must_match_text_count(bundled_model: TextEncoder) -> None:
    with pytest.raises(ValueError, match="2 texts but 1 pairs"):
        bundled_model.card.tokenizer.encode(["a", "b"], ["c"])


def test_without_token_text_the_ids_segments_and_special_marks_equal_transformers(
    bundled_model: TextEncoder, hf_tokenizer
) -> None:
    """The faster reading for callers that read ids only: the same ids, segments and special marks, pairs and
    truncation included; no token strings or offsets (they are not computed)."""
    texts, pairs = [*TEXTS, "alpha " * 300], ["A second segment.", None, "y", "beta " * 100]
    encodings = bundled_model.card.tokenizer.encode_unchecked(texts, pairs, token_text=False)
    for text, pair, encoding in zip(texts, pairs, encodings, strict=True):
        reference = hf_tokenizer(
            text, pair, truncation="longest_first", max_length=256, return_special_tokens_mask=True
        )
        assert encoding.ids == reference["input_ids"]
        assert encoding.type_ids == reference["token_type_ids"]
        assert encoding.special_tokens_mask == reference["special_tokens_mask"]
        assert set(encoding.offsets) == {(0, 0)}


def test_packed_tokens_give_back_each_text_as_it_was(bundled_model: TextEncoder) -> None:
    encodings = bundled_model.card.tokenizer.encode(TEXTS, [None, "a pair", None])
    packed = PackedTokens.of(encodings)
    assert len(packed) == 3 and packed.ids.dtype == np.int32 and packed.type_ids.dtype == np.int8
    assert packed.starts.tolist() == [0, *np.cumsum([len(e.ids) for e in encodings]).tolist()]
    expected = [TokenIds(e.ids, e.type_ids) for e in encodings]
    assert list(packed) == expected
    assert [packed[i] for i in range(3)] == expected and packed[-1] == expected[-1]
    tail = packed[1:]  # a slice is a pack of its own, over the same arrays
    assert isinstance(tail, PackedTokens) and list(tail) == expected[1:] and tail.starts[0] == 0
    assert np.shares_memory(tail.ids, packed.ids) and list(packed[2:1]) == [] and list(packed[::2]) == expected[::2]
    with pytest.raises(IndexError):
        packed[3]
    assert PackedTokens.of(list(packed)).ids.tolist() == packed.ids.tolist()
    empty = PackedTokens.of([])
    assert len(empty) == 0 and list(empty) == []


def test_packs_joined_pad_as_transformers_pads_the_same_texts(bundled_model: TextEncoder, hf_tokenizer) -> None:
    """The pass's batch of several requests' texts, joined array by array (packs, a pack's slice, a list of
    encodings) and padded from the arrays, equals transformers' padded batch of the same texts."""
    texts = [*TEXTS, "A longer text, of a dozen words or so, to pad the others to.", "y z"]
    pairs = [None, "a pair", None, None, "its own pair"]
    tokenizer = bundled_model.card.tokenizer
    encodings = tokenizer.encode(texts, pairs)
    parts = [PackedTokens.of(encodings[:2]), PackedTokens.of(encodings[1:4])[1:], encodings[4:]]
    joined = PackedTokens.joined(parts)
    assert list(joined) == [TokenIds(e.ids, e.type_ids) for e in encodings]
    reference = hf_tokenizer.pad([hf_tokenizer(t, p) for t, p in zip(texts, pairs, strict=True)], return_tensors="np")
    for batch in (tokenizer.pad(joined), tokenizer.pad(encodings)):
        np.testing.assert_array_equal(batch.input_ids, reference["input_ids"])
        np.testing.assert_array_equal(batch.attention_mask, reference["attention_mask"])
        np.testing.assert_array_equal(batch.token_type_ids, reference["token_type_ids"])
        assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.token_type_ids.dtype == np.int64
    assert PackedTokens.joined([encodings]).ids.tolist() == joined.ids.tolist()
