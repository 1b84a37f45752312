"""The compute lanes: the few threads of the process on which the service runs torch.

Loading and warming up models, every model's passes and the few tensor computations of the routes all
run on a lane. The reason is OpenMP, which torch's CPU kernels and MKL parallelise with: a thread that opens
a parallel region gets a team of worker threads of its own, kept for as long as it lives. libgomp lets
those workers spin between parallel regions (they resume within microseconds) only while the process has
no more OpenMP threads than CPUs; once a second team is alive, every barrier of every operator puts the
workers to sleep and wakes them through the kernel. A one-text pass of all-MiniLM-L6-v2 on 2 cores took
38 ms with a second team alive, 17 ms without (docs/benchmarks/cpu-passes.md, "One compute thread, and the garbage
collector's stalls (CPU)").

Yet one pass at a time, its operators split across the cores, leaves much of a small CPU idle: every
operator ends in a barrier where the cores wait for the slowest, and a core that the event loop takes for a
moment holds up the other. Two passes side by side, each on one core, do not wait for each other: on 2
cores, passes of 16 texts ran at 152 texts/s that way against 137/s with both cores on each pass
(docs/benchmarks/cpu-passes.md, "Two compute lanes (CPU)"). So there are ``lanes`` threads, each computing with its
share of torch's threads. Lane 0 alone may compute a pass *wide*, with all of them, so that a lone request is answered
as fast as the cores allow: when no other lane is at work or waited for, nothing more is queued behind the pass (the
caller says so with ``spread``), and no pass has computed with a share beside another for ``quiet_s`` (so not under a
steady load, where the next pass is a moment away). A pass that computed with a share yet alone does not count: one
client's texts sent one after another, the first of them a moment after a burst, were otherwise each computed with a
share, the next always within ``quiet_s`` of the last, on one core of two (a text of 30 tokens 20 ms a pass instead
of 13.6). A wide pass has the cores to itself: work for the other lanes waits until it
ends, because a second pass beside it leaves three threads on two cores, and every barrier of the wide pass then waits
for a thread that is off its core (under load a one-text pass took 589 ms that way, against 18-32 ms without). With the
default share of one thread a lane on 2 cores, only lane 0 ever opens a team, so the process keeps one team and its
workers spin.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")

TORCH_THREADS = torch.get_num_threads()  # the process's intra-op threads (OMP_NUM_THREADS, else the cores)
QUIET_S = 0.05  # no pass with a share for this long: a pass may go wide

# oneDNN keeps a kernel (a primitive) for every shape of product it meets, and ideep, torch's layer over it, a
# computation with its own buffers: 1,024 of each by default. bfloat16 products on a CPU (`ENCODER_DTYPE=bfloat16`; with
# AMX) go through them, and a pass has as many rows as its real tokens, a new shape nearly every time: under make
# bench's loads the process kept about 1 GiB resident, 600 MiB more than under float32, whose products (MKL) use
# neither. With 32 of each it stayed at float32's level at the same speed (docs/benchmarks/cpu-runtimes.md, "Resident
# memory under bfloat16 autocast, and oneDNN's caches bounded (CPU)").
KERNEL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32", "LRU_CACHE_CAPACITY": "32"}


def bound_kernel_caches() -> None:
    """Bound oneDNN's and ideep's per-shape caches to KERNEL_CACHES, unless the environment sets them. The
    libraries read them once, at their first product: call it before any torch work."""
    for name, value in KERNEL_CACHES.items():
        os.environ.setdefault(name, value)


class _Lane:
    def __init__(self, index: int, name: str, threads: int) -> None:
        self.index = index
        self.busy = False
        self.threads = threads  # torch threads it computes with now
        self.company = False  # another pass computed while its pass did
        self.ident: int | None = None
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{name}-{index}", initializer=self._started
        )

    def _started(self) -> None:
        self.ident = threading.get_ident()
        torch.set_grad_enabled(False)  # grad mode is per thread: nothing here is ever differentiated
        torch.set_num_threads(self.threads)  # per thread with OpenMP: this lane's own count

    def use_threads(self, threads: int) -> None:
        """On the lane's thread: compute with ``threads`` torch threads from now on."""
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads = threads


class ComputeLanes:
    def __init__(
        self,
        name: str = "compute",
        lanes: int = 1,
        threads: int = TORCH_THREADS,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self.threads = max(1, threads)
        self.quiet_s = quiet_s
        self._clock = clock
        self._condition = threading.Condition()
        self._lanes: list[_Lane] = []
        self._share = self.threads
        self._wide = False  # a pass computes with every thread: nothing else starts
        self._waiting = 0  # callers waiting for a lane
        self._shared_until = -float("inf")  # when the last pass with a share beside another ended (monotonic)
        self.configure(lanes)

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    def share(self) -> int:
        """Torch threads a lane computes with while another lane is at work."""
        return self._share

    def configure(self, lanes: int) -> None:
        """Compute on ``lanes`` threads from now on (the current ones finish what they run, then end)."""
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        with self._condition:
            if len(self._lanes) == lanes:
                return
            old, self._lanes = self._lanes, []
            self._condition.wait_for(lambda: not any(lane.busy for lane in old))
            self._share = max(1, self.threads // lanes)
            self._lanes = [_Lane(i, self._name, self.threads if i == 0 else self._share) for i in range(lanes)]
            self._condition.notify_all()  # callers that came while there were no lanes
        for lane in old:
            lane.executor.shutdown(wait=True)

    def on_it(self) -> bool:
        """Whether the calling thread is one of the lanes."""
        ident = threading.get_ident()
        return any(lane.ident == ident for lane in self._lanes)

    def run(self, fn: Callable[..., T], *args: Any, spread: bool = True) -> T:
        """fn(*args) on the first free lane, waiting for one (from any thread but the event loop's); on the
        calling lane itself when called from one. ``spread``: the call may compute wide (False when more work
        is queued behind it)."""
        if self.on_it():
            return fn(*args)
        with self._condition:
            self._waiting += 1
            try:
                self._condition.wait_for(lambda: not self._wide and any(not lane.busy for lane in self._lanes))
            finally:
                self._waiting -= 1
            lane = next(lane for lane in self._lanes if not lane.busy)
            others = [other for other in self._lanes if other.busy]
            lane.busy, lane.company = True, bool(others)
            for other in others:
                other.company = True
            wide = (
                lane.index == 0
                and self.threads > self._share
                and spread
                and not self._waiting
                and sum(other.busy for other in self._lanes) == 1
                and self._clock() - self._shared_until > self.quiet_s
            )
            self._wide = wide
        try:
            return lane.executor.submit(self._call, lane, self.threads if wide else self._share, fn, args).result()
        finally:
            with self._condition:
                lane.busy = False
                if wide:
                    self._wide = False
                elif lane.company:
                    self._shared_until = self._clock()
                self._condition.notify_all()

    @staticmethod
    def _call(lane: _Lane, threads: int, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        lane.use_threads(threads)
        return fn(*args)


COMPUTE = ComputeLanes()  # one per process: OpenMP's thread budget is the process's; configured at start-up
