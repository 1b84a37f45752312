"""Where a running service's time goes, load by load: its rate, its forward passes and each thread's CPU.

    .venv/bin/python -m bench.profile [ENCODER_SETTING=value ...]

Starts the service (the bundled model, the settings given on the command line on top of the environment),
then drives make bench's loads one after the other, each over all 2,000 sentences: (a) 32 clients × 1 text
on /encode, (e) the same on /v1/embeddings, (b) 4 clients × 32 texts, idle 1 client × 1 text. For each it
prints the texts/s, the passes (how many, texts a pass, mean time, from /metrics), the CPU each of the
service's threads spent (from /proc), in total and per request, and the process's resident memory after it.
On a GPU a thread that waits for the device spins, so there its CPU time is its wall time.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import orjson

from bench.run import drive, free_port, get, make_sentences, process_memory, start_service

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Each thread of a process: id → (name, CPU seconds so far)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat, name = (task / "stat").read_text(), (task / "comm").read_text().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        threads[task.name] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return threads


def resident_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), MiB."""
    return process_memory(pid).get("VmRSS", 0) / 2**20


def sums(port: int, name: str) -> dict[str, float]:
    """The _sum and _count of a histogram in /metrics, over its labels."""
    text = get(port, "/metrics").decode()
    found: dict[str, float] = {}
    for key, value in re.findall(rf"^{name}_(sum|count)(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE):
        found[key] = found.get(key, 0.0) + float(value)
    return found


def main() -> None:
    settings = dict(argument.split("=", 1) for argument in sys.argv[1:])
    sentences = make_sentences(2000)
    singles = [orjson.dumps({"texts": [s]}) for s in sentences]
    openai = [orjson.dumps({"input": s, "model": "all-MiniLM-L6-v2"}) for s in sentences]
    batches = [orjson.dumps({"texts": sentences[i : i + 32]}) for i in range(0, 1984, 32)]
    port = free_port()
    service = start_service(port, settings)
    try:
        info = orjson.loads(get(port, "/info"))
        print(f"the service on {info['device']}, {info['dtype']}, settings {settings or 'as the environment has them'}")
        print(f"resident memory once ready: {resident_mib(service.pid):.0f} MiB")
        asyncio.run(drive("warm-up", "127.0.0.1", port, "/encode", singles[:200], 1, 32, 60))
        loads = [
            ("(a) 32 × 1", "/encode", singles, 1, 32),
            ("(e) /v1/embeddings 32 × 1", "/v1/embeddings", openai, 1, 32),
            ("(b) 4 × 32", "/encode", batches, 32, 4),
            ("idle 1 × 1", "/encode", singles[:300], 1, 1),
        ]
        for name, path, bodies, per_request, clients in loads:
            before, passes_before = thread_cpu(service.pid), sums(port, "encoder_batch_seconds")
            texts_before = sums(port, "encoder_batch_texts")
            started = time.perf_counter()
            run = asyncio.run(drive(name, "127.0.0.1", port, path, bodies, per_request, clients, 120))
            wall = time.perf_counter() - started
            after, passes_after = thread_cpu(service.pid), sums(port, "encoder_batch_seconds")
            texts = sums(port, "encoder_batch_texts")["sum"] - texts_before["sum"]
            passes = passes_after["count"] - passes_before["count"]
            pass_seconds = passes_after["sum"] - passes_before["sum"]
            requests = run.sentences // per_request
            print(
                f"\n{name}: {run.sentences / wall:.0f} texts/s, {requests} requests, {run.errors} errors, p50 "
                f"{run.percentile(50):.1f} ms; {passes:.0f} passes of {texts / max(passes, 1):.1f} texts, "
                f"{1000 * pass_seconds / max(passes, 1):.2f} ms each on average, computing {pass_seconds / wall:.0%}"
                f" of the time; resident memory after it {resident_mib(service.pid):.0f} MiB"
            )
            spent = sorted(
                ((cpu - before.get(tid, ("", 0.0))[1], tid, thread) for tid, (thread, cpu) in after.items()),
                reverse=True,
            )
            for cpu, tid, thread in [row for row in spent if row[0] > 0.01][:6]:
                print(
                    f"    thread {tid} ({thread}): {cpu:.2f} s of CPU, {1000 * cpu / max(requests, 1):.3f} ms a "
                    f"request, {cpu / wall:.0%} of the time"
                )
    finally:
        service.terminate()
        service.wait(60)


if __name__ == "__main__":
    main()
