"""A BERT tokenizer's shortcut for plain ASCII text: the same token ids for about 0.6 times the tokenizer's time.

A BERT tokenizer (``BertNormalizer``, ``BertPreTokenizer``) first normalises every character of a text (control
characters dropped, whitespace made spaces, CJK characters spaced, accents stripped by Unicode decomposition, lower
case), keeping an alignment to the original for each, then splits at whitespace and at punctuation, looking every
character up in Unicode's category tables; only then come the word pieces. For text that is ASCII without control
characters, the only step of those that changes anything is lower case (where the normaliser lowers), and the
splits come down to ASCII whitespace and ASCII punctuation. So such text goes, lowered in Python, to a twin of the
tokenizer without a normaliser whose pre-tokenizer splits at whitespace (``WhitespaceSplit``: the same
``char::is_whitespace`` as ``BertPreTokenizer``) and isolates each ASCII punctuation character (``Split`` on a
regex of exactly the characters Rust's ``is_ascii_punctuation`` names): 22-23 against 38 µs of CPU a text in
batches of 32 sentences of 8-40 words, the checks included (docs/benchmarks/host-path.md). A text that holds any
added token's content, in any case, takes the whole pipeline: added tokens are matched on the raw or the
normalised text before all this.

Only for callers that read ids, segment ids and special marks (``token_text`` false): the twin's token strings and
offsets are not the ones the whole pipeline writes.

Callers that read ids and segment ids alone go shorter still (``WordPieces``): after that split a word's pieces
depend on the word alone, so each word's pieces are asked of the twin once and kept, and a text's ids are its
words' pieces one after another inside the post-processor's fixed template (``[CLS] $A [SEP]``, ``[CLS] $A [SEP]
$B:1 [SEP]:1``, found by probing it). Text repeats its words (of the 4,000 generated sentences of the benchmarks,
191 distinct): 6.3-7.0 against 17.1-24.3 µs of CPU a text, 13.7 against 38.8 a reranker's pair, packing included
(docs/benchmarks/host-path.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from tokenizers import Encoding, Regex, Tokenizer, normalizers, pre_tokenizers

# Rust's char::is_ascii_punctuation: U+0021-U+002F, U+003A-U+0040, U+005B-U+0060, U+007B-U+007E
ASCII_PUNCTUATION = r"[!-/:-@\[-`{-~]"
# A word between whitespace and punctuation, or one punctuation character: the twin's pre-tokenizer's pieces, for
# text that ``AsciiShortcut.prepared`` passed (no control characters: the whitespace left is tab, newline, carriage
# return and space)
WORD = re.compile(ASCII_PUNCTUATION + r"|[^\t\n\r !-/:-@\[-`{-~]+")
# ASCII's control characters but tab, newline and carriage return (BertNormalizer's clean_text drops them, while a
# split at whitespace would split at U+000B and U+000C)
CONTROL = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"

Input = str | tuple[str, str]


class AsciiShortcut:
    """Which texts may skip a BERT tokenizer's normaliser and Unicode lookups, and the twin tokenizers that do."""

    def __init__(self, lowercase: bool, added: Sequence[str]) -> None:
        self.lowercase = lowercase
        tokens = sorted({token.lower() for token in added if token})
        # Searched in the lowered text: a control character or an added token's first character (one character
        # class: 0.5 µs a sentence), and only where that finds one, a control character or a whole added token
        self._maybe = re.compile(
            CONTROL + "|[" + "".join(re.escape(token[0]) for token in tokens) + "]" if tokens else CONTROL
        )
        self._whole = re.compile("|".join([CONTROL, *map(re.escape, tokens)]))
        # id of the tokenizer → its twin, made on first use (TextTokenizer makes its truncating one as it loads)
        self._twins: dict[int, Tokenizer] = {}

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> AsciiShortcut | None:
        """The shortcut for a tokenizer whose normaliser is BERT's and whose pre-tokenizer is BERT's; None for any
        other."""
        normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
        if not isinstance(normalizer, normalizers.BertNormalizer):
            return None
        if not isinstance(pre_tokenizer, pre_tokenizers.BertPreTokenizer):
            return None
        added = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        return cls(bool(normalizer.lowercase), added)

    def prepared(self, text: str) -> str | None:
        """``text`` as the twin takes it (lowered where the normaliser lowers), giving the whole pipeline's ids; None
        where it must go the whole way."""
        if not text.isascii():
            return None
        lowered = text.lower()
        if self._maybe.search(lowered) is not None and self._whole.search(lowered) is not None:
            return None
        return lowered if self.lowercase else text

    def twin(self, tokenizer: Tokenizer) -> Tokenizer:
        """``tokenizer`` (its truncation, post-processor and vocabulary) without the normaliser, splitting at
        whitespace and ASCII punctuation."""
        twin = self._twins.get(id(tokenizer))
        if twin is None:
            twin = Tokenizer.from_str(tokenizer.to_str())
            twin.normalizer = None
            twin.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(ASCII_PUNCTUATION), "isolated")]
            )
            self._twins[id(tokenizer)] = twin
        return twin

    def encode_batch_fast(self, tokenizer: Tokenizer, inputs: Sequence[Input], special_tokens: bool) -> list[Encoding]:
        """``tokenizer.encode_batch_fast(inputs)``: the texts the twin takes through it, the rest through the whole
        pipeline, in their order."""
        prepared = [self._prepared_input(item) for item in inputs]
        plain = [i for i, item in enumerate(prepared) if item is not None]
        if not plain:
            return tokenizer.encode_batch_fast(list(inputs), add_special_tokens=special_tokens)
        fast = self.twin(tokenizer).encode_batch_fast([prepared[i] for i in plain], add_special_tokens=special_tokens)
        if len(plain) == len(inputs):
            return fast
        rest = [i for i, item in enumerate(prepared) if item is None]
        slow = tokenizer.encode_batch_fast([inputs[i] for i in rest], add_special_tokens=special_tokens)
        encodings: list[Encoding] = [None] * len(inputs)  # type: ignore[list-item]  # every slot filled below
        for index, encoding in chain(zip(plain, fast), zip(rest, slow)):
            encodings[index] = encoding
        return encodings

    def _prepared_input(self, item: Input) -> Input | None:
        if isinstance(item, str):
            return self.prepared(item)
        first, second = self.prepared(item[0]), self.prepared(item[1])
        return None if first is None or second is None else (first, second)


