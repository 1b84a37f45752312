"""The service's rate over HTTP from a load of several client processes: what a GPU host needs, where one
asyncio client process tops out near 10,000 requests a second, below what the service is asked to answer.

    .venv/bin/python -m bench.http_load [--workers 1 4 8] [--seconds 10] [--processes 8] [--quick]
        [--env ENCODER_COMPUTE_LANES=2] [--profile]

In one run: the bundled all-MiniLM-L6-v2 served as ``python -m app.serve`` with each ``ENCODER_WORKERS`` in turn,
driven on /encode with texts of 8–40 words (``make_sentences``) at 32 clients × 32 texts, 4 × 32 and 32 × 1
(texts/s, requests/s, median and 99th-percentile latency); then a random checkpoint of BERT-base's shape
(``bench.throughput``'s) at the largest ``ENCODER_WORKERS``, 32 clients × 8 texts of 512 tokens (tokens/s).
For reference, in this process and on the same device: sentence-transformers on the same MiniLM texts in batches
of 32 and 256 (float16 on a GPU, as the service computes there), and our own pass of BERT-base's shape on the same
512-token texts in batches of 8 (the rate the service's HTTP path is held to).

The clients: ``--processes`` processes (default: half the cores, at least one) share the connections, each
running ``bench.run.drive`` over its own share for ``--seconds``; their texts and requests are summed and divided by
the longest process's time. Nothing is written: the figures go to standard output (``scripts/gpu_check.sh`` keeps
them as a log).

Beside each load's rate, where its CPU went (``Cpu``, read from /proc as the clients start and once they finish):
the cores the engine process, the front ends (with their supervisor) and the client processes kept busy, the
engine's and the front ends' CPU µs a text, the engine's event loop's CPU µs a request (its main thread), and how busy
the host's cores were in all. Which of them is at its limit
says what bounds the rate: the engine near one core, the front ends near their count, the clients, or the host
itself. With ``ENCODER_WORKERS=1`` one process does everything: its CPU shows as the front ends', the engine's as 0.

``--profile`` samples, over each MiniLM load at the largest ``ENCODER_WORKERS`` alone, the engine and one front end
with py-spy (``--py-spy``: its path, where it is not on PATH; from PyPI), and prints each process's busiest
threads and the functions the samples were in most: their own code (self) and beneath them (inclusive).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.pool
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.frontend import process_tree
from bench.host import comm, split_cpu
from bench.run import cpu_seconds, drive, free_port, make_sentences, start_service, stop_all

HOST = "127.0.0.1"


@dataclass
class Load:
    name: str
    clients: int
    per_request: int


MINILM_LOADS = (Load("32 clients × 32 texts", 32, 32), Load("4 × 32", 4, 32), Load("32 × 1 text", 32, 1))
QUICK_MINILM_LOADS = (Load("4 clients × 8 texts", 4, 8), Load("4 × 1 text", 4, 1))  # a smoke run on a CPU
LONG_LOAD = Load("32 clients × 8 texts of 512 tokens", 32, 8)
QUICK_LONG_LOAD = Load("2 clients × 2 texts of 512 tokens", 2, 2)  # a smoke run on a CPU


@dataclass
class Figures:
    texts: int
    requests: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile_ms(self, p: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return 0.0
        return 1000 * ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


@dataclass
class Cpu:
    """CPU seconds so far: the service's engine process, its other processes (front ends, supervisor), the load's
    client processes, and the host's busy and total time over every core (/proc/stat)."""

    engine: float
    loop: float  # the engine's event loop's thread alone (its main thread)
    front_ends: float
    clients: float
    host_busy: float
    host_total: float
    at: float  # when read (perf_counter)

    @classmethod
    def read(cls, service: int, clients: Sequence[int]) -> Cpu:
        engine, loop, front_ends = split_cpu(service)
        busy, total = host_seconds()
        clients_s = sum(cpu_seconds(pid) for pid in clients)
        return cls(engine, loop, front_ends, clients_s, busy, total, time.perf_counter())

    def since(self, before: Cpu, texts: int, requests: int) -> Spent:
        """What each part spent between ``before`` and this reading, over which ``texts`` in ``requests`` were
        answered."""
        seconds = max(self.at - before.at, 1e-9)
        return Spent(
            (self.engine - before.engine) / seconds,
            (self.front_ends - before.front_ends) / seconds,
            (self.clients - before.clients) / seconds,
            1e6 * (self.engine - before.engine) / max(texts, 1),
            1e6 * (self.front_ends - before.front_ends) / max(texts, 1),
            1e6 * (self.loop - before.loop) / max(requests, 1),
            (self.host_busy - before.host_busy) / max(self.host_total - before.host_total, 1e-9),
        )


