"""Admission: how many texts the service holds at once (queued or computing), for the whole process.

Past the bound a request is refused at once (``QueueFull``: 429 ``overloaded`` over HTTP) with a Retry-After estimated
from the measured compute rate, instead of waiting behind work it would time out on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.engine.errors import QueueFull
from app.metrics import Metrics


class Admission:
    """The one bound on the texts the service holds. Where the engine is a process of its own, a front end's
    admission has no ``limit`` (None): it counts its requests' texts, and the engine holds the bound for every
    front end's tasks at once (app/engine/remote.py, ``Engine.start``), refusing past it as here."""

    def __init__(self, limit: int | None, seconds_per_text: Callable[[], float | None], metrics: Metrics) -> None:
        self.limit = limit
        self.seconds_per_text = seconds_per_text  # the recent compute cost of a text, None before any
        self.admitted = 0  # texts admitted and not yet answered
        metrics.admitted_texts.set_function(lambda: self.admitted)

    @contextmanager
    def admit(self, n_texts: int) -> Iterator[None]:
        """Count a request's texts in for the duration of the block (``enter``, then ``leave``)."""
        self.enter(n_texts)
        try:
            yield
        finally:
            self.leave(n_texts)

    def enter(self, n_texts: int) -> None:
        """Count a request's texts in until ``leave``; QueueFull when they would pass the limit.

        A single request larger than the whole limit is still admitted when nothing else is in, so that a
        limit below max_batch_texts cannot make a valid request impossible.
        """
        if self.limit is not None and self.admitted and self.admitted + n_texts > self.limit:
            raise QueueFull(
                f"the work queue is full ({self.admitted} texts in, at most {self.limit}); retry after the "
                "Retry-After seconds",
                retry_after_s=self.retry_after(),
            )
        self.admitted += n_texts

    def leave(self, n_texts: int) -> None:
        """Count out the texts of a request ``enter`` counted in (answered, failed or gone)."""
        self.admitted -= n_texts

    def retry_after(self) -> int:
        """Seconds until what is admitted has likely been computed (1 to 60)."""
        seconds_per_text = self.seconds_per_text()
        if seconds_per_text is None:
            return 1
        return max(1, min(60, round(self.admitted * seconds_per_text)))