# Words whose pieces are kept (at ~100 bytes each, a few MiB); past this the store starts again, so a stream of words
# never seen twice (hashes, numbers) holds no more than this
KEPT_WORDS = 1 << 15
# A longer word's pieces are asked of the twin each time (WordPiece gives [UNK] past 100 characters)
LONGEST_KEPT = 48


@dataclass(frozen=True)
class Template:
    """What a post-processor puts around a text's pieces, or a pair's, and the segment of each part: ``[CLS] $A
    [SEP]``, ``[CLS] $A [SEP] $B:1 [SEP]:1``."""

    lead: list[int]
    lead_types: list[int]
    first: int  # the first text's segment
    mid: list[int]  # between a pair's texts (none for a single text)
    mid_types: list[int]
    second: int  # the second text's segment
    trail: list[int]
    trail_types: list[int]

    @property
    def zeros(self) -> bool:
        """Every segment id 0 for a single text."""
        return not (self.first or any(self.lead_types) or any(self.trail_types))

    def ids(self, first: list[int], second: list[int] | None) -> list[int]:
        if second is None:
            return self.lead + first + self.trail
        return self.lead + first + self.mid + second + self.trail

    def types(self, first: list[int], second: list[int] | None) -> list[int]:
        if second is None:
            return self.lead_types + [self.first] * len(first) + self.trail_types
        return (
            self.lead_types
            + [self.first] * len(first)
            + self.mid_types
            + [self.second] * len(second)
            + self.trail_types
        )

    @classmethod
    def of(cls, pieces: Tokenizer, pair: bool, special_tokens: bool) -> Template | None:
        """The template ``pieces`` puts around a single text (or a pair), found by probing it, or None where its
        output is not a fixed template around the texts' own pieces."""
        a, b = (pieces.encode(probe, add_special_tokens=False).ids for probe in ("a", "b"))
        probe = pieces.encode("a", "b" if pair else None, add_special_tokens=special_tokens)
        ids, types = probe.ids, probe.type_ids
        if len(a) != 1 or len(b) != 1 or a == b or ids.count(a[0]) != 1 or (pair and ids.count(b[0]) != 1):
            return None
        at = ids.index(a[0])
        then = ids.index(b[0]) if pair else at
        if then < at:
            return None
        template = cls(
            ids[:at],
            types[:at],
            types[at],
            ids[at + 1 : then],
            types[at + 1 : then],
            types[then],
            ids[then + 1 :],
            types[then + 1 :],
        )
        for first, second in (("", ""), ("two words", "a, b."), ("x", ""), ("", "y z")):  # it holds for any texts
            whole = pieces.encode(first, second if pair else None, add_special_tokens=special_tokens)
            content = [pieces.encode(text, add_special_tokens=False).ids for text in (first, second)]
            made = (content[0], content[1] if pair else None)
            if whole.ids != template.ids(*made) or whole.type_ids != template.types(*made):
                return None
        return template


