"""What the path between HTTP and the pass costs each process, a text: the engine's and the front ends' CPU.

    .venv/bin/python -m bench.host [--seconds 8] [--rounds 3] [--workers 2] [--against ../before]
                                   [--rerank | --queue | --spread]

The service as ``python -m app.serve`` with ``ENCODER_WORKERS`` front ends around an engine, on the random BERT of
one layer, 32 wide, of ``bench.frontend`` (a pass costs next to nothing: what is measured is everything else). Three
loads on /encode, each for ``seconds`` a round: 16 clients × 32 texts and 32 clients × 1 text over keep-alive
connections, and 16 clients × 1 text opening a connection for each request. Over each phase the
CPU time (user + system, every thread) of the engine process (``encoder-engine``) and of the rest of the service's
processes (the front ends and their supervisor) is read from /proc: microseconds of CPU a text for each, and a
request for the front ends under the one-text load, with the texts a second the whole service reached; and the CPU a
request of the engine's event loop alone (its main thread: reading tasks, queueing them, writing answers), the part
of the engine that one core must carry for every request whatever computes the passes.

``--spread`` measures instead how a service's front ends share the connections: the service started afresh (each
checkout in turn), three pools of ``--connections`` keep-alive connections opened at once, one request on each,
and the connections each front end holds.

``--against CHECKOUT`` starts another checkout's service beside this one (``git worktree add ../before <commit>``)
and drives the two in turn, the order reversed every round: a change measured side by side.

``--rerank`` drives /rerank instead, on a near-free cross-encoder (the same BERT with a one-logit head): 8 clients ×
(one query, 32 documents), and 32 clients × (one query, one document); each figure a pair rather than a text.

``--queue`` measures instead, in a process of its own, the engine's own path without a pass: 16 concurrent requests
of 32 texts (each a ``PackedTokens``, as a front end sends them) through a model's ``WorkQueue``, its ``Worker`` and
three compute lanes, to a model that answers zeros, then to the near-free model whose pass answers zeros (its own
Python around the pass counted: padding, tensors, pooling, answers). CPU µs a text; ``--against`` runs the same in
the other checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.frontend import HOST, connections_held, process_tree, write_tiny_bert, write_tiny_cross_encoder
from bench.run import ROOT, Connection, Run, cpu_seconds, drive, free_port, make_sentences, start_service, stop_all


@dataclass
class Figures:
    texts_per_s: float
    engine_us_a_text: float
    front_us_a_text: float
    front_us_a_request: float
    engine_loop_us_a_request: float


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def split_cpu(pid: int) -> tuple[float, float, float]:
    """CPU seconds of the engine, of its event loop's thread (its main thread) alone, and of the service's other
    processes (front ends, supervisor)."""
    engine = loop = other = 0.0
    for member in process_tree(pid):
        if comm(member) == "encoder-engine":
            engine += cpu_seconds(member)
            loop += cpu_seconds(member, thread=member)
        else:
            other += cpu_seconds(member)
    return engine, loop, other


async def drive_fresh(port: int, bodies: list[bytes], per_request: int, clients: int, seconds: float) -> Run:
    """``drive``'s load with a new connection for every request (``Connection: close``), as a client without a
    pool of connections makes it."""
    queue, run = list(reversed(bodies)), Run("phase")
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while queue and time.perf_counter() < deadline:
            body = queue.pop()
            started = time.perf_counter()
            connection = await Connection.open(HOST, port)
            status, payload = await connection.request("POST", "/encode", body, "Connection: close\r\n")
            connection.close()
            run.latencies.append(time.perf_counter() - started)
            if status != 200 or len(orjson.loads(payload)["data"]) != per_request:
                run.errors += 1
            else:
                run.sentences += per_request

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    run.seconds = time.perf_counter() - started
    return run


async def phase(
    pid: int,
    port: int,
    bodies: list[bytes],
    per_request: int,
    clients: int,
    seconds: float,
    fresh: bool = False,
    path: str = "/encode",
) -> Figures:
    engine_before, loop_before, other_before = split_cpu(pid)
    if fresh:
        run = await drive_fresh(port, bodies, per_request, clients, seconds)
    else:
        key = "results" if path == "/rerank" else "data"
        run = await drive("phase", HOST, port, path, bodies, per_request, clients, seconds, key=key)
    engine_after, loop_after, other_after = split_cpu(pid)
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests on port {port}")
    texts = max(run.sentences, 1)
    requests = max(len(run.latencies), 1)
    return Figures(
        run.rate,
        1e6 * (engine_after - engine_before) / texts,
        1e6 * (other_after - other_before) / texts,
        1e6 * (other_after - other_before) / requests,
        1e6 * (loop_after - loop_before) / requests,
    )


# texts a request, clients, whether each request opens a connection of its own
LOADS = {
    "16 clients × 32 texts": (32, 16, False),
    "32 clients × 1 text": (1, 32, False),
    "16 clients × 1 text, a new connection each": (1, 16, True),
}


# documents a request, clients: /rerank's loads (one query a request)
RERANK_LOADS = {
    "8 clients × (1 query, 32 documents)": (32, 8, False),
    "32 clients × (1 query, 1 document)": (1, 32, False),
}


def table(results: dict[str, dict[str, list[Figures]]], path: str = "/encode") -> None:
    what = "pair" if path == "/rerank" else "text"
    for load, by_server in results.items():
        print(f"\n{load}, {path}\n")
        print(
            f"| service | {what}s/s (rounds) | median | engine µs a {what} | front ends µs a {what} "
            "| front ends µs a request | the engine's loop µs a request |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        for name, figures in by_server.items():
            rates = [f.texts_per_s for f in figures]
            print(
                f"| {name} | {', '.join(f'{r:.0f}' for r in rates)} | {statistics.median(rates):.0f} | "
                f"{statistics.median(f.engine_us_a_text for f in figures):.1f} | "
                f"{statistics.median(f.front_us_a_text for f in figures):.1f} | "
                f"{statistics.median(f.front_us_a_request for f in figures):.0f} | "
                f"{statistics.median(f.engine_loop_us_a_request for f in figures):.1f} |"
            )


def request_bodies(sentences: list[str], n: int, rerank: bool) -> list[bytes]:
    """Bodies of ``n`` texts (or, for /rerank, a query and ``n`` documents) from ``sentences``, over and over."""
    if rerank:
        step = n + 1
        return [
            orjson.dumps({"query": sentences[i], "documents": sentences[i + 1 : i + step]})
            for i in range(0, len(sentences) - step + 1, step)
        ] * 400
    return [orjson.dumps({"texts": sentences[i : i + n]}) for i in range(0, len(sentences) - n + 1, n)] * 400


async def compare(servers: dict[str, tuple[int, int]], rounds: int, seconds: float, rerank: bool = False) -> None:
    sentences = make_sentences(4000)
    loads, path = (RERANK_LOADS, "/rerank") if rerank else (LOADS, "/encode")
    key = "results" if rerank else "data"
    bodies = {load: request_bodies(sentences, n, rerank) for load, (n, _, _) in loads.items()}
    for _, port in servers.values():  # warm up
        for load, (n, clients, _) in loads.items():
            await drive("warm-up", HOST, port, path, bodies[load][:300], n, clients, 3, key=key)
    results: dict[str, dict[str, list[Figures]]] = {load: {name: [] for name in servers} for load in loads}
    for round_ in range(rounds):
        order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
        for load, (n, clients, fresh) in loads.items():
            for name in order:
                pid, port = servers[name]
                figures = await phase(pid, port, bodies[load], n, clients, seconds, fresh, path)
                results[load][name].append(figures)
    table(results, path)


QUEUE_SCRIPT = """
import asyncio, sys, time
import numpy as np
import torch
from app.engine.compute import COMPUTE
from dataclasses import replace
from app.engine.messages import KINDS, Task
from app.engine.work_queue import WorkQueue
from app.engine.worker import Worker
from model import EmbeddingSpec, PackedTokens, TextEmbedding, TokenIds, load_model

