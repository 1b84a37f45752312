"""The model's own ``tokenizer.json``, through the ``tokenizers`` library."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import AddedToken, Encoding, Tokenizer

from model.spec.ascii_shortcut import AsciiShortcut, WordPieces


class TooManyTokensError(ValueError):
    """A text is longer than the model's maximum and truncation was turned off."""

    def __init__(self, index: int, n_tokens: int, max_tokens: int) -> None:
        super().__init__(f"text {index} has {n_tokens} tokens, more than the maximum of {max_tokens}")
        self.index = index
        self.n_tokens = n_tokens
        self.max_tokens = max_tokens


class TokenIdOutOfRange(ValueError):
    """A token id given by a client that the vocabulary does not have."""

    def __init__(self, position: int, token: int, vocab_size: int) -> None:
        super().__init__(f"token id {token} is outside the vocabulary (0 to {vocab_size - 1})")
        self.position = position


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    start: int  # character offset in its own segment's text; 0 for special tokens
    end: int
    special: bool  # [CLS], [SEP], …
    segment: int  # 0 for sentence A, 1 for sentence B


class TokenSequence(Protocol):
    """What a forward pass needs of a tokenised text: a tokenizers Encoding, or token ids given as they are."""

    @property
    def ids(self) -> list[int]: ...

    @property
    def type_ids(self) -> list[int]: ...


@dataclass(frozen=True)
class TokenIds:
    """Token ids taken as a client sent them (no special tokens added), one segment."""

    ids: list[int]
    type_ids: list[int]


@dataclass(frozen=True, eq=False)
class PackedTokens(Sequence[TokenIds]):
    """Tokenised texts packed in three arrays: every text's ids one after another, their segment ids alike, and
    where each text starts (the last entry where the last one ends). How texts cross between processes: three
    arrays travel beside a message as they are, where a list of texts costs a pickled object and two lists of ints
    a text each way. Read by index, a text is its ``TokenIds``."""

    ids: np.ndarray  # (N,) int32
    type_ids: np.ndarray  # (N,) int8
    starts: np.ndarray  # (n + 1,) int64, ascending from 0

    @classmethod
    def of(cls, texts: Sequence[TokenSequence]) -> PackedTokens:
        if isinstance(texts, PackedTokens):  # packed as it was tokenised (``TextTokenizer.encode_packed``)
            return texts
        ids = [text.ids for text in texts]  # (an Encoding builds a new list each time it is asked)
        starts = np.frombuffer(array("q", accumulate(map(len, ids), initial=0)), dtype=np.int64)
        total = int(starts[-1])
        return cls(
            np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=total),
            np.fromiter(chain.from_iterable(text.type_ids for text in texts), dtype=np.int8, count=total),
            starts,
        )

    def __reduce__(self) -> tuple[Callable[[bytes, bytes, bytes], PackedTokens], tuple[bytes, bytes, bytes]]:
        # As bytes inside the pickle: numpy's own reduction costs about 9 µs an array, ten times a task's bytes
        return _packed_tokens, (self.ids.tobytes(), self.type_ids.tobytes(), self.starts.tobytes())

    def __len__(self) -> int:
        return len(self.starts) - 1

    def lengths(self) -> list[int]:
        """Each text's tokens."""
        return np.diff(self.starts).tolist()

    @classmethod
    def joined(cls, parts: Sequence[Sequence[TokenSequence]]) -> PackedTokens:
        """Several requests' texts as one pack, in order: packs joined array by array, the texts between them packed
        together first (one request of one text is a list: packing each alone would cost more than padding it)."""
        packs: list[PackedTokens] = []
        loose: list[TokenSequence] = []  # texts given as lists since the last pack
        for part in parts:
            if isinstance(part, PackedTokens):
                if loose:
                    packs.append(cls.of(loose))
                    loose = []
                packs.append(part)
            else:
                loose += part
        if loose or not packs:
            packs.append(cls.of(loose))
        if len(packs) == 1:
            return packs[0]
        ends = np.cumsum([int(pack.starts[-1]) for pack in packs])  # where each pack's tokens end in the join
        return cls(
            np.concatenate([pack.ids for pack in packs]),
            np.concatenate([pack.type_ids for pack in packs]),
            np.concatenate([packs[0].starts, *(pack.starts[1:] + end for pack, end in zip(packs[1:], ends))]),
        )

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # Sequence's int and slice overloads
        if isinstance(index, slice):  # a pack of its own, the arrays' views
            first, last, step = index.indices(len(self))
            if step != 1:
                return PackedTokens.of([self[i] for i in range(first, last, step)])
            last = max(first, last)
            begin, end = int(self.starts[first]), int(self.starts[last])
            return PackedTokens(self.ids[begin:end], self.type_ids[begin:end], self.starts[first : last + 1] - begin)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        start, end = int(self.starts[index]), int(self.starts[index + 1])
        return TokenIds(self.ids[start:end].tolist(), self.type_ids[start:end].tolist())

    def __iter__(self) -> Iterator[TokenIds]:
        ids, type_ids, bounds = self.ids, self.type_ids, self.starts.tolist()
        for start, end in zip(bounds, bounds[1:]):
            yield TokenIds(ids[start:end].tolist(), type_ids[start:end].tolist())


