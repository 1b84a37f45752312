"""What the services ask of the engine, whichever process computes: one interface, two implementations chosen
once at start. In the process that computes, a model's ``Computing`` (worker.py: its queue and inference threads);
in a front end, its ``EngineQueue`` (remote.py), which sends the same tasks over the socket with the time their
requests have left.
And what the engine asks of the served models (``Models``; app/serving/registry.py's ``ModelRegistry``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from app.engine.messages import ModelFacts, Task, Timing


class Runner(Protocol):
    async def run(self, task: Task, timing: Timing | None = None) -> Sequence[Any]:
        """The task's results, one per text (or one for a task that is not batched), once computed; ``timing`` is
        given where and how long it waited and computed, and carries the request's deadline: by default the calling
        request's (``REQUEST_TIMING``, which the responder sets for the request's work)."""
        ...

    def submit(self, task: Task, timing: Timing | None = None) -> asyncio.Future[Sequence[Any]]:
        """The task queued at once, the future of ``run``'s value: for a caller that answers from a callback (the
        engine's connections) rather than from a task of its own. Cancelling the future drops the task."""
        ...

    async def run_in_turn(self, tasks: Sequence[Task], timing: Timing | None = None) -> list[Any]:
        """Each task's results in order, the tasks queued one after another (an inspection's slices)."""
        ...

    def pending(self) -> int:
        """Texts queued or computing: what /health and the graceful stop wait on."""
        ...

    def stopped(self) -> str | None:
        """What has stopped computing the model's tasks that should not, short of shutdown (None while it
        computes): its inference threads here, or the engine."""
        ...

    def computed(self) -> tuple[int, float]:
        """The texts computed in this process and the seconds their passes took ((0, 0.0) where another computes)."""
        ...

    def close(self) -> None:
        """Finish what is queued here and stop computing."""
        ...


class Served(Protocol):
    """A served model as the engine sees it: its name, its facts, and the queue its tasks go through."""

    @property
    def name(self) -> str: ...

    @property
    def facts(self) -> ModelFacts: ...

    @property
    def queue(self) -> Runner: ...


class Models(Protocol):
    """The served models: each by name (the default for None), and all of them."""

    def get(self, name: str | None = None) -> Served: ...

    def __iter__(self) -> Iterator[Served]: ...
