"""The one tokenisation stage of every endpoint: texts in, encodings out, a too-long text made its 422.

Requests that arrive in the same turn of the event loop are tokenised together, in one call per way of
reading (truncation, special tokens, token strings kept or not). A small turn (a few short texts, tens of
microseconds of work) is tokenised right there on the event loop, since handing it to a thread and back costs
more than the work; a large one goes to a tokenisation thread (the ``tokenizers`` library releases the GIL while
it works), so that neither the event loop nor the inference thread is held up by it. Plain texts whose ids alone
are read come by their words' pieces, kept in Python (``TextTokenizer.encode_packed``): a third of the library's
CPU, though under the GIL. If a merged call fails, each request is tokenised alone: a text the tokenizer cannot
take fails its own request with a 422 naming it, and nobody else's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Literal, overload

from tokenizers import Encoding

from app import tracing
from app.engine.messages import REQUEST_TIMING
from app.engine.work_queue import QueueClosed
from app.errors import InvalidRequest
from model import TextTokenizer, TokenIdOutOfRange, TokenSequence, TooManyTokensError

logger = logging.getLogger(__name__)

# A loop turn with at most this many characters to tokenise is tokenised on the event loop itself.
INLINE_CHARACTERS = 4096


def check_token_ids(
    tokenizer: TextTokenizer,
    rows: Sequence[Sequence[int]],
    param: str,
    places: Sequence[int] | None = None,
    bare: bool = False,
) -> None:
    """Every row's ids inside the vocabulary, else a 422 naming the first id outside it: ``param[place][position]``,
    the place being the row's in the request (``places``, by default its index among ``rows``), or
    ``param[position]`` where the request gave one ``bare`` row (a list of ids rather than a list of lists)."""
    for index, row in enumerate(rows):
        try:
            tokenizer.check_ids(row)
        except TokenIdOutOfRange as error:
            place = "" if bare else f"[{index if places is None else places[index]}]"
            raise InvalidRequest(f"{param}{place}[{error.position}]", str(error)) from None


@dataclass(frozen=True)
class Reading:
    """How a request reads its texts. The native routes' is the default; TEI's routes may cut a text at its start
    rather than its end (``truncation_direction: Left``), and read token ids they were given, decoded, without the
    post-processor's special tokens (``plain``). A route that reads otherwise serves the request from a model
    that reads so (``ServedModel.read_as``), and every tokenisation of its work reads that way."""

    left: bool = False
    plain: bool = False


NATIVE_READING = Reading()


@dataclass(eq=False)
class _Request:
    texts: Sequence[str]
    pairs: Sequence[str | None] | None
    truncate: bool
    param: str
    indexed: bool
    future: asyncio.Future[Sequence[TokenSequence]] = field(repr=False)
    special_tokens: bool = True  # the post-processor's special tokens added (not for a template that writes its own)
    whole: bool = False  # not truncated, and a text longer than the maximum is no error (it is cut into windows)
    left: bool = False  # truncated at the start (Reading.left)
    token_text: bool = True  # the tokens' strings and offsets kept (TextTokenizer.encode_unchecked)

    def name(self, index: int) -> str:
        """The request field that a text is: ``texts[3]``, or ``text``."""
        return f"{self.param}[{index}]" if self.indexed else self.param


@dataclass(eq=False)
class _Turn:
    """The requests waiting for the event loop's turn to end: shared by a model's every reading (``read_as``)."""

    waiting: list[_Request] = field(default_factory=list)


class Tokenization:
    """Tokenises for one model at one length limit, reading texts as ``reading`` says; requests of the same loop
    turn share one call, whatever their reading."""

    def __init__(
        self, tokenizer: TextTokenizer, executor: Executor, reading: Reading = NATIVE_READING, turn: _Turn | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.executor = executor
        self.reading = reading
        self._turn = _Turn() if turn is None else turn

    def read_as(self, reading: Reading) -> Tokenization:
        """This tokenisation reading texts as ``reading`` says, in the same loop turns."""
        return self if reading == self.reading else Tokenization(self.tokenizer, self.executor, reading, self._turn)

    @property
    def max_tokens(self) -> int:
        return self.tokenizer.max_tokens

    @overload
    async def encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        *,
        truncate: bool = True,
        param: str = "texts",
        indexed: bool = True,
        special_tokens: bool = True,
        whole: bool = False,
        token_text: Literal[True] = True,
    ) -> list[Encoding]: ...

    @overload
    async def encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        *,
        truncate: bool = True,
        param: str = "texts",
        indexed: bool = True,
        special_tokens: bool = True,
        whole: bool = False,
        token_text: bool,
    ) -> Sequence[TokenSequence]: ...

    async def encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None = None,
        *,
        truncate: bool = True,
        param: str = "texts",
        indexed: bool = True,
        special_tokens: bool = True,
        whole: bool = False,
        token_text: bool = True,
    ) -> Sequence[TokenSequence]:
        """The encodings of ``texts`` (each optionally paired), or InvalidRequest naming the text at fault.

        ``param`` names the request field in errors, with the text's index when ``indexed``. Without
        ``special_tokens`` the tokenizer adds none of its own. ``whole``: every token of every text, however long
        (``truncate`` is then not read). Without ``token_text`` the texts' ids and segment ids alone, tokenised
        faster, as a ``PackedTokens`` (``TextTokenizer.encode_packed``): for a caller that reads nothing else.
        """
        loop = asyncio.get_running_loop()
        reading = self.reading
        special_tokens = special_tokens and not reading.plain
        request = _Request(
            texts,
            pairs,
            truncate and not whole,
            param,
            indexed,
            loop.create_future(),
            special_tokens,
            whole,
            reading.left,
            token_text,
        )
        turn = self._turn
        if not turn.waiting:
            loop.call_soon(self._flush, loop)
        turn.waiting.append(request)
        timing, parent = REQUEST_TIMING.get(), tracing.current()
        started = time.perf_counter()
        try:
            return await request.future
        finally:
            if timing is not None:
                timing.tokenization_s += time.perf_counter() - started
            if parent is not None:
                attributes = {"encoder.texts": len(texts)}
                tracing.record("tokenize", parent, tracing.epoch_ns(started), time.time_ns(), attributes)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        requests, self._turn.waiting = self._turn.waiting, []
        requests = [r for r in requests if not r.future.done()]  # cancelled while waiting for the turn
        if not requests:
            return
        characters = sum(len(text) for r in requests for text in r.texts)
        characters += sum(len(pair or "") for r in requests for pair in (r.pairs or ()))
        if characters <= INLINE_CHARACTERS:
            _settle(self._outcomes(requests))
            return
        try:
            self.executor.submit(self._tokenize, loop, requests)
        except RuntimeError:  # the executor has shut down: the service is stopping
            _settle([(r, QueueClosed()) for r in requests])

    # ---- on the tokenisation thread (or, for a small turn, the event loop) ----

    def _tokenize(self, loop: asyncio.AbstractEventLoop, requests: list[_Request]) -> None:
        outcomes = self._outcomes(requests)
        try:
            loop.call_soon_threadsafe(_settle, outcomes)
        except RuntimeError:  # the event loop has closed
            pass

    def _outcomes(self, requests: list[_Request]) -> list[tuple[_Request, Sequence[TokenSequence] | BaseException]]:
        """Each request with its encodings, or with the error that is its answer."""
        outcomes: list[tuple[_Request, Sequence[TokenSequence] | BaseException]] = []
        try:
            groups: dict[tuple[bool, bool, bool, bool], list[_Request]] = {}
            for r in requests:
                groups.setdefault((r.truncate, r.special_tokens, r.left, r.token_text), []).append(r)
            for (truncate, special, left, token_text), group in groups.items():
                outcomes.extend(self._tokenize_group(group, truncate, special, left, token_text))
        except BaseException as error:  # a bug here must not leave requests waiting for ever
            logger.exception("tokenising %d requests failed", len(requests))
            outcomes = [(r, error if isinstance(error, Exception) else RuntimeError(str(error))) for r in requests]
        return outcomes

    def _tokenize_group(
        self, group: list[_Request], truncate: bool, special: bool = True, left: bool = False, token_text: bool = True
    ) -> list[tuple[_Request, Sequence[TokenSequence] | BaseException]]:
        texts = [text for r in group for text in r.texts]
        paired = any(r.pairs is not None for r in group)
        pairs = [pair for r in group for pair in (r.pairs or [None] * len(r.texts))] if paired else None
        encodings: Sequence[TokenSequence]
        try:
            if not token_text:
                encodings = self.tokenizer.encode_packed(texts, pairs, truncate, special, left)
            else:
                encodings = self.tokenizer.encode_unchecked(texts, pairs, truncate, special, left, token_text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # an Exception, or a panic of the Rust library (pyo3's PanicException)
            if len(group) == 1:
                return [(group[0], self._failure(group[0]))]
            # One request's text broke the merged call: each request alone, so only that one fails.
            return [
                outcome for r in group for outcome in self._tokenize_group([r], truncate, special, left, token_text)
            ]
        outcomes: list[tuple[_Request, Sequence[TokenSequence] | BaseException]] = []
        start = 0
        for r in group:
            own = encodings[start : start + len(r.texts)]
            start += len(r.texts)
            outcomes.append((r, own if truncate or r.whole else self._checked(r, own)))
        return outcomes

    def _checked(
        self, request: _Request, encodings: Sequence[TokenSequence]
    ) -> Sequence[TokenSequence] | BaseException:
        try:
            self.tokenizer.check_lengths(encodings)
        except TooManyTokensError as error:
            return InvalidRequest(
                request.name(error.index),
                f"has {error.n_tokens} tokens, more than the maximum of {error.max_tokens} (send truncate: true to "
                "cut it)",
            )
        return encodings

    def _failure(self, request: _Request) -> BaseException:
        """Why a request alone could not be tokenised: the first text that fails, named, as a 422."""
        for index, text in enumerate(request.texts):
            pair = None if request.pairs is None else request.pairs[index]
            try:
                pairs = None if pair is None else [pair]
                self.tokenizer.encode_unchecked([text], pairs, request.truncate, request.special_tokens, request.left)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as error:  # see _tokenize_group
                logger.info("a text could not be tokenised: %s", error)
                return InvalidRequest(request.name(index), f"could not be tokenised ({error})")
        logger.warning("a request could not be tokenised as a whole, though each text alone could")
        return InvalidRequest(request.param, "could not be tokenised")


def _settle(outcomes: list[tuple[_Request, Sequence[TokenSequence] | BaseException]]) -> None:
    """On the event loop: hand each request its encodings or its error."""
    for request, outcome in outcomes:
        if request.future.done():
            continue
        if isinstance(outcome, BaseException):
            request.future.set_exception(outcome)
        else:
            request.future.set_result(outcome)
