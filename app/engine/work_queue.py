"""The queue between the requests and the inference thread: entries, budgets and dropping.

A request's task (app/engine/messages.py) enters as one entry carrying the ``Ticket`` of its request (the request's
future, resolved once every text is answered). The worker takes entries in arrival order: for the kinds whose texts
share passes (embed, classify), the texts of as many entries of one kind as the padded-token budget (rows × longest
row) and the batch size hold, the last of them cut where the pass is full and the rest of it left at the head of the
queue for the next pass; any other entry alone. A request costs the queue one entry and each pass a slice of its
texts, whatever its number of texts. Entries whose request is gone (client disconnected, deadline passed) are
dropped unseen.

With several compute lanes (app/engine/compute.py) the queue is shared out between them: a pass takes at most its
fair share, the texts queued and computing divided by the lanes (by the passes that compute side by side where the
model bounds them below the lanes: OpenVINO's streams, so that a lone request's last pass does not compute alone on
one stream while the others idle), and a lane that comes free while a pass of this queue computes waits (up to
``balance_wait``) until a lane's share of them has arrived. Without this rule the lanes
fall into a lopsided rhythm under load: answering one pass brings its clients' next texts back one by one, a
free lane takes each as it comes, and one lane computes passes of one to four texts while the other gathers
everything else into one large pass (all-MiniLM-L6-v2 on one core: 59 texts/s in passes of one, 94 in passes
of sixteen).

Passes of the kinds that hold the most memory (``Kind.large``: the attention maps of every layer and head) pass a
gate the whole process shares, every model's queue: at most ENCODER_INSPECTION_PASSES of them compute at once (1
by default), so that the memory they hold together is bounded whatever the lanes and the models, and a queue whose
head waits at the gate takes the passes behind it meanwhile; embeddings are not held up by an inspection.

The queue knows entries, their kinds, token counts and tickets; what a kind asks of the model is the worker's
business (app/engine/worker.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import tracing
from app.engine.errors import EngineStopped
from app.engine.messages import KINDS, REQUEST_TIMING, Options, Task, TaskKind, Timing
from model import PackedTokens, TokenSequence, joined_results

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

# How long a free lane waits for its fair share while another pass of the same queue computes: about the time
# the event loop takes to answer a pass of sixteen texts and to read their clients' next requests.
BALANCE_WAIT_S = 0.02


class LargePasses:
    """The gate of the passes that hold the most memory (``Kind.large``), shared by every queue of the process: at
    most ``passes`` compute at once. Queues wait for it without blocking anything else; each is woken when one
    leaves."""

    def __init__(self, passes: int = 1) -> None:
        self.passes = passes
        self.running = 0
        self._lock = threading.Lock()
        self._queues: weakref.WeakSet[WorkQueue] = weakref.WeakSet()

    def configure(self, passes: int) -> None:
        if passes < 1:
            raise ValueError(f"passes must be at least 1, got {passes}")
        with self._lock:
            self.passes = passes
        self._wake()

    def watch(self, queue: WorkQueue) -> None:
        """Wake ``queue`` whenever a pass leaves."""
        with self._lock:
            self._queues.add(queue)

    def enter(self) -> bool:
        """Take a place if there is one."""
        with self._lock:
            if self.running >= self.passes:
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.running -= 1
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            queues = list(self._queues)
        for queue in queues:
            queue.wake()


LARGE_PASSES = LargePasses()  # one per process: configured at start-up (app/serving/registry.py)


class QueueClosed(EngineStopped):
    """Work was submitted after the queue closed: the service is shutting down, to retry in a second (the same error
    in either process mode, raised where it happens)."""

    def __init__(self) -> None:
        super().__init__("the service is shutting down", retry_after_s=1)


class Ticket:
    """One request's place in the queue: its future, resolved on the event loop once every entry is done; where its
    request is traced (``parent``, app/tracing.py), the spans of the passes that carried it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        n_entries: int,
        timing: Timing | None = None,
        parent: SpanContext | None = None,
    ) -> None:
        self.loop = loop
        self.future: asyncio.Future[Sequence[Any]] = loop.create_future()
        self.parts: list[tuple[int, Sequence[Any]]] = []  # (first text's index, results) from each pass
        self.results: Sequence[Any] = ()  # every text's, once all are in: a pass's own answer (arrays) where it was one
        self.remaining = n_entries
        self.timing = timing
        self.submitted = time.perf_counter()
        self.started: float | None = None  # when its first entry began computing
        self.ended: float | None = None  # when its last entry was computed
        self.parent = parent  # the span its request is traced under
        self.passes: list[SpanContext] = []  # the spans of its passes, where traced
        self.failed = False  # set on the inference thread at once, before the event loop marks the future

    def gone(self) -> bool:
        """The request was cancelled (client gone, deadline passed) or has already failed."""
        return self.failed or self.future.done()

    # ---- called on the inference thread ----

    def start(self, now: float) -> None:
        if self.started is None:
            self.started = now

    def set(self, index: int, values: Sequence[Any]) -> bool:
        """Record the results of the texts from ``index`` on; True once every text has one (then ``settle`` the
        ticket)."""
        self.parts.append((index, values))
        self.remaining -= len(values)
        if self.remaining == 0:  # its passes' answers as one, in its texts' order (lanes may finish out of order)
            self.results = joined_results([part for _, part in sorted(self.parts, key=lambda part: part[0])])
            self.ended = time.perf_counter()
            if self.timing is not None and self.started is not None:
                self.timing.queue_s = self.started - self.submitted
                self.timing.inference_s = self.ended - self.started
        return self.remaining == 0

    def traced(self, kind: TaskKind, n_texts: int) -> None:
        """On the event loop, once answered or failed: its ``queue`` and ``inference`` spans under its request's."""
        if self.parent is None:
            return
        now = time.perf_counter()
        started = now if self.started is None else self.started
        attributes = {"encoder.kind": kind, "encoder.texts": n_texts}
        tracing.record("queue", self.parent, tracing.epoch_ns(self.submitted), tracing.epoch_ns(started), attributes)
        if self.started is not None:
            ended = tracing.epoch_ns(now if self.ended is None else self.ended)
            attributes["encoder.passes"] = len(self.passes)
            tracing.record("inference", self.parent, tracing.epoch_ns(started), ended, attributes, self.passes)

    def fail(self, error: BaseException) -> None:
        self.failed = True  # its entries still queued are dropped, not computed
        try:
            self.loop.call_soon_threadsafe(_reject, self.future, error)
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass


