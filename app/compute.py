"""The compute thread: the one thread of the process on which the service runs torch.

Loading and warming up models, every model's passes and the few tensor computations of the routes all
run here. The reason is OpenMP, which torch's CPU kernels and MKL parallelise with: a thread that opens a
parallel region gets a team of worker threads of its own, kept for as long as it lives. libgomp lets
those workers spin between parallel regions (they resume within microseconds) only while the process has
no more OpenMP threads than CPUs; once a second thread has run torch ops, there are more, and every
barrier of every operator from then on puts the workers to sleep and wakes them through the kernel. A
one-text pass of all-MiniLM-L6-v2 on 2 cores took 38 ms with a second team alive, 17 ms without
(BENCHMARKS.md). Model inference threads therefore hand their passes to this thread instead of running
them; one model computes at a time, as it would on cores that two models share anyway.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str = "compute") -> None:
        self._ident: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=self._started)

    def _started(self) -> None:
        self._ident = threading.get_ident()
        torch.set_grad_enabled(False)  # grad mode is per thread: nothing here is ever differentiated

    def on_it(self) -> bool:
        """Whether the calling thread is the compute thread."""
        return threading.get_ident() == self._ident

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the compute thread, waiting for it (from any thread but the event loop's)."""
        if self.on_it():
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    async def run_async(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the compute thread, awaited from the event loop."""
        return await asyncio.wrap_future(self._executor.submit(fn, *args))


COMPUTE = ComputeThread()  # one per process: OpenMP's thread budget is the process's