def _packed_tokens(ids: bytes, type_ids: bytes, starts: bytes) -> PackedTokens:
    return PackedTokens(
        np.frombuffer(ids, dtype=np.int32),
        np.frombuffer(type_ids, dtype=np.int8),
        np.frombuffer(starts, dtype=np.int64),
    )


@dataclass(frozen=True)
class Word:
    """A word of a text as the tokenizer's pre-tokenizer splits it, with the positions of its tokens."""

    text: str  # as it appears in its segment's text; a special token's own string
    positions: tuple[int, ...]  # its tokens' positions in the encoding


@dataclass(frozen=True)
class Batch:
    """Padded token ids ready for the encoder (numpy, int64)."""

    input_ids: np.ndarray  # (B, T)
    attention_mask: np.ndarray  # (B, T) 1 for real tokens, 0 for padding
    token_type_ids: np.ndarray  # (B, T) segment ids

    @property
    def n_tokens(self) -> int:
        """Real (unpadded) tokens in the batch."""
        return int(self.attention_mask.sum())


def packed_rows(rows: Sequence[list[int]], types: Sequence[list[int] | None]) -> PackedTokens:
    """Texts given as their ids and segment ids (None: all 0), packed."""
    starts = np.frombuffer(array("q", accumulate(map(len, rows), initial=0)), dtype=np.int64)
    total = int(starts[-1])
    ids = np.frombuffer(array("i", chain.from_iterable(rows)), dtype=np.int32) if total else np.empty(0, np.int32)
    if any(row is not None for row in types):
        every = (bytes(len(row)) if row_types is None else row_types for row, row_types in zip(rows, types))
        segments = np.frombuffer(array("b", chain.from_iterable(every)), dtype=np.int8)
    else:
        segments = np.zeros(total, dtype=np.int8)
    return PackedTokens(ids, segments, starts)


