"""A real `uvicorn app.main:app` process on 127.0.0.1, for tests that need sockets (and a browser)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


@contextmanager
def running_server(env: dict[str, str] | None = None, timeout: float = 120.0) -> Iterator[str]:
    """Start the service with extra environment variables; yield its base URL once /health is 200."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not become ready"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