@dataclass
class Spent:
    """Over one load: the cores the engine, the front ends and the clients kept busy, the engine's and the front
    ends' CPU µs a text, the engine's event loop's µs a request (the part of the engine every request costs whatever
    computes its pass), and the host's cores' share busy."""

    engine_cores: float
    front_end_cores: float
    client_cores: float
    engine_us_a_text: float
    front_ends_us_a_text: float
    loop_us_a_request: float
    host_busy: float

    def cells(self) -> str:
        return (
            f"{self.engine_cores:.2f} / {self.front_end_cores:.2f} / {self.client_cores:.2f} | "
            f"{self.engine_us_a_text:.1f} / {self.front_ends_us_a_text:.1f} | {self.loop_us_a_request:.1f} | "
            f"{100 * self.host_busy:.0f} %"
        )


def host_seconds() -> tuple[float, float]:
    """The host's busy and total CPU seconds over every core since boot (/proc/stat's first line; zeros where
    there is none)."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    return (sum(fields) - idle) / tick, sum(fields) / tick


def pool_pids(pool: multiprocessing.pool.Pool) -> list[int]:
    """The pool's worker processes."""
    return [process.pid for process in getattr(pool, "_pool", []) if process.pid is not None]


def _client(args: tuple[int, str, list[bytes], int, int, float, float]) -> tuple[int, int, float, list[float], int]:
    """One client process: ``clients`` connections over its bodies from ``start`` (a shared wall-clock time) for
    ``seconds``."""
    port, path, bodies, per_request, clients, start, seconds = args
    time.sleep(max(0.0, start - time.time()))
    run = asyncio.run(drive("load", HOST, port, path, bodies, per_request, clients, seconds))
    return run.sentences, len(run.latencies), run.seconds, run.latencies, run.errors


def drive_processes(
    pool: multiprocessing.pool.Pool,
    port: int,
    bodies: list[bytes],
    load: Load,
    processes: int,
    seconds: float,
    path: str = "/encode",
    at_start_and_end: Callable[[], object] | None = None,
) -> Figures:
    """``load`` on ``port`` from ``processes`` client processes at once (no more than its clients), the bodies dealt
    round-robin so that each process has enough for the whole time; ``at_start_and_end`` called as the clients
    start and once they have all finished."""
    n = max(1, min(processes, load.clients))
    shares = [load.clients // n + (1 if i < load.clients % n else 0) for i in range(n)]
    start = time.time() + 0.5  # every process starts together, once the pool has handed out its work
    jobs = [(port, path, bodies[i::n], load.per_request, clients, start, seconds) for i, clients in enumerate(shares)]
    pending = pool.map_async(_client, jobs)
    if at_start_and_end is not None:
        time.sleep(max(0.0, start - time.time()))
        at_start_and_end()
    parts = pending.get()
    if at_start_and_end is not None:
        at_start_and_end()
    return Figures(
        sum(part[0] for part in parts),
        sum(part[1] for part in parts),
        max(part[2] for part in parts),
        [latency for part in parts for latency in part[3]],
        sum(part[4] for part in parts),
    )


def bodies_of(texts: Sequence[str], per_request: int, copies: int) -> list[bytes]:
    """/encode bodies of ``per_request`` texts each, the texts taken in turn, ``copies`` times over."""
    return [
        orjson.dumps({"texts": list(texts[i : i + per_request])})
        for i in range(0, len(texts) - per_request + 1, per_request)
    ] * copies


def long_texts(n: int, tokens: int = 512) -> list[str]:
    """``n`` texts of at least ``tokens`` tokens (the service cuts them to the model's 512)."""
    sentences = make_sentences(40 * n, seed=3)
    return [" ".join(sentences[i * 40 : (i + 1) * 40]) for i in range(n)]


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def reference_minilm(texts: list[str], seconds: float) -> dict[int, float]:
    """sentence-transformers' texts/s on the bundled model in this process, at batch sizes 32 and 256: float16
    on a GPU (what the service computes there), float32 on a CPU."""
    import torch
    from sentence_transformers import SentenceTransformer

    from model import default_model_path

    where = device()
    model = SentenceTransformer(str(default_model_path()), device=where)
    if where == "cuda":
        model = model.half()
    rates = {}
    for batch in (32, 256):
        model.encode(texts[:batch], batch_size=batch)  # warm-up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            chunk = texts[(done % len(texts)) : (done % len(texts)) + batch]
            model.encode(chunk, batch_size=batch)
            done += len(chunk)
        if where == "cuda":
            torch.cuda.synchronize()
        rates[batch] = done / (time.perf_counter() - started)
    del model
    return rates


def reference_long(path: Path, texts: list[str], per_pass: int, seconds: float) -> tuple[float, float]:
    """Our own pass in this process on the same 512-token texts, ``per_pass`` a pass, as the service loads it:
    tokens/s, and the tokens of a text as the service cuts it."""
    import torch

    from model import EmbeddingSpec, load_model, tasks

    model = load_model(path, device="auto")
    tokenizer = model.card.tokenizer
    encodings = tokenizer.encode(texts)
    spec = EmbeddingSpec(model.card.config.n_layers, model.card.pooling.mode, True)
    tasks.embed_texts(model, encodings[:per_pass], [spec] * per_pass)  # warm-up
    tokens, at, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = encodings[at : at + per_pass] or encodings[:per_pass]
        at = (at + per_pass) % len(encodings)
        tasks.embed_texts(model, batch, [spec] * len(batch))
        tokens += sum(len(e.ids) for e in batch)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - started), sum(len(e.ids) for e in encodings) / len(encodings)


