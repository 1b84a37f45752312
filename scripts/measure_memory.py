"""The service's resident memory, loaded and under load: the figures its memory requests and limits come from.

    .venv/bin/python scripts/measure_memory.py              the bundled model, with the default settings
    ENCODER_MODEL_DIR=/models/x .venv/bin/python scripts/measure_memory.py     another model (any ENCODER_*)

Starts the service (``uvicorn --factory app.main:create_app`` on a free 127.0.0.1 port, settings from the
environment), waits until /health is 200, reads its resident memory, then sends the largest work the
settings admit, concurrently: single short texts from 32 clients, batches of 64 texts as long as the
model takes from 4 clients (the biggest forward passes), /v1/embeddings with 128 long texts, /attention on
a long text and /tokenize of 256 long texts. Then it reads the peak (VmHWM) and the resident memory after
the load, and ``encoder_model_memory_bytes`` from /metrics, prints them, and stops the service. Standard
library only, so it runs in the serving environment as well as the development one. Linux only (/proc).
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the quick brown fox jumps over a lazy dog while every layer of the encoder attends to all tokens of "
    "a sentence and pools them into one vector for search ranking and clustering"
).split()


def text(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def post(url: str, path: str, body: dict[str, object]) -> None:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **auth()}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def auth() -> dict[str, str]:
    keys = [k.strip() for k in os.environ.get("ENCODER_API_KEYS", "").split(",") if k.strip()]
    return {"Authorization": f"Bearer {keys[0]}"} if keys else {}


def memory_mib(pid: int) -> dict[str, float]:
    """Resident memory now (VmRSS) and its peak so far (VmHWM), in MiB."""
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = int(value.split()[0]) / 1024
    return figures


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                sys.exit(f"the service exited during start-up ({server.returncode})")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                sys.exit("the service did not become ready in 10 minutes")
            time.sleep(0.2)
        ready = memory_mib(server.pid)

        rng = random.Random(0)
        jobs: list[tuple[str, dict[str, object]]] = [("/encode", {"texts": text(8 + i % 32, rng)}) for i in range(640)]
        jobs += [("/encode", {"texts": [text(300, rng) for _ in range(64)]}) for _ in range(12)]
        jobs += [("/v1/embeddings", {"input": [text(200, rng) for _ in range(128)]})]
        jobs += [("/attention", {"text": text(120, rng)}) for _ in range(5)]
        jobs += [("/tokenize", {"texts": [text(300, rng) for _ in range(256)]})]
        rng.shuffle(jobs)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=36) as pool:
            list(pool.map(lambda job: post(url, *job), jobs))
        seconds = time.monotonic() - started
        after = memory_mib(server.pid)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        models = re.findall(r'^encoder_model_memory_bytes\{model="([^"]+)"\} (\S+)$', metrics, re.M)
        print(f"ready: {ready['VmRSS']:.0f} MiB resident (peak during loading and warm-up {ready['VmHWM']:.0f} MiB)")
        print(f"load: {len(jobs)} requests in {seconds:.0f} s")
        print(f"peak under load (VmHWM): {after['VmHWM']:.0f} MiB; resident after it: {after['VmRSS']:.0f} MiB")
        for name, value in models:
            print(f"encoder_model_memory_bytes{{model={name!r}}}: {float(value) / 2**20:.0f} MiB")
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