class WordPieces:
    """Texts' ids by their words' pieces, each word's asked of a twin once and kept, between what the twin's
    post-processor puts around a text or a pair (``Template``): for a BERT tokenizer whose post-processor is a fixed
    template. ``None`` where it is not."""

    def __init__(self, pieces: Tokenizer, templates: dict[tuple[bool, bool], Template]) -> None:
        self._pieces = pieces
        self.templates = templates  # by (a pair, special tokens)
        self._kept: dict[str, list[int]] = {}

    @classmethod
    def of(cls, twin: Tokenizer) -> WordPieces | None:
        pieces = Tokenizer.from_str(twin.to_str())
        pieces.no_truncation()
        pieces.no_padding()
        templates = {}
        for pair in (False, True):
            for special in (False, True):
                template = Template.of(pieces, pair, special)
                if template is None:
                    return None
                templates[(pair, special)] = template
        return cls(pieces, templates)

    def content(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's pieces (``texts`` as ``AsciiShortcut.prepared`` gives them), no special tokens."""
        try:
            return self._kept_words(texts)
        except KeyError:  # a word not kept yet
            return self._asking(texts)

    def _kept_words(self, texts: Sequence[str]) -> list[list[int]]:
        kept, out = self._kept, []
        for text in texts:
            ids: list[int] = []
            for word in WORD.findall(text):
                ids += kept[word]
            out.append(ids)
        return out

    def _asking(self, texts: Sequence[str]) -> list[list[int]]:
        """``content``, the words not kept asked of the twin in one call, and kept."""
        words = [WORD.findall(text) for text in texts]
        kept = self._kept
        missing = {word for text in words for word in text if word not in kept}
        if len(kept) + len(missing) > KEPT_WORDS:
            kept.clear()
            missing = {word for text in words for word in text}
        asked = list(missing)
        found = {w: e.ids for w, e in zip(asked, self._pieces.encode_batch_fast(asked, add_special_tokens=False))}
        kept.update((word, ids) for word, ids in found.items() if len(word) <= LONGEST_KEPT)
        out = []
        for text in words:
            ids: list[int] = []
            for word in text:
                pieces = found.get(word) or kept.get(word)
                if pieces is None:  # the store started again on another thread since
                    pieces = self._pieces.encode(word, add_special_tokens=False).ids
                ids += pieces
            out.append(ids)
        return out