def settle(tickets: Sequence[Ticket]) -> None:
    """On the inference thread: hand finished tickets their results, with one wake-up of each event loop
    for a whole pass rather than one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Sequence[Any]]]] = {}
    for ticket in tickets:
        by_loop.setdefault(ticket.loop, []).append((ticket.future, ticket.results))
    for loop, finished in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, finished)
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass


def _resolve_all(finished: list[tuple[asyncio.Future[Any], Sequence[Any]]]) -> None:
    for future, value in finished:
        if not future.done():
            future.set_result(value)


def _reject(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


@dataclass(eq=False, slots=True)
class Entry:
    """A batched task's texts not yet taken (entries of many requests share a pass; a pass may take some of them),
    or a whole task of another kind (a pass of its own)."""

    ticket: Ticket
    index: int  # its first text's position among its request's texts (0 for a kind that is not batched)
    kind: TaskKind
    texts: Sequence[TokenSequence]
    options: Options
    batched: bool
    lengths: list[int]  # each text's tokens (batched); the task's longest text's alone otherwise ([0] for none)
    tokens: int = 0  # its longest text's tokens

    def __post_init__(self) -> None:
        self.tokens = max(self.lengths)

    @property
    def large(self) -> bool:
        """A pass that holds the most memory: it waits at the gate of large passes (``LargePasses``)."""
        return KINDS[self.kind].large

    @property
    def n_texts(self) -> int:
        """The texts it counts for in the queue: its own for a batched kind, one for any other."""
        return len(self.lengths)

    def split(self, n: int) -> Entry:
        """Its first ``n`` texts as an entry of their own; this one keeps the rest."""
        head = Entry(self.ticket, self.index, self.kind, self.texts[:n], self.options, True, self.lengths[:n])
        self.index += n
        self.texts, self.lengths = self.texts[n:], self.lengths[n:]
        self.tokens = max(self.lengths)
        return head


def entry(ticket: Ticket, task: Task) -> Entry:
    """A task as a queue entry."""
    texts = task.texts
    lengths = texts.lengths() if isinstance(texts, PackedTokens) else [len(text.ids) for text in texts]
    if not task.batched:
        lengths = [max(lengths, default=0)]
    return Entry(ticket, 0, task.kind, texts, task.options, task.batched, lengths)


def texts_in(entries: Sequence[Entry]) -> int:
    """The texts a pass of ``entries`` counts for (``Entry.n_texts``)."""
    return sum(entry.n_texts for entry in entries)


class WorkQueue:
    """Entries waiting for the inference thread, in arrival order, and the rule that cuts them into passes."""

    def __init__(
        self,
        max_batch_tokens: int = 16384,
        max_batch_size: int = 256,
        max_wait: float = 0.0,
        on_drop: Callable[[int], None] | None = None,  # (entries) dropped because their request was gone
        lanes: int = 1,  # passes of this queue that can be taken at once (its worker's threads)
        balance_wait: float = BALANCE_WAIT_S,
        large_passes: LargePasses = LARGE_PASSES,
        passes: int | None = None,  # of those, how many compute side by side (the model's bound); ``lanes`` if None
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait  # how long an idle worker waits for more entries while a pass has room
        self.lanes = lanes
        self.passes = lanes if passes is None else max(1, min(passes, lanes))
        self.balance_wait = balance_wait
        self.on_drop = on_drop
        self.dropped = 0  # texts dropped unseen, over the queue's life
        self._entries: deque[Entry] = deque()
        self._queued = 0  # the texts of the entries queued
        self._condition = threading.Condition()
        self._closed = False
        self._computing = 0  # texts taken for passes that have not finished
        self.large_passes = large_passes
        large_passes.watch(self)

    # ---- the event loop's side ----

    async def run(self, task: Task, timing: Timing | None = None) -> Sequence[Any]:
        """The task's results: one per text, in the request's order, for a batched kind; else its one result."""
        return await self.submit(task, timing)

    def submit(self, task: Task, timing: Timing | None = None) -> asyncio.Future[Sequence[Any]]:
        """The task queued now (QueueClosed once the queue is closed), its results' future (``run``'s value): cancelled,
        its texts not yet taken are dropped unseen. Where the calling context is traced, its queue and inference spans
        are recorded once the future is done. ``timing``: by default the calling request's (``REQUEST_TIMING``)."""
        loop = asyncio.get_running_loop()
        parent = tracing.current()
        timing = REQUEST_TIMING.get() if timing is None else timing
        ticket = Ticket(loop, len(task.texts) if task.batched else 1, timing, parent)
        if task.batched and not task.texts:
            ticket.future.set_result([])
            return ticket.future
        self.put([entry(ticket, task)])
        if parent is not None:
            ticket.future.add_done_callback(lambda _: ticket.traced(task.kind, len(task.texts)))
        return ticket.future

    async def run_in_turn(self, tasks: Sequence[Task], timing: Timing | None = None) -> list[Any]:
        """The one result of each task (none batched), each queued only once the one before it is done, so that
        the requests that arrive meanwhile are computed between them (the slices of a large inspection request
        do not hold the model for its whole length), and nothing more is queued once the request fails or is
        gone."""
        timing = REQUEST_TIMING.get() if timing is None else timing
        results = []
        for task in tasks:
            assert not task.batched, "run_in_turn takes tasks that run alone"
            part = Timing()
            (result,) = await self.run(task, part)
            results.append(result)
            if timing is not None:
                timing.queue_s += part.queue_s
                timing.inference_s += part.inference_s
        return results

    def put(self, entries: Sequence[Entry]) -> None:
        with self._condition:
            if self._closed:
                raise QueueClosed()
            self._entries.extend(entries)
            self._queued += texts_in(entries)
            if self.lanes > 1:
                self._condition.notify_all()  # a worker waiting for its share re-counts
            else:
                self._condition.notify()

    def pending(self) -> int:
        """Texts waiting for the inference thread."""
        return self._queued

    def computing(self) -> int:
        """Texts taken for passes that have not finished."""
        return self._computing

    def alone(self, entries: Sequence[Entry]) -> bool:
        """Whether the pass of ``entries`` is all this queue has: nothing queued that could start (large passes
        waiting at a full gate cannot), no other pass taken."""
        with self._condition:
            gate = self.large_passes
            startable = any(not entry.large or gate.running < gate.passes for entry in self._entries)
            return not startable and self._computing == texts_in(entries)

    def wake(self) -> None:
        """Look at the queue again (a place at the gate of large passes came free)."""
        with self._condition:
            self._condition.notify_all()

    def close(self) -> None:
        """Take no more entries; the worker finishes what is queued, then stops."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    # ---- the inference thread's side ----

    def take(self, timeout: float | None = None) -> list[Entry] | None:
        """The next pass: one entry that runs alone, or entries of one batched kind up to the budget (and, with several
        lanes, up to the fair share). Call ``finished`` with its texts (``texts_in``) once it is computed.

        Blocks until there is work; returns [] if ``timeout`` seconds pass first, None once the queue is
        closed and empty.
        """
        with self._condition:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                while not self._entries and not self._closed:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return []
                    self._condition.wait(left)
                if not self._entries:
                    return None  # closed, nothing left
                if self.max_wait > 0:
                    self._linger()
                if self.lanes > 1:
                    self._balance()
                    if not self._entries and not self._closed:
                        continue  # the entries were dropped, or taken, while waiting: wait again
                batch = self._cut(self._fair_share())
                if batch:
                    taken = texts_in(batch)
                    self._computing += taken
                    self._queued -= taken
                    return batch
                if self._entries:  # all at the gate of large passes (closed or not): wait for a place
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return []
                    self._condition.wait(left)
                # everything at the head was dropped or waited: look again

    def finished(self, n_texts: int, large: bool = False) -> None:
        """A pass of ``n_texts`` taken from the queue is done (computed or failed); ``large``: it was a large pass,
        whose place at the gate is now free."""
        with self._condition:
            self._computing -= n_texts
            if self.lanes > 1:
                self._condition.notify_all()
        if large:
            self.large_passes.leave()

    def _fair_share(self) -> int:
        """The most texts one pass takes: all it may, or with several lanes their share of what is queued
        and computing, divided among the passes that compute side by side (``passes``: a lone request's texts in
        as many passes as compute at once, none left to compute alone after them; condition held)."""
        if self.lanes == 1:
            return self.max_batch_size
        share = -(-(self._computing + self._queued) // self.passes)  # ceiling
        return max(1, min(self.max_batch_size, share))

    def _balance(self) -> None:
        """While another pass of this queue computes, wait up to ``balance_wait`` until the queue holds a fair
        share, rounded down (condition held): three texts split two and one without a wait for a fourth.
        Inspection entries run alone and do not wait."""
        deadline = time.monotonic() + self.balance_wait
        while self._computing and self._entries and not self._closed:
            queued = self._queued
            if not self._entries[0].batched or queued >= (self._computing + queued) // self.lanes:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._condition.wait(left)

    def _linger(self) -> None:
        """Wait up to ``max_wait`` for more entries while the pass has room (condition held)."""
        deadline = time.monotonic() + self.max_wait
        while self._queued < self.max_batch_size and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0 or not self._entries or not self._entries[0].batched:
                return  # (another worker may have taken every entry meanwhile)
            self._condition.wait(left)

    def _cut(self, limit: int) -> list[Entry]:
        """At most ``limit`` texts for one pass, from the head (condition held); gone entries are dropped on the
        way. The last entry of a batched pass may be cut: its first texts go, the rest stays at the head."""
        batch: list[Entry] = []
        rows = longest = 0
        dropped = 0
        entries = self._entries
        budget = self.max_batch_tokens
        at = 0  # entries before it wait at the gate of large passes: the pass is cut from those after them
        while at < len(entries) and rows < limit:
            entry = entries[at]
            if entry.ticket.gone():
                del entries[at]
                dropped += entry.n_texts
                continue
            if not entry.batched:
                if batch:
                    break
                if entry.large and not self.large_passes.enter():
                    at += 1  # it waits for a place; what is behind it need not
                    continue
                del entries[at]
                batch.append(entry)
                break
            if batch and entry.kind != batch[0].kind:
                break  # each batched kind (embedding, classification) takes passes of its own
            n = entry.n_texts
            longest_with = max(longest, entry.tokens)
            if rows + n <= limit and longest_with * (rows + n) <= budget:
                del entries[at]  # the whole of it
                batch.append(entry)
                rows, longest = rows + n, longest_with
                continue
            fits = 0  # else as many of its first texts as the pass holds (one at least, where the pass has none)
            for length in entry.lengths[: limit - rows]:
                longest_with = max(longest, length)
                if rows + fits and longest_with * (rows + fits + 1) > budget:
                    break
                fits, longest = fits + 1, longest_with
            if fits == n:  # (one text longer than the budget, alone in its pass)
                del entries[at]
                batch.append(entry)
            elif fits:
                batch.append(entry.split(fits))
            break  # the pass is full
        if dropped:
            self._queued -= dropped
            self.dropped += dropped
            if self.on_drop is not None:
                self.on_drop(dropped)
        return batch
