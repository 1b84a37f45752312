"""The inference threads: each takes a pass of entries from the queue, runs it on the model, answers each entry.

A pass holds entries of one task kind, and runs through that kind's function of the loaded model
(model/runtime/tasks.py), declared with the kind (app/engine/messages.py, ``KINDS``): the one place where a kind meets
the model.

One thread per compute lane for each model (app/engine/compute.py), so that a model may compute as many passes at
once as there are lanes, and the event loop never waits on it; the passes themselves run on the lanes,
where all of the service's torch work runs. A failure stays with the requests it concerns: a pass that
raises is retried request by request, and a request that fails alone gets ComputeFailed (503 ``inference_failed``); the
threads themselves outlive every failure. When the queue has just emptied and no pass is running, an idle
hook runs (by default glibc's malloc_trim, which hands the heap that batches took back to the system); once it has
stayed empty for SETTLE_AFTER_S, a settled hook (the service's: the model's compiled passes hand back what they keep
for the shapes they met) and the idle hook again.

Why a thread that hands its pass to a lane rather than computing it: OpenMP keeps a team of worker threads for
every thread that computes wide (app/engine/compute.py), so only the lanes compute. Computing each pass on the
inference thread that took it, with one torch thread and no hand-over, was measured at 1.05× the requests/s and
0.96× the CPU a request (within the rounds' spread) on the model where the hand-over weighs most, 32 clients × 1
text (docs/benchmarks/cpu-passes.md, "The hand-over to the compute lanes, measured before removing it (CPU)"): the
hand-over costs next to nothing, and the lanes' design (a lone request computed wide, passes side by side under
load) needs it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import tracing
from app.allocator import malloc_trim
from app.engine.compute import COMPUTE
from app.engine.errors import ComputeFailed
from app.engine.messages import KINDS, Task, TaskKind, Timing
from app.engine.work_queue import Entry, Ticket, WorkQueue, settle, texts_in
from model import PackedTokens, TokenSequence

if TYPE_CHECKING:
    from model import TextEncoder

logger = logging.getLogger(__name__)

IDLE_INTERVAL_S = 2.0  # the idle hook runs at most this often, and only after work
# After this long with no work, the model's compiled passes hand back what they keep for the shapes of the burst
# (TextEncoder.release_memory): not sooner, since the next pass then prepares its shape again.
SETTLE_AFTER_S = 5.0


def compute(model: TextEncoder, kind: TaskKind, texts: Sequence[TokenSequence], options: Any) -> Sequence[Any]:
    """One pass of one kind (on a compute lane): its declared pass (app/engine/messages.py, ``KINDS``)."""
    return KINDS[kind].compute(model, texts, options)


MALLOC_TRIM = malloc_trim()


def counted(hook: Callable[[], None] | None, count: Callable[[], None]) -> Callable[[], None] | None:
    """``hook``, counting each time it has run (None where there is no hook)."""
    if hook is None:
        return None

    def run() -> None:
        hook()
        count()

    return run


@dataclass
class WorkerStats:
    passes: int = 0  # forward passes of embedding entries
    texts: int = 0  # texts computed in them
    padded_tokens: int = 0  # rows × longest row, summed over passes
    real_tokens: int = 0
    compute_seconds: float = 0.0  # time spent in those passes


class Worker:
    """The thread that runs a model's passes."""

    def __init__(
        self,
        queue: WorkQueue,
        model: TextEncoder,
        on_pass: Callable[[int, int, float], None] | None = None,  # (texts, real tokens, seconds) per pass
        on_idle: Callable[[], None] | None = MALLOC_TRIM,
        on_settled: Callable[[], None] | None = None,  # after SETTLE_AFTER_S without work, once
        name: str = "inference",
        threads: int = 1,  # passes computed at once: one thread for each compute lane
    ) -> None:
        self.queue = queue
        self.model = model
        self.on_pass = on_pass
        self.on_idle = on_idle
        self.on_settled = on_settled
        self.stats = WorkerStats()
        self._lock = threading.Lock()  # guards stats
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}" if threads > 1 else name, daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish what is queued, then end the threads."""
        self.queue.close()
        for thread in self._threads:
            thread.join(timeout)
        stats = self.stats
        if stats.passes:
            logger.info(
                "worker stopped: %d texts in %d forward passes (%.1f a pass), %.0f%% of computed tokens were "
                "padding, %d texts dropped for requests gone",
                stats.texts,
                stats.passes,
                stats.texts / stats.passes,
                100 * (1 - stats.real_tokens / max(stats.padded_tokens, 1)),
                self.queue.dropped,
            )

    def _run(self) -> None:
        worked, last_idle = False, 0.0  # work done since the idle hook last ran, and when that was
        unsettled = False  # work done since the settled hook last ran
        while True:
            if worked:  # the idle hook once the queue empties, at most every IDLE_INTERVAL_S
                timeout: float | None = max(0.0, last_idle + IDLE_INTERVAL_S - time.monotonic()) if self.on_idle else 0
            elif unsettled and self.on_settled:  # the settled hook after SETTLE_AFTER_S without work
                timeout = max(0.0, last_idle + SETTLE_AFTER_S - time.monotonic())
            else:
                timeout = None
            entries: list[Entry] | None = []
            try:
                entries = self.queue.take(timeout)
                if entries is None:
                    return  # closed and drained
                if not entries and worked:  # idle since the last work
                    self._idle(self.on_idle)
                    worked, last_idle = False, time.monotonic()
                    continue
                if not entries:  # and quiet since for SETTLE_AFTER_S
                    self._idle(self.on_settled)
                    self._idle(self.on_idle)  # what the settled hook handed back, to the system
                    unsettled = False
                    continue
                worked = unsettled = True
                try:
                    if entries[0].batched:
                        self._batched(entries)
                    else:
                        self._alone(entries[0])
                finally:
                    self.queue.finished(texts_in(entries), large=entries[0].large)
            except BaseException:  # a bug outside the model: fail what is left of the pass, keep the thread
                logger.exception("the inference thread failed outside the model; it goes on")
                for ticket in _tickets(entries or []):
                    ticket.fail(ComputeFailed("the service failed to compute this request"))

    def _idle(self, hook: Callable[[], None] | None) -> None:
        if hook is None or self.queue.computing():  # another thread's pass would take what is handed back
            return
        try:
            hook()
        except Exception:
            logger.exception("the idle hook failed")

    def _batched(self, entries: Sequence[Entry]) -> None:
        """Texts of one batched kind from any number of requests, in one pass."""
        started = time.perf_counter()
        for ticket in _tickets(entries):
            ticket.start(started)
        texts = PackedTokens.joined([entry.texts for entry in entries])  # the pass pads them array by array
        options: list[Any] = []
        for entry in entries:
            options += [entry.options] * entry.n_texts
        try:
            results = COMPUTE.run(
                compute, self.model, entries[0].kind, texts, options, spread=self.queue.alone(entries)
            )
        except Exception:
            self._retry_alone(entries, self._batched)
            return
        ended = time.perf_counter()
        self._count(entries, ended - started)
        if tracing.TRACER is not None:
            traced_pass(entries, started, ended)
        done, at = [], 0
        for entry in entries:
            if entry.ticket.set(entry.index, results[at : at + entry.n_texts]):
                done.append(entry.ticket)
            at += entry.n_texts
        settle(done)

    def _alone(self, entry: Entry) -> None:
        """A task of a kind that runs alone is a pass of its own: a failure is its request's alone (the queue then
        drops the request's other entries unseen)."""
        started = time.perf_counter()
        entry.ticket.start(started)
        try:
            (result,) = COMPUTE.run(
                compute, self.model, entry.kind, entry.texts, entry.options, spread=self.queue.alone([entry])
            )
        except Exception:
            logger.exception("a %s pass failed: its request gets a 503", entry.kind)
            entry.ticket.fail(ComputeFailed("the model failed to compute this request"))
            return
        if tracing.TRACER is not None:
            traced_pass([entry], started, time.perf_counter())
        if entry.ticket.set(entry.index, [result]):
            settle([entry.ticket])

    def _retry_alone(self, entries: Sequence[Entry], run: Callable[[Sequence[Entry]], None]) -> None:
        """A pass failed: run each request's entries alone, so that one bad request fails only itself."""
        tickets = _tickets(entries)
        if len(tickets) == 1:
            logger.exception("a pass of %d texts of one request failed: that request gets a 503", texts_in(entries))
            tickets[0].fail(ComputeFailed("the model failed to compute this request"))
            return
        logger.warning(
            "a pass of %d texts from %d requests failed: retrying each request alone", texts_in(entries), len(tickets)
        )
        for ticket in tickets:
            run([entry for entry in entries if entry.ticket is ticket])

    def _count(self, entries: Sequence[Entry], seconds: float) -> None:
        rows, longest = texts_in(entries), max(entry.tokens for entry in entries)
        real = sum(sum(entry.lengths) for entry in entries)
        with self._lock:
            self._record(rows, longest, real, seconds)
        if self.on_pass is not None:
            self.on_pass(rows, real, seconds)

    def _record(self, rows: int, longest: int, real: int, seconds: float) -> None:
        stats = self.stats
        stats.passes += 1
        stats.texts += rows
        stats.padded_tokens += rows * longest
        stats.real_tokens += real
        stats.compute_seconds += seconds