def zeros(model, encodings, specs):
    out = np.zeros((len(encodings), 32), np.float32)
    return [TextEmbedding(row) for row in out]

def near_free(path):
    # the near-free model with its pass answering zeros: what is left is the Python around the pass
    model = load_model(path, runtime="torch")
    width = model.card.config.d_model
    model.last_hidden_state = lambda ids, mask, types: torch.zeros(ids.shape + (width,))
    return model

async def main(requests, path):
    COMPUTE.configure(3)
    spec = EmbeddingSpec(1, "mean", True)
    if path == "-":  # texts as a front end sends them
        KINDS["embed"] = replace(KINDS["embed"], compute=zeros)  # the embedding pass answers zeros
        model, texts = object(), PackedTokens.of([TokenIds(list(range(100, 135)), [0] * 35) for _ in range(32)])
    else:
        model = near_free(path)
        sentences = [" ".join(["word"] * (8 + i)) + " and the rest of a sentence" for i in range(32)]
        texts = PackedTokens.of(model.card.tokenizer.encode(sentences))  # as a front end sends them
    queue = WorkQueue(lanes=3)
    worker = Worker(queue, model, threads=3)
    async def client(n):
        for _ in range(n):
            await queue.run(Task("embed", texts, spec))
    await asyncio.gather(*(client(20) for _ in range(16)))
    started = time.process_time()
    await asyncio.gather(*(client(requests) for _ in range(16)))
    print(1e6 * (time.process_time() - started) / (16 * requests * 32))
    worker.stop()

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


