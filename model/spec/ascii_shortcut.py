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

Callers that read ids alone, of single texts, go shorter still (``WordPieces``): after that split a word's pieces
depend on the word alone, so each word's pieces are asked of the twin once and kept, and a text's ids are its
words' pieces one after another between the post-processor's leading and trailing ids. Text repeats its words
(of the 4,000 generated sentences of the benchmarks, 191 distinct): 6-8 against 26-38 µs of CPU a text, packing
included (docs/benchmarks/host-path.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


class WordPieces:
    """Single texts' ids by their words' pieces, each word's asked of a twin once and kept: for a BERT tokenizer
    whose post-processor puts the same ids before and after every single text (``[CLS] $A [SEP]``), all of them in
    segment 0. ``None`` where the tokenizer's post-processor is not of that form."""

    def __init__(self, pieces: Tokenizer, lead: list[int], trail: list[int]) -> None:
        self._pieces = pieces
        self.lead, self.trail = lead, trail
        self._kept: dict[str, list[int]] = {}

    @classmethod
    def of(cls, twin: Tokenizer) -> WordPieces | None:
        pieces = Tokenizer.from_str(twin.to_str())
        pieces.no_truncation()
        pieces.no_padding()
        probe = pieces.encode("a", add_special_tokens=True)
        bare = pieces.encode("a", add_special_tokens=False).ids
        if len(bare) != 1 or probe.ids.count(bare[0]) != 1 or any(probe.type_ids):
            return None
        word = bare[0]
        at = probe.ids.index(word)
        made = cls(pieces, probe.ids[:at], probe.ids[at + 1 :])
        for text in ("", "two words", "a, b."):  # the template holds for any single text
            whole, content = pieces.encode(text, add_special_tokens=True), pieces.encode(text, add_special_tokens=False)
            if any(whole.type_ids) or whole.ids != made.lead + content.ids + made.trail:
                return None
        return made

    def ids(self, texts: Sequence[str], special_tokens: bool) -> list[list[int]]:
        """Each text's ids (``texts`` as ``AsciiShortcut.prepared`` gives them), with the template's where
        ``special_tokens``; never cut."""
        lead, trail = (self.lead, self.trail) if special_tokens else ([], [])
        try:
            return self._kept_words(texts, lead, trail)
        except KeyError:  # a word not kept yet
            return self._asking(texts, lead, trail)

    def _kept_words(self, texts: Sequence[str], lead: list[int], trail: list[int]) -> list[list[int]]:
        kept, out = self._kept, []
        for text in texts:
            ids = lead.copy()
            for word in WORD.findall(text):
                ids += kept[word]
            ids += trail
            out.append(ids)
        return out

    def _asking(self, texts: Sequence[str], lead: list[int], trail: list[int]) -> list[list[int]]:
        """``ids``, the words not kept asked of the twin in one call, and kept."""
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
            ids = lead.copy()
            for word in text:
                pieces = found.get(word) or kept.get(word)
                if pieces is None:  # the store started again on another thread since
                    pieces = self._pieces.encode(word, add_special_tokens=False).ids
                ids += pieces
            ids += trail
            out.append(ids)
        return out