def serve(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    return start_service(port, env, quiet=True, supervised=True), port


def row(name: str, figures: Figures, cpu: Spent) -> str:
    return (
        f"| {name} | {figures.texts_per_s:,.0f} | {figures.requests_per_s:,.0f} | {figures.percentile_ms(50):.1f} | "
        f"{figures.percentile_ms(99):.1f} | {figures.errors} | {cpu.cells()} |"
    )


def measured(
    pool: multiprocessing.pool.Pool,
    service: int,
    port: int,
    bodies: list[bytes],
    load: Load,
    processes: int,
    seconds: float,
) -> tuple[Figures, Spent]:
    """``drive_processes`` with the CPU each part of the service and the clients spent while the clients ran
    (``Cpu.since``)."""
    clients = pool_pids(pool)
    readings: list[Cpu] = []
    figures = drive_processes(
        pool,
        port,
        bodies,
        load,
        processes,
        seconds,
        at_start_and_end=lambda: readings.append(Cpu.read(service, clients)),
    )
    return figures, readings[1].since(readings[0], figures.texts, figures.requests)


def spy(py_spy: str, pid: int, seconds: float, output: Path) -> subprocess.Popen:
    """py-spy sampling ``pid``'s every thread for ``seconds`` without pausing it, its stacks to ``output`` (raw)."""
    command = [py_spy, "record", "--nonblocking", "--threads", "--rate", "250", "--format", "raw"]
    command += ["--duration", str(max(1, round(seconds))), "--pid", str(pid), "--output", str(output)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def tops(stacks: Path, n: int = 14) -> str:
    """The threads that had the most samples, then the functions the samples were in most, own code and inclusive,
    as shares of every sample: py-spy's raw output (a stack a line, its thread first, then its count)."""
    own: Counter[str] = Counter()
    beneath: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        threads[frames[0]] += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames[1:]):
            beneath[frame] += int(count)
    total = max(sum(threads.values()), 1)
    lines = ["threads: " + ", ".join(f"{name} {100 * c / total:.0f} %" for name, c in threads.most_common(6))]
    for title, counts in (("self", own), ("inclusive", beneath)):
        lines.append(f"{title}:")
        lines += [f"  {100 * c / total:5.1f} % {frame[:140]}" for frame, c in counts.most_common(n)]
    return "\n".join(lines)


def profiled(
    py_spy: str, pool: multiprocessing.pool.Pool, service: int, port: int, bodies: list[bytes], load: Load, args: Any
) -> str:
    """``measured`` with py-spy on the engine and on one front end while the clients run: its row and the tops."""
    tree = process_tree(service)
    targets = {"engine": [pid for pid in tree if comm(pid) == "encoder-engine"]}
    targets["a front end"] = [pid for pid in tree if comm(pid) == "encoder-front"]
    if shutil.which(py_spy) is None:
        raise SystemExit(f"--profile needs py-spy (pip install py-spy), not found at {py_spy!r}")
    scratch = Path(tempfile.mkdtemp(prefix="profile-"))
    spies = {
        name: (spy(py_spy, pids[0], args.seconds, scratch / f"{pids[0]}.txt"), scratch / f"{pids[0]}.txt")
        for name, pids in targets.items()
        if pids
    }
    figures, cpu = measured(pool, service, port, bodies, load, args.processes, args.seconds)
    report = [row(f"{load.name}, profiled", figures, cpu)]
    for name, (process, output) in spies.items():
        _, errors = process.communicate(timeout=args.seconds + 30)
        found = output.exists() and output.stat().st_size > 0
        report.append(f"\n### {name}, {load.name}\n\n" + (tops(output) if found else f"py-spy: {errors.strip()}"))
    return "\n".join(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8], help="ENCODER_WORKERS to serve with")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load")
    parser.add_argument("--processes", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="client processes")
    parser.add_argument("--quick", action="store_true", help="small loads of 2 s, references of 1 s: a smoke run")
    parser.add_argument("--no-long", action="store_true", help="leave out BERT-base's shape")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=value settings for every service started")
    parser.add_argument("--profile", action="store_true", help="py-spy on the engine and a front end, each load")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")))
    args = parser.parse_args()
    if args.profile:
        args.workers = [max(args.workers)]
    settings = dict(item.split("=", 1) for item in args.env)
    seconds = 2.0 if args.quick else args.seconds
    where = device()
    print(f"device {where}, {args.processes} client processes, {seconds:g} s a load, Python {sys.version.split()[0]}")
    if settings:
        print("settings:", " ".join(args.env))

    sentences = make_sentences(4000)
    print("\n## all-MiniLM-L6-v2 over HTTP (/encode), the service's defaults\n")
    rates = reference_minilm(sentences, 1.0 if args.quick else 5.0)
    print(f"sentence-transformers in process: batch 32 {rates[32]:,.0f} texts/s, batch 256 {rates[256]:,.0f}\n")
    print(
        "| ENCODER_WORKERS, load | texts/s | requests/s | p50 ms | p99 ms | errors "
        "| cores: engine / front ends / clients | CPU µs a text: engine / front ends "
        "| the engine's loop µs a request | host busy |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---:|")
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.processes) as pool:
        for workers in args.workers:
            process, port = serve({**settings, "ENCODER_WORKERS": str(workers)})
            try:
                for load in QUICK_MINILM_LOADS if args.quick else MINILM_LOADS:
                    bodies = bodies_of(sentences, load.per_request, 400 if load.per_request == 1 else 40)
                    drive_processes(pool, port, bodies, load, args.processes, min(seconds, 2.0))  # warm-up
                    if args.profile:
                        print(profiled(args.py_spy, pool, process.pid, port, bodies, load, args), flush=True)
                        continue
                    figures, cpu = measured(pool, process.pid, port, bodies, load, args.processes, seconds)
                    print(row(f"{workers}, {load.name}", figures, cpu))
            finally:
                stop_all([process])

        if args.no_long or args.profile:
            return
        from bench.throughput import write_bert_base

        path = write_bert_base(Path(tempfile.mkdtemp(prefix="bert-base-")))
        texts = long_texts(64)
        long_load = QUICK_LONG_LOAD if args.quick else LONG_LOAD
        in_process, per_text = reference_long(path, texts, long_load.per_request, 1.0 if args.quick else 5.0)
        workers = max(args.workers)
        print(f"\n## BERT-base's shape (random weights), {long_load.name}, ENCODER_WORKERS={workers}\n")
        process, port = serve({**settings, "ENCODER_WORKERS": str(workers), "ENCODER_MODEL_DIR": str(path)})
        try:
            bodies = bodies_of(texts, long_load.per_request, 200)
            drive_processes(pool, port, bodies, long_load, args.processes, min(seconds, 2.0))
            figures, cpu = measured(pool, process.pid, port, bodies, long_load, args.processes, seconds)
        finally:
            stop_all([process])
        tokens = figures.texts * per_text / figures.seconds if figures.seconds else 0.0
        print(
            f"over HTTP {tokens:,.0f} tokens/s ({figures.texts_per_s:,.0f} texts/s, "
            f"p50 {figures.percentile_ms(50):.0f} ms, errors {figures.errors}); "
            f"the same pass in process {in_process:,.0f} tokens/s: "
            f"{tokens / in_process:.2f}×; cores engine / front ends / clients, CPU µs a text engine / front ends, "
            f"the engine's loop µs a request, host busy: {cpu.cells().replace(' | ', '; ')}"
        )


if __name__ == "__main__":
    main()
