"""What the services ask of the engine, whichever process computes: one interface, two implementations chosen
once at start. In the process that computes, a model's ``WorkQueue`` (work_queue.py); in a front end, its
``EngineQueue`` (remote.py), which sends the same tasks over the socket with the time their requests have left."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from app.engine.messages import Task
from app.engine.work_queue import Timing


class Runner(Protocol):
    async def run(self, task: Task, timing: Timing | None = None) -> list[Any]:
        """The task's results, one a text (or one for a task that is not batched), once computed; ``timing`` is
        given where and how long it waited and computed, and carries the request's deadline."""
        ...

    async def run_in_turn(self, tasks: Sequence[Task], timing: Timing | None = None) -> list[Any]:
        """Each task's results in order, the tasks queued one after another (an inspection's slices)."""
        ...

    def pending(self) -> int:
        """Texts queued or computing: what /health and the graceful stop wait on."""
        ...
