"""The service's log handler: lines batched, in order, whole, warnings at once."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time

import pytest

from app.logs import BufferedStderrHandler, JsonFormatter, TextFormatter


def read_available(fd: int, wait: float = 0.0) -> bytes:
    data = b""
    while select.select([fd], [], [], wait)[0]:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
        wait = 0.0
    return data


def pipe_logger(name: str, interval: float) -> tuple[logging.Logger, BufferedStderrHandler, int]:
    read, write = os.pipe()
    handler = BufferedStderrHandler(write, interval=interval, held=frozenset({f"app.access.{name}"}))
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("app.access").getChild(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, handler, read


def test_times_written_once_a_second_equal_loggings_own_across_seconds() -> None:
    """The text format's asctime as logging's Formatter writes it, the JSON's as time.strftime in UTC, for times within
    one second, across a second's and a minute's turn, and back again (a clock set back)."""
    form = "%(asctime)s %(levelname)s %(name)s %(message)s"
    text, json_lines, reference = TextFormatter(form), JsonFormatter(), logging.Formatter(form)
    start = 1_764_800_000.0  # 2025-12-03T22:13:20Z
    for offset in (0.001, 0.5, 0.999, 1.0, 59.9996, 60.25, 0.75):
        created = start + offset
        record = logging.LogRecord("app.access", logging.INFO, __file__, 1, "a line", (), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert text.format(record) == reference.format(record)
        written = json.loads(json_lines.format(record))["time"]
        assert written == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(record.msecs):03d}Z"


def test_request_lines_wait_and_any_other_line_writes_everything_at_once() -> None:
    logger, handler, read = pipe_logger("timing", interval=30.0)
    logger.info("first")
    logger.info("second")
    assert read_available(read) == b""  # held
    logger.warning("third")
    assert read_available(read, 1.0) == b"INFO first\nINFO second\nWARNING third\n"
    logger.info("fourth")
    other = logging.getLogger("test.logs.other")
    other.handlers[:] = [handler]
    other.propagate = False
    other.setLevel(logging.INFO)
    other.info("shutdown complete")  # not a request's line: written at once, after what was held
    assert read_available(read, 1.0) == b"INFO fourth\nINFO shutdown complete\n"


def test_held_lines_are_written_within_the_interval_and_on_flush() -> None:
    logger, handler, read = pipe_logger("interval", interval=0.05)
    logger.info("soon")
    assert read_available(read, 2.0) == b"INFO soon\n"  # within 2 s, or read_available gives up empty
    slow, slow_handler, slow_read = pipe_logger("flush", interval=30.0)
    slow.info("at exit")
    slow_handler.flush()  # what logging.shutdown does
    assert read_available(slow_read, 1.0) == b"INFO at exit\n"


def test_lines_of_several_writers_on_one_pipe_never_mix() -> None:
    """Two handlers on one pipe (as processes sharing standard error): every line arrives whole, each writer's in
    order, lines of every length up to a pipe's atomic write (PIPE_BUF; a longer line no writer can keep whole)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    lengths = [10, 300, 2000, select.PIPE_BUF - 6, 70]  # with the tag, index and newline: up to PIPE_BUF
    received = bytearray()
    done = threading.Event()

    def drain() -> None:
        while not done.is_set() or select.select([read], [], [], 0.2)[0]:
            if select.select([read], [], [], 0.05)[0]:
                received.extend(os.read(read, 1 << 20))

    reader = threading.Thread(target=drain)
    reader.start()

    def writer(tag: str) -> None:
        name = f"app.access.mix.{tag}"
        handler = BufferedStderrHandler(write, interval=0.01, held=frozenset({name}))
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for i in range(1000):
            length = lengths[i % len(lengths)]
            logger.info(f"{tag}{i:04d}" + tag * length)
        handler.flush()

    writers = [threading.Thread(target=writer, args=(tag,)) for tag in "ab"]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    lines = bytes(received).decode().splitlines()
    assert len(lines) == 2000
    for tag in "ab":
        mine = [line for line in lines if line[0] == tag]
        assert [int(line[1:5]) for line in mine] == list(range(1000))
        for line in mine:
            i = int(line[1:5])
            assert line == f"{tag}{i:04d}" + tag * lengths[i % len(lengths)]


SHORT_AND_LONG_WAY = """
import json, logging, sys, time
from app import logs
from app.web.middleware import RequestLog, access

logs.configure_logging("info", sys.argv[1])
time.time = lambda: 1_764_800_000.25  # one instant for both ways (the one LogRecord takes on 3.11)
time.time_ns = lambda: 1_764_800_000_250_000_000  # and on 3.12 and later
logs.request_id.set("4f1c2a")


class Timing:
    tokenization_s, queue_s, inference_s = 0.0001, 0.00231, 0.0004


scope = {"method": "POST", "path": "/encode", "state": {"timing": Timing()}}
assert logs.INFO_LINES is not None and logs.INFO_LINES.stands(access)  # the service's own configuration: short
RequestLog.log(scope, 200, 0.00123, "0af7651916cd43dd8448eb211c80319c")
keep_all = logging.Filter()
access.addFilter(keep_all)  # something on logging's way: it is taken
assert not logs.INFO_LINES.stands(access)
RequestLog.log(scope, 200, 0.00123, "0af7651916cd43dd8448eb211c80319c")
access.removeFilter(keep_all)
seen = []
caught = logging.Handler()
caught.emit = seen.append
logging.getLogger().addHandler(caught)  # a handler added to the root (a test's capture) gets the line
RequestLog.log(scope, 404, 0.002, None)
assert [record.getMessage() for record in seen] == ["POST /encode 404 2.0 ms"], seen
logging.getLogger().removeHandler(caught)
logging.getLogger().handlers[0].flush()
"""


@pytest.mark.parametrize("form", ["text", "json"])
def test_the_access_line_the_short_way_is_the_line_loggings_way_writes(form: str) -> None:
    """A request's line written the short way (app/logs.py's InfoLines) and the same through logging's own Logger,
    LogRecord, filter and formatter, at one instant, in each format: the same line; and with a handler added to the
    root, the record reaches it."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ".", "TZ": "UTC"}
    done = subprocess.run(
        [sys.executable, "-c", SHORT_AND_LONG_WAY, form], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 3, lines
    short, long, caught = lines
    assert short == long
    if form == "text":
        assert short == "2025-12-03 22:13:20,250 INFO app.access [4f1c2a] POST /encode 200 1.2 ms"
    else:
        assert json.loads(short) == {
            "time": "2025-12-03T22:13:20.250Z",
            "level": "info",
            "logger": "app.access",
            "message": "POST /encode 200 1.2 ms",
            "request_id": "4f1c2a",
            "method": "POST",
            "path": "/encode",
            "status": 200,
            "ms": 1.23,
            "tokenization_ms": 0.1,
            "queue_ms": 2.31,
            "inference_ms": 0.4,
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
        }
    assert "404 2.0 ms" in caught