class TextTokenizer:
    """Batches of texts (or text pairs) to token ids, token strings, offsets and special-token masks."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, pad_token_id: int | None = None) -> None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
        self.max_tokens = max_tokens
        # Two copies: their truncation is a setting of the object, and the service uses both at once.
        self._truncating = Tokenizer.from_str(tokenizer.to_str())
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_tokens)
        self._left: Tokenizer | None = None  # cutting at the start (TEI's truncation_direction Left): ``left``
        self._complete = Tokenizer.from_str(tokenizer.to_str())
        self._complete.no_padding()
        self._complete.no_truncation()
        if pad_token_id is None:  # the model's config says; without one, the usual names
            found = [tokenizer.token_to_id(name) for name in ("[PAD]", "<pad>")]
            pad_token_id = next((i for i in found if i is not None), 0)
        self.pad_token_id = pad_token_id
        self._shortcut = AsciiShortcut.of(tokenizer)  # BERT's tokenizers: plain ASCII text the short way
        self._words: WordPieces | None = None  # single plain texts by their words' pieces: ``encode_packed``
        if self._shortcut is not None:  # the truncating twin made now, at load, not on a client's first request
            self._words = WordPieces.of(self._shortcut.twin(self._truncating))

    def with_max_tokens(self, max_tokens: int) -> TextTokenizer:
        """The same tokenizer, truncating at another length."""
        return TextTokenizer(self._complete, max_tokens, self.pad_token_id)

    def with_special_tokens(self, tokens: Sequence[str]) -> TextTokenizer:
        """The same tokenizer, keeping each of ``tokens`` whole wherever it appears in a text (a special token of
        the vocabulary that the pre-tokenizer would split, such as ``[unused0]``)."""
        tokenizer = Tokenizer.from_str(self._complete.to_str())
        tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in tokens])
        return TextTokenizer(tokenizer, self.max_tokens, self.pad_token_id)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids back to text, as the tokenizer's decoder writes it."""
        return self._complete.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def pieces(self, text: str) -> list[str]:
        """The tokens of ``text`` alone, without special tokens."""
        return list(self._complete.encode(text, add_special_tokens=False).tokens)

    @classmethod
    def from_file(cls, path: Path, max_tokens: int, pad_token_id: int | None = None) -> TextTokenizer:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no tokenizer at {path} (expected a tokenizer.json file)")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(f"{path} is not a readable tokenizer.json: {error}") from error
        return cls(tokenizer, max_tokens, pad_token_id)

    @property
    def vocab_size(self) -> int:
        return self._complete.get_vocab_size()

    def vocabulary_entries(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary's entry (its token string: ``##ing``, ``▁the``) for each id."""
        return [self._complete.id_to_token(id_) or "" for id_ in ids]

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the vocabulary's special tokens ([CLS], [SEP], [PAD], <|im_start|>, …)."""
        return frozenset(i for i, token in self._complete.get_added_tokens_decoder().items() if token.special)

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary (``yes``), or None where the vocabulary has no such token."""
        return self._complete.token_to_id(token)

    def encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        truncate: bool = True,
        special_tokens: bool = True,
    ) -> list[Encoding]:
        """Tokenise a batch, each text optionally paired with a second segment.

        With ``truncate`` texts are cut to ``max_tokens`` (longest segment first for pairs); without it a
        text that is too long raises TooManyTokensError naming it. Without ``special_tokens`` the tokenizer's
        post-processor adds none (a template that writes its own).
        """
        encodings = self.encode_unchecked(texts, pairs, truncate, special_tokens)
        if not truncate:
            self.check_lengths(encodings)
        return encodings

    def encode_unchecked(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        truncate: bool = True,
        special_tokens: bool = True,
        left: bool = False,
        token_text: bool = True,
    ) -> list[Encoding]:
        """As ``encode``, but a too-long text (``truncate`` false) is returned whole: see ``check_lengths``. With
        ``left`` a text is cut at its start rather than its end. Without ``token_text`` the encodings hold ids,
        segment ids and special-token marks only, their tokens' strings empty and offsets zero: about a third
        less work for the tokenizer, for a caller that reads nothing else; a BERT tokenizer then takes plain ASCII
        text by its ``AsciiShortcut`` (the same ids, segments and marks, at about 0.6 times the time)."""
        tokenizer = (self.left if left else self._truncating) if truncate else self._complete
        inputs: list[str | tuple[str, str]]
        if pairs is None:
            inputs = list(texts)
        elif len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        else:
            inputs = [text if pair is None else (text, pair) for text, pair in zip(texts, pairs)]
        if token_text:
            return tokenizer.encode_batch(inputs, add_special_tokens=special_tokens)
        if self._shortcut is not None:
            return self._shortcut.encode_batch_fast(tokenizer, inputs, special_tokens)
        return tokenizer.encode_batch_fast(inputs, add_special_tokens=special_tokens)

    def encode_packed(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        truncate: bool = True,
        special_tokens: bool = True,
        left: bool = False,
    ) -> PackedTokens:
        """``encode_unchecked`` without ``token_text``, packed: ids and segment ids alone. A BERT tokenizer takes
        plain ASCII text by its words' pieces (``WordPieces``: the same ids at about a third of the time); other
        texts, and a text or pair longer than ``max_tokens`` where ``truncate`` cuts it, go through the library."""
        if self._words is None:
            return PackedTokens.of(self.encode_unchecked(texts, pairs, truncate, special_tokens, left, False))
        seconds = pairs if pairs is not None else [None] * len(texts)
        if len(seconds) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(seconds)} pairs")
        rows, types = self._by_words(texts, seconds, special_tokens, self.max_tokens if truncate else None)
        rest = [i for i, row in enumerate(rows) if row is None]
        if rest:
            encodings = self.encode_unchecked(
                [texts[i] for i in rest],
                [seconds[i] for i in rest] if pairs is not None else None,
                truncate,
                special_tokens,
                left,
                False,
            )
            for i, encoding in zip(rest, encodings):
                rows[i], types[i] = encoding.ids, encoding.type_ids
        return packed_rows(rows, types)  # type: ignore[arg-type]  # every row filled above

    def _by_words(
        self, texts: Sequence[str], seconds: Sequence[str | None], special_tokens: bool, limit: int | None
    ) -> tuple[list[list[int] | None], list[list[int] | None]]:
        """Each text's (or pair's) ids by its words' pieces and its segment ids (None: all 0); None for a row that
        the shortcut does not take or that is longer than ``limit``."""
        words, shortcut = self._words, self._shortcut
        assert words is not None and shortcut is not None, "a WordPieces comes with its shortcut"
        prepared = [shortcut.prepared(text) for text in texts]
        prepared_seconds = [None if pair is None else shortcut.prepared(pair) for pair in seconds]
        plain = [
            i
            for i, (text, second) in enumerate(zip(prepared, seconds))
            if text is not None and (second is None or prepared_seconds[i] is not None)
        ]
        # each distinct text's pieces once (a reranker's query is every pair's first text)
        distinct = dict.fromkeys(prepared[i] for i in plain)
        distinct.update(dict.fromkeys(prepared_seconds[i] for i in plain if seconds[i] is not None))
        pieces = dict(zip(distinct, words.content(list(distinct))))  # type: ignore[arg-type]  # plain: prepared
        single, pair = words.templates[(False, special_tokens)], words.templates[(True, special_tokens)]
        rows: list[list[int] | None] = [None] * len(texts)
        types: list[list[int] | None] = [None] * len(texts)
        for i in plain:
            first, second = pieces[prepared[i]], None if seconds[i] is None else pieces[prepared_seconds[i]]
            template = single if second is None else pair
            row = template.ids(first, second)
            if limit is None or len(row) <= limit:
                rows[i] = row
                if second is not None or not template.zeros:
                    types[i] = template.types(first, second)
        return rows, types

    def check_lengths(self, encodings: Sequence[TokenSequence]) -> None:
        """TooManyTokensError for the first encoding longer than ``max_tokens``."""
        if isinstance(encodings, PackedTokens):
            lengths = encodings.lengths()
            if max(lengths, default=0) <= self.max_tokens:
                return
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_tokens:
                raise TooManyTokensError(index, len(encoding.ids), self.max_tokens)

    @property
    def left(self) -> Tokenizer:
        """The copy that truncates at the start, made on first use (few requests ask for it)."""
        if self._left is None:
            left = Tokenizer.from_str(self._complete.to_str())
            left.enable_truncation(self.max_tokens, direction="left")
            self._left = left
        return self._left

    def check_ids(self, ids: Sequence[int]) -> None:
        """TokenIdOutOfRange naming the first id outside the vocabulary."""
        size = self.vocab_size
        for position, token in enumerate(ids):
            if not 0 <= token < size:
                raise TokenIdOutOfRange(position, token, size)

    def from_ids(self, ids: Sequence[int]) -> TokenIds:
        """Token ids as they are, cut to ``max_tokens``; ValueError naming the first id outside the vocabulary."""
        self.check_ids(ids)
        kept = list(ids[: self.max_tokens])
        return TokenIds(kept, [0] * len(kept))

    @staticmethod
    def framing(encoding: Encoding) -> tuple[int, int]:
        """How many special tokens lead the encoding ([CLS]) and how many trail it ([SEP])."""
        mask = encoding.special_tokens_mask
        lead = next((i for i, special in enumerate(mask) if not special), len(mask))
        trail = next((i for i, special in enumerate(reversed(mask)) if not special), 0)
        return lead, trail

    def cut(self, encoding: Encoding, limit: int) -> list[int]:
        """The positions an encoding keeps when cut to ``limit`` tokens as transformers truncates: the special
        tokens around kept, the content shortened at its end."""
        n = len(encoding.ids)
        if n <= limit:
            return list(range(n))
        lead, trail = self.framing(encoding)
        return [*range(min(lead, limit)), *range(lead, max(limit - trail, lead)), *range(n - trail, n)][:limit]

    def window_content(self, encoding: Encoding) -> int:
        """How many content tokens (not special) one window of ``max_tokens`` holds with this encoding's special
        tokens around them."""
        lead, trail = self.framing(encoding)
        return max(self.max_tokens - lead - trail, 1)

    def windows(self, encoding: Encoding, overlap: int = 0) -> list[TokenSequence]:
        """An encoding cut into windows of at most ``max_tokens``, each with the encoding's leading and trailing
        special tokens ([CLS] … [SEP]) around its share of the content tokens; windows start every (window content
        − ``overlap``) content tokens, the last one shorter. An encoding that fits is its own one window."""
        if len(encoding.ids) <= self.max_tokens:
            return [encoding]
        ids = encoding.ids
        lead, trail = self.framing(encoding)
        prefix, content, suffix = ids[:lead], ids[lead : len(ids) - trail], ids[len(ids) - trail :]
        room = self.window_content(encoding)
        step = max(room - overlap, 1)
        windows: list[TokenSequence] = []
        for start in range(0, len(content), step):
            piece = [*prefix, *content[start : start + room], *suffix]
            windows.append(TokenIds(piece, [0] * len(piece)))
            if start + room >= len(content):
                break
        return windows

    def around(self, prefix: Sequence[int], middle: Sequence[int], suffix: Sequence[int]) -> TokenIds:
        """prefix + middle + suffix, the middle cut at its end so that the whole fits ``max_tokens`` (a template's
        fixed parts kept whole, the text between them shortened)."""
        room = max(self.max_tokens - len(prefix) - len(suffix), 0)
        ids = [*prefix, *middle[:room], *suffix]
        return TokenIds(ids, [0] * len(ids))

    def pad(self, encodings: Sequence[TokenSequence]) -> Batch:
        """Stack encodings into (B, T) arrays, padding on the right to the longest (packed texts by whole arrays,
        not a text at a time)."""
        if isinstance(encodings, PackedTokens):
            lengths = np.diff(encodings.starts)  # (B,)
            real = np.arange(int(lengths.max())) < lengths[:, None]  # (B, T): row-major, the packed order
            input_ids = np.full(real.shape, self.pad_token_id, dtype=np.int64)
            input_ids[real] = encodings.ids
            token_type_ids = np.zeros(real.shape, dtype=np.int64)
            token_type_ids[real] = encodings.type_ids
            return Batch(input_ids, real.astype(np.int64), token_type_ids)
        T = max(len(e.ids) for e in encodings)
        B = len(encodings)
        input_ids = np.full((B, T), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            input_ids[row, :n] = encoding.ids
            attention_mask[row, :n] = 1
            token_type_ids[row, :n] = encoding.type_ids
        return Batch(input_ids, attention_mask, token_type_ids)

    @staticmethod
    def words(encoding: Encoding, texts: Sequence[str | None]) -> list[Word]:
        """The encoding's tokens grouped into words, in order: the consecutive tokens of one word of one segment
        (the pre-tokenizer's split) form one, every special token one of its own. ``texts`` are the segments'
        texts (the text, and its pair or None); a word's text is its span there."""
        groups: list[tuple[tuple[int, int] | None, list[int]]] = []  # (segment, word index) or None, positions
        for position, (word_id, segment, special) in enumerate(
            zip(encoding.word_ids, encoding.sequence_ids, encoding.special_tokens_mask)
        ):
            key = None if special or word_id is None or segment is None else (segment, word_id)
            if key is not None and groups and groups[-1][0] == key:
                groups[-1][1].append(position)  # the word goes on
            else:
                groups.append((key, [position]))
        words = []
        for key, positions in groups:
            start, end = encoding.offsets[positions[0]][0], encoding.offsets[positions[-1]][1]
            text = texts[key[0]] if key is not None and key[0] < len(texts) else None
            shown = text[start:end] if text is not None and end > start else encoding.tokens[positions[0]]
            words.append(Word(shown, tuple(positions)))
        return words

    @staticmethod
    def tokens(encoding: Encoding) -> list[Token]:
        """Each token of an encoding with its string, character span, special flag and segment."""
        return [
            Token(id=id_, text=text, start=start, end=end, special=bool(special), segment=segment)
            for id_, text, (start, end), special, segment in zip(
                encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, encoding.type_ids
            )
        ]
