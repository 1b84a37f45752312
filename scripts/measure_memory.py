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

    .venv/bin/python scripts/measure_memory.py --inspection

instead sends the largest inspection requests the default bounds admit, one at a time, with the attention
token limit raised to the position table (ENCODER_MAX_ATTENTION_TOKENS=512): the peak resident memory is
reset before each (/proc/PID/clear_refs) and read after it; then three of the two largest at once (the npz
/attention and the /attention/heads request, three lanes' worth), their peak read the same way.

    ENCODER_WORKERS=2 .venv/bin/python scripts/measure_memory.py --processes

serves as ``python -m app.serve`` instead and reads each of its processes (the supervisor, the engine, every front
end, told apart by their names), each figure per process.
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


def inspection_jobs(rng: random.Random) -> list[tuple[str, str, dict[str, object], dict[str, str]]]:
    """The largest request of each inspection kind within the default bounds, for all-MiniLM-L6-v2 (6 layers,
    12 heads; 512 attention tokens, 256 for embeddings): (label, path, body, headers)."""
    long_text = text(600, rng)  # more than 512 tokens: cut to the limit
    words = [word for word in WORDS if word not in ("encoder", "tokens", "clustering")]  # one token each
    return [
        (
            "/attention JSON, 6 × 12 × 166² = 1,984,032 weights",
            "/attention",
            {"text": " ".join(rng.choice(words) for _ in range(164))},
            {},
        ),
        (
            "/attention npz, 6 × 12 × 512² = 18,874,368 weights",
            "/attention",
            {"text": long_text},
            {"Accept": "application/x-npz"},
        ),
        (
            "/attention/heads, 14 texts × 6 × 12 × 512² = 264,241,152 weights",
            "/attention/heads",
            {"texts": [text(600, rng) for _ in range(14)]},
            {},
        ),
        (
            "/similarity explain, 256 × 256 tokens × 30 texts = 1,966,080 contributions",
            "/similarity",
            {"source": text(300, rng), "texts": [text(300, rng) for _ in range(30)], "explain": True},
            {},
        ),
    ]


def measure_inspection(url: str, pid: int) -> None:
    rng = random.Random(1)
    baseline = memory_mib(pid)
    print(f"ready: {baseline['VmRSS']:.0f} MiB resident")
    for label, path, body, headers in inspection_jobs(rng):
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from what is resident
        before = memory_mib(pid)["VmRSS"]
        started = time.monotonic()
        request = urllib.request.Request(
            url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **headers, **auth()}
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            size = len(response.read())
        after = memory_mib(pid)
        print(
            f"{label}: {time.monotonic() - started:.1f} s, {size / 2**20:.1f} MiB answer; resident before "
            f"{before:.0f} MiB, peak {after['VmHWM']:.0f} MiB (+{after['VmHWM'] - before:.0f})"
        )


def measure_inspection_at_once(url: str, pid: int, at_once: int = 3) -> None:
    """``at_once`` of each of the two largest inspection requests sent together: what inspection passes side by
    side hold (ENCODER_INSPECTION_PASSES of them compute at once)."""
    rng = random.Random(2)
    largest = [job for job in inspection_jobs(rng) if "npz" in job[0] or job[1] == "/attention/heads"]
    for label, path, body, headers in largest:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        before = memory_mib(pid)["VmRSS"]
        started = time.monotonic()

        def send(_: int, path: str = path, body: dict[str, object] = body, headers: dict[str, str] = headers) -> None:
            request = urllib.request.Request(
                url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **headers, **auth()}
            )
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()

        with ThreadPoolExecutor(max_workers=at_once) as pool:
            list(pool.map(send, range(at_once)))
        after = memory_mib(pid)
        print(
            f"{at_once} at once, {label}: {time.monotonic() - started:.1f} s; resident before {before:.0f} MiB, "
            f"peak {after['VmHWM']:.0f} MiB (+{after['VmHWM'] - before:.0f})"
        )


def processes(pid: int) -> dict[str, int]:
    """The service's processes by name: the server itself, and under ``python -m app.serve`` the engine and each
    front end it started (their /proc/PID/comm)."""
    found = {"server": pid}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and comm.startswith("encoder-"):
                found[f"{comm} {entry.name}"] = int(entry.name)
    return found


def report(label: str, pids: dict[str, int]) -> None:
    for name, pid in pids.items():
        figures = memory_mib(pid)
        print(f"{label}: {name}: {figures['VmRSS']:.0f} MiB resident, peak {figures['VmHWM']:.0f} MiB")


def main() -> int:
    inspection = "--inspection" in sys.argv[1:]
    supervised = "--processes" in sys.argv[1:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app", "--port", str(port)]
    if supervised:
        command = [sys.executable, "-m", "app.serve", "--port", str(port)]
    env = {**os.environ, **({"ENCODER_MAX_ATTENTION_TOKENS": "512"} if inspection else {})}
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
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
        pids = processes(server.pid)
        if supervised:
            report("ready", pids)
        if inspection:
            measure_inspection(url, server.pid)
            measure_inspection_at_once(url, server.pid)
            return 0

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
        if supervised:
            report("after the load", pids)
            print(f"load: {len(jobs)} requests in {seconds:.0f} s")
            return 0
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
