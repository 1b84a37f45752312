"""A real `uvicorn app.main:app` process on 127.0.0.1, for tests that need sockets (and a browser)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict[str, str] | None = None, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start the service with extra environment variables; return it and its URL once /health is 200.

    Its output goes to a file (``server_log(process)``), never a pipe: a pipe nobody reads fills up and
    blocks the server at its next log line.
    """
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="encoder-service-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdout=log, stderr=subprocess.STDOUT,
    )
    process.log_path = Path(log.name)  # type: ignore[attr-defined]
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the service exited during start-up: {server_log(process)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("uvicorn did not become ready")
        time.sleep(0.1)


def server_log(process: subprocess.Popen) -> str:
    return process.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def rss_mib(process: subprocess.Popen) -> float:
    """Resident memory of a process, in MiB."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextmanager
def running_server(env: dict[str, str] | None = None, timeout: float = 120.0) -> Iterator[str]:
    """The service in its own process for the duration of the block; yields its base URL."""
    process, url = start_server(env, timeout)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
