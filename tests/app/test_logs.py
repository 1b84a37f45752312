"""The service's log handler: lines batched, in order, whole, warnings at once."""

from __future__ import annotations

import json
import logging
import os
import select
import threading
import time

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
