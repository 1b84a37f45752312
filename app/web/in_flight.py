"""The requests an event loop works on, each with a deadline, looked at by one sweeping task rather than by timers
of their own: the responder's (a request's deadline, its client's leaving) and the body timeout's (a body that must
arrive in time)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from starlette.requests import Request

# How long a request runs before a task watches for its client's leaving. Most are answered sooner and never need one:
# a task a request, started and cancelled, cost the front ends several per cent of their CPU under many small
# requests. A client that leaves sooner is noticed then, its texts computed meanwhile if their turn came.
WATCH_AFTER_S = 0.1
TICK_S = 0.05  # how often the requests in flight are looked at: a deadline is kept, and a watch starts, within a tick


class Flight:
    """A request being worked on: its task, its deadline and, for HTTP, its request, watched from ``watch_at``."""

    __slots__ = ("task", "deadline", "watch_at", "request", "watcher", "reason")

    def __init__(self, task: asyncio.Task[Any], deadline: float, watch_at: float, request: Request | None) -> None:
        self.task, self.deadline, self.watch_at, self.request = task, deadline, watch_at, request
        self.watcher: asyncio.Task[None] | None = None
        self.reason: str | None = None  # why InFlight cancelled its task: "deadline" or "gone"


class InFlight:
    """The requests an event loop works on, looked at every TICK_S by one task that runs while any is in flight,
    rather than by two timers a request, a deadline's and the connection watch's: those cost 6.7 µs of the loop a
    request (``asyncio.timeout`` 4.3, ``call_later`` and its cancel 2.4), an entry here about 1 (measured in process,
    100,000 requests; docs/benchmarks/host-path.md).

    Past its deadline a request's task is cancelled (``Responder.run`` answers 503 timeout, ``BodyTimeout`` 408); one
    entered with its HTTP request and that has run WATCH_AFTER_S gets a task that watches its client's connection,
    and the client gone, the request's task is cancelled (its queued texts are then never computed;
    ``Responder.answer`` answers 499). ``Flight.reason`` says which, where InFlight cancelled it."""

    def __init__(self) -> None:
        self.flights: set[Flight] = set()
        self.sweeper: asyncio.Task[None] | None = None

    def enter(self, now: float, deadline: float, request: Request | None) -> Flight:
        """The calling task's request, in flight from ``now`` (its loop's time) until ``leave``."""
        task = asyncio.current_task()
        assert task is not None, "called from a task"
        flight = Flight(task, deadline, now + WATCH_AFTER_S if request is not None else math.inf, request)
        self.flights.add(flight)
        sweeper = self.sweeper
        if sweeper is None or sweeper.done() or sweeper.get_loop() is not task.get_loop():
            self.sweeper = task.get_loop().create_task(self.sweep())
        return flight

    def leave(self, flight: Flight) -> None:
        self.flights.discard(flight)
        if flight.watcher is not None:
            flight.watcher.cancel()

    async def sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self.flights:
            await asyncio.sleep(TICK_S)
            now = loop.time()
            for flight in list(self.flights):
                if flight.reason is not None or flight.task.get_loop() is not loop:
                    continue
                if flight.deadline <= now:
                    flight.reason = "deadline"
                    flight.task.cancel()
                elif flight.watch_at <= now and flight.watcher is None:
                    flight.watcher = loop.create_task(self.watch(flight))

    @staticmethod
    async def watch(flight: Flight) -> None:
        assert flight.request is not None
        await disconnected(flight.request)
        if flight.reason is None:
            flight.reason = "gone"
            flight.task.cancel()


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (a body not yet read is read and discarded first)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
