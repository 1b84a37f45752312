"""The requests in flight (app/web/in_flight.py's InFlight): deadlines kept by one sweeping task, not a timer each;
the responder's and the body timeout's."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.engine.admission import Admission
from app.errors import Timeout
from app.metrics import Metrics
from app.web.in_flight import TICK_S
from app.web.middleware import BodyTimeout
from app.web.responding import Responder
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


def body_timeout(timeout_s: float) -> tuple[BodyTimeout, Send, list[Message], list[bytes]]:
    """A BodyTimeout around an app that records the bodies it is handed; a send that records the messages the layer
    sends, and the two records."""
    sent: list[Message] = []
    handed: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        handed.append((await receive())["body"])

    async def record(message: Message) -> None:
        sent.append(message)

    return BodyTimeout(app, timeout_s, max_bytes=1000), record, sent, handed


async def stalls() -> Message:
    """A client whose body never comes."""
    await asyncio.Event().wait()
    raise AssertionError("never")


SCOPE = {"type": "http", "method": "POST", "path": "/encode", "headers": [(b"content-length", b"20")]}


async def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_one_that_does_is_handed_on() -> None:
    layer, record, sent, handed = body_timeout(0.1)

    started = time.perf_counter()
    await layer(SCOPE, stalls, record)
    waited = time.perf_counter() - started
    assert sent[0]["status"] == 408 and b'"request_timeout"' in sent[1]["body"], sent
    assert 0.1 <= waited < 1.0, waited  # within a tick of the deadline, and a busy machine's delay
    assert not handed and not layer.in_flight.flights
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"texts": ', "more_body": True},
        {"type": "http.request", "body": b'"in time"}'},
    ]
    parts = iter(messages)

    async def arrives() -> Message:
        return next(parts)

    await layer(SCOPE, arrives, record)
    assert handed == [b'{"texts": "in time"}'] and len(sent) == 2  # nothing more sent by the layer itself


async def test_a_body_read_cancelled_from_elsewhere_is_cancelled_not_answered() -> None:
    layer, record, sent, _ = body_timeout(5)

    task = asyncio.ensure_future(layer(SCOPE, stalls, record))
    await asyncio.sleep(TICK_S)
    task.cancel()  # a shutdown, before the deadline
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not sent and not layer.in_flight.flights