def queue_path(checkouts: dict[str, Path], rounds: int) -> None:
    """The engine's queue, worker and lanes alone (``QUEUE_SCRIPT``), each checkout in turn, in a process of its own:
    to a model whose pass is zeros, and to the near-free model whose pass answers zeros (its own Python around the
    pass counted: padding, tensors, pooling, results)."""
    import sys

    model = write_tiny_bert(Path(tempfile.mkdtemp(prefix="host-")) / "tiny")
    paths = {"a model answering zeros": "-", "the near-free model, its pass answering zeros": str(model)}
    results: dict[str, dict[str, list[float]]] = {path: {name: [] for name in checkouts} for path in paths}
    for round_ in range(rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
        for what, path in paths.items():
            for name in order:
                output = subprocess.run(
                    [sys.executable, "-c", QUEUE_SCRIPT, "300", path],
                    cwd=checkouts[name],
                    capture_output=True,
                    text=True,
                )
                if output.returncode:
                    raise RuntimeError(output.stderr)
                results[what][name].append(float(output.stdout.split()[-1]))
    for what, by_checkout in results.items():
        print(f"\nthe engine's queue, worker and 3 lanes, {what}, 16 requests × 32 texts at once\n")
        print("| checkout | CPU µs a text (rounds) | median |")
        print("|---|---|---:|")
        for name, values in by_checkout.items():
            print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")


async def pools(port: int, front_ends: list[int], connections: int, times: int = 3) -> list[list[int]]:
    """``times`` pools of ``connections`` keep-alive connections opened at once, one request on each: the
    connections each front end holds, most first."""
    held = []
    for _ in range(times):
        opened = await asyncio.gather(*(Connection.open(HOST, port) for _ in range(connections)))
        await asyncio.gather(*(connection.request("GET", "/health") for connection in opened))
        held.append(sorted((connections_held(pid, port) for pid in front_ends), reverse=True))
        for connection in opened:
            connection.close()
        await asyncio.sleep(0.5)
    return held


def spread(checkouts: dict[str, Path], workers: int, connections: int) -> None:
    """How each checkout's front ends share pools of connections opened at once (``pools``), each service started
    afresh: the first pool is opened as soon as the service answers."""
    model = write_tiny_bert(Path(tempfile.mkdtemp(prefix="host-")) / "tiny")
    env = {"ENCODER_MODEL_DIR": str(model), "ENCODER_WORKERS": str(workers)}
    print(f"\n{connections} connections opened at once, ENCODER_WORKERS={workers}: connections each front end holds\n")
    print("| checkout | first pool | second | third |")
    print("|---|---|---|---|")
    for name, checkout in checkouts.items():
        port = free_port()
        process = start_service(port, env, checkout=checkout, quiet=True, supervised=True)
        try:
            front_ends = [pid for pid in process_tree(process.pid) if comm(pid) == "encoder-front"]
            held = asyncio.run(pools(port, front_ends, connections))
        finally:
            stop_all([process])
        print(f"| {name} | " + " | ".join(", ".join(str(n) for n in counts) for counts in held) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="ENCODER_WORKERS: the front ends")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=value settings for the services")
    parser.add_argument("--against", type=Path, help="a checkout of the service to drive beside this one")
    parser.add_argument("--rerank", action="store_true", help="/rerank on a near-free cross-encoder")
    parser.add_argument("--queue", action="store_true", help="the engine's queue path alone, in process")
    parser.add_argument("--spread", action="store_true", help="how the front ends share the connections")
    parser.add_argument("--connections", type=int, default=32, help="with --spread: connections a pool")
    args = parser.parse_args()
    if args.spread:
        checkouts = {"this checkout": ROOT, **({"before": args.against} if args.against is not None else {})}
        spread(checkouts, args.workers, args.connections)
        return
    if args.queue:
        checkouts = {"this checkout": ROOT, **({"before": args.against} if args.against is not None else {})}
        queue_path(checkouts, args.rounds)
        return
    directory = Path(tempfile.mkdtemp(prefix="host-"))
    model = write_tiny_cross_encoder(directory / "ce") if args.rerank else write_tiny_bert(directory / "tiny")
    env = {
        "ENCODER_MODEL_DIR": str(model),
        "ENCODER_WORKERS": str(args.workers),
        **dict(item.split("=", 1) for item in args.env),
    }
    print(
        f"ENCODER_WORKERS={args.workers}, the near-free {'cross-encoder' if args.rerank else 'model'} (1 layer, 32 "
        f"wide), {args.rounds} rounds of {args.seconds:g} s"
    )
    processes: list[subprocess.Popen] = []
    try:
        servers: dict[str, tuple[int, int]] = {}
        for name, checkout in (("this checkout", ROOT), ("before", args.against)):
            if checkout is None:
                continue
            port = free_port()
            processes.append(start_service(port, env, checkout=checkout, quiet=True, supervised=True))
            servers[name] = (processes[-1].pid, port)
        asyncio.run(compare(servers, args.rounds, args.seconds, args.rerank))
    finally:
        stop_all(processes)


if __name__ == "__main__":
    main()
