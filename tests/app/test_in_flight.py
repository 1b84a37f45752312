"""The requests in flight (app/web/responding.py's InFlight): deadlines kept by one sweeping task, not a timer each."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.engine.admission import Admission
from app.errors import Timeout
from app.metrics import Metrics
from app.web.responding import TICK_S, Responder
from tests.helpers import wait_until


def responder(timeout_s: float) -> Responder:
    metrics = Metrics()
    return Responder(Admission(None, lambda: None, metrics), metrics, timeout_s)


async def never() -> None:
    await asyncio.Event().wait()


async def test_a_deadline_is_kept_and_the_sweeping_stops_once_nothing_is_in_flight() -> None:
    answering = responder(0.2)
    started = time.perf_counter()
    with pytest.raises(Timeout, match="not answered within 0.2 s"):
        await answering.run(never)
    waited = time.perf_counter() - started
    assert 0.2 <= waited < 1.0, waited  # never before the deadline; soon after it (a tick, and a busy machine's delay)
    assert answering.admission.admitted == 0 and not answering.in_flight.flights
    sweeper = answering.in_flight.sweeper
    assert sweeper is not None
    await wait_until(sweeper.done, timeout=5.0)  # it stops at its next tick: nothing is left to sweep
    assert (await answering.run(lambda: asyncio.sleep(0, "again")))[0] == "again"  # a new sweeper, as needed


async def test_requests_in_flight_at_once_each_keep_their_own_deadline() -> None:
    short, long = responder(0.1), responder(0.4)
    timed_out, answered = await asyncio.gather(
        short.run(never), long.run(lambda: asyncio.sleep(0.25, "done")), return_exceptions=True
    )
    assert isinstance(timed_out, Timeout)
    assert not isinstance(answered, BaseException) and answered[0] == "done"


async def test_a_cancellation_from_elsewhere_is_not_taken_for_the_deadline() -> None:
    """A request's task cancelled by someone else (a shutdown) before its deadline: cancelled, not a 503, and no
    longer in flight."""
    answering = responder(5)
    task = asyncio.ensure_future(answering.run(never))
    await asyncio.sleep(TICK_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not answering.in_flight.flights