def traced_pass(entries: Sequence[Entry], started: float, ended: float) -> None:
    """The pass's span, where a request it carried is traced: under the first such request's span, linked to every
    one, and each of their tickets given it (app/tracing.py)."""
    tickets = _tickets(entries)
    traced = [ticket.parent for ticket in tickets if ticket.parent is not None]
    if not traced:
        return
    rows = texts_in(entries)
    attributes = {
        "encoder.kind": entries[0].kind,
        "encoder.pass.texts": rows,
        "encoder.pass.requests": len(tickets),
        "encoder.pass.tokens": sum(sum(entry.lengths) for entry in entries),
        "encoder.pass.padded_tokens": rows * max(entry.tokens for entry in entries),
    }
    span = tracing.record("pass", traced[0], tracing.epoch_ns(started), tracing.epoch_ns(ended), attributes, traced)
    if span is not None:
        for ticket in tickets:
            if ticket.parent is not None:
                ticket.passes.append(span)


def _tickets(entries: Sequence[Entry]) -> list[Ticket]:
    """The distinct tickets of some entries, in order of first appearance."""
    return list({id(entry.ticket): entry.ticket for entry in entries}.values())


class Computing:
    """A model computed in this process, as the services run it (a ``Runner``): its queue and its inference threads."""

    def __init__(self, name: str, model: TextEncoder, queue: WorkQueue, worker: Worker) -> None:
        self.name, self.model, self.queue, self.worker = name, model, queue, worker

    async def run(self, task: Task, timing: Timing | None = None) -> Sequence[Any]:
        return await self.queue.run(task, timing)

    def submit(self, task: Task, timing: Timing | None = None) -> asyncio.Future[Sequence[Any]]:
        return self.queue.submit(task, timing)

    async def run_in_turn(self, tasks: Sequence[Task], timing: Timing | None = None) -> list[Any]:
        return await self.queue.run_in_turn(tasks, timing)

    def pending(self) -> int:
        return self.queue.pending()

    def stopped(self) -> str | None:
        return None if self.worker.alive() else f"the inference thread of {self.name}"

    def computed(self) -> tuple[int, float]:
        stats = self.worker.stats
        return stats.texts, stats.compute_seconds

    def close(self) -> None:
        self.worker.stop()
