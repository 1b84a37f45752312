"""Logging: text or JSON lines, every record carrying the id of the request it belongs to."""

from __future__ import annotations

import contextvars
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

# Attributes every LogRecord has; anything else on a record came through `extra=` and is kept in JSON.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class SecondsKept:
    """A time's text to the second, as ``strftime`` writes it through ``convert``, kept for the second it names:
    a line a request asks it many times a second."""

    def __init__(self, form: str, convert: Callable[[float], time.struct_time]) -> None:
        self.form = form
        self.convert = convert
        self.second = -1
        self.text = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self.second:
            self.text = time.strftime(self.form, self.convert(second))
            self.second = second
        return self.text


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class TextFormatter(logging.Formatter):
    """logging's own Formatter, its asctime (local time, to the millisecond) written once a second."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)
        self.seconds = SecondsKept(self.default_time_format, time.localtime)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return f"{self.seconds(record.created)},{int(record.msecs):03d}"  # as default_msec_format writes it

    def info_line(self, created: float, name: str, message: str, extra: dict[str, Any]) -> str:
        """The line ``format`` writes for an info record of ``name`` (TEXT_FORMAT's, its extra fields not in it)."""
        milliseconds = int((created - int(created)) * 1000)
        return f"{self.seconds(created)},{milliseconds:03d} INFO {name} [{request_id.get()}] {message}"


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.seconds = SecondsKept("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": f"{self.seconds(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()

    def info_line(self, created: float, name: str, message: str, extra: dict[str, Any]) -> str:
        """The line ``format`` writes for an info record of ``name`` with these ``extra`` fields."""
        entry: dict[str, Any] = {
            "time": f"{self.seconds(created)}.{int((created - int(created)) * 1000):03d}Z",  # as LogRecord's msecs
            "level": "info",
            "logger": name,
            "message": message,
            "request_id": request_id.get(),
        }
        entry.update(extra)
        return orjson.dumps(entry, default=str).decode()


# How long an info line may wait before it is written (warnings and errors are written at once), and how many bytes.
FLUSH_INTERVAL_S = 0.1
BUFFER_BYTES = 1 << 16
HELD_LOGGERS = frozenset({"app.access"})  # the line every request writes


class BufferedStderrHandler(logging.Handler):
    """Log lines written to standard error; the per-request lines (the ``held`` loggers' info lines) in batches, at
    most ``interval`` seconds after they were logged. Any other line is written at once, with what is held before
    it: start-up, shutdown, warnings, errors.

    A line a request is a system call a request when each is written on its own: under many small requests that
    cost the event loop more than the rest of the request's logging (docs/benchmarks/host-path.md, "The hot
    routes' short way in, request lines in batches, one task a request (CPU)"). A process that exits (even
    by the signal uvicorn raises again once it has shut down, which skips Python's exit) logs its shutdown lines
    last, and they carry every held line out before them. A batch goes out in writes of
    whole lines of at most PIPE_BUF bytes, each atomic on a pipe, so that the lines of processes sharing one
    (a supervisor, its front ends and engine) never mix. What a process killed outright (SIGKILL) had not yet
    written is lost: at most ``interval`` seconds of info lines.
    """

    def __init__(self, fd: int, interval: float = FLUSH_INTERVAL_S, held: frozenset[str] = HELD_LOGGERS) -> None:
        super().__init__()
        self.fd = fd
        self.held = held
        self.interval = interval
        self._pending: list[bytes] = []
        self._size = 0
        threading.Thread(target=self._flush_now_and_then, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        self._pending.append(line)  # the handler's lock is held (Handler.handle)
        self._size += len(line)
        if record.name not in self.held or record.levelno >= logging.WARNING or self._size >= BUFFER_BYTES:
            self._write()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()

    def hold(self, line: str) -> None:
        """A held logger's info line, formatted as this handler's formatter would (``InfoLines``)."""
        data = (line + "\n").encode("utf-8", "backslashreplace")
        with self.lock:  # type: ignore[union-attr]
            self._pending.append(data)
            self._size += len(data)
            if self._size >= BUFFER_BYTES:
                self._write()

    def _write(self) -> None:
        """Write what is pending (the lock held), whole lines at most PIPE_BUF bytes a write."""
        pending, self._pending, self._size = self._pending, [], 0
        chunk: list[bytes] = []
        size = 0
        for line in pending:
            if chunk and size + len(line) > select.PIPE_BUF:
                self._write_all(b"".join(chunk))
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        if chunk:
            self._write_all(b"".join(chunk))

    def _write_all(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError:  # standard error closed: nothing to tell anyone
            pass

    def _flush_now_and_then(self) -> None:
        while True:
            time.sleep(self.interval)
            if self._pending:
                self.flush()


class InfoLines:
    """A held logger's info lines (app.access's: a line a request) written the short way, while the service's own
    configuration stands: formatted straight from their message and fields by the service's formatter and held by
    its handler, without the LogRecord, the logger's and the handler's calls, filters and locks in between.

    The same line as logging's way writes (tests/app/test_logs.py), for about a sixth of the CPU (1.5 against 9.3 µs,
    in situ about 26 µs of a front end's one-text request, docs/benchmarks/host-path.md). Anything that could see or
    change a record on logging's way makes ``stands`` false and the line goes that way: a handler or filter added
    anywhere on it (a test's capture, an operator's own), another formatter, or a level above info."""

    def __init__(self, handler: BufferedStderrHandler, formatter: TextFormatter | JsonFormatter) -> None:
        self.handler = handler
        self.formatter = formatter
        self.filters = list(handler.filters)
        self.fields = isinstance(formatter, JsonFormatter)  # whether a line's extra fields are written at all

    def stands(self, logger: logging.Logger) -> bool:
        """Whether an info line of ``logger`` (enabled for info, as its caller knows) would meet nothing but the
        service's handler, filter and formatter on logging's way."""
        handler = self.handler
        if handler.formatter is not self.formatter or handler.filters != self.filters or handler.level > logging.INFO:
            return False
        node: logging.Logger | None = logger
        while node is not None and node.parent is not None:  # up to the root
            if node.handlers or node.disabled or not node.propagate or (node is logger and node.filters):
                return False
            node = node.parent
        return node is not None and node.handlers == [handler]

    def write(self, name: str, message: str, extra: dict[str, Any]) -> None:
        self.handler.hold(self.formatter.info_line(time.time(), name, message, extra))


INFO_LINES: InfoLines | None = None  # configure_logging's, for the held loggers


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Root logging for the service (uvicorn's own loggers propagate into it)."""
    global INFO_LINES
    try:
        handler: logging.Handler = BufferedStderrHandler(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # standard error is no file (a test's capture)
        handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handler.setFormatter(formatter)
    INFO_LINES = InfoLines(handler, formatter) if isinstance(handler, BufferedStderrHandler) else None
    # What neither format writes is not looked up for each record (the logging HOWTO's "Optimization"): the caller's
    # file and line (a walk up the stack), the thread, the process and its name.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):  # one format for everything
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # The service writes its own line per request (app.access, with the request id and timings).
    logging.getLogger("uvicorn.access").disabled = True
