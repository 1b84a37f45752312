"""What the path between HTTP and the pass costs each process, a text: the engine's and the front ends' CPU.

    .venv/bin/python -m bench.host [--seconds 8] [--rounds 3] [--workers 2] [--against ../before]

The service as ``python -m app.serve`` with ``ENCODER_WORKERS`` front ends around an engine, on the random BERT of
one layer, 32 wide, of ``bench.frontend`` (a pass costs next to nothing: what is measured is everything else). Two
loads on /encode, each for ``seconds`` a round: 16 clients × 32 texts and 32 clients × 1 text. Over each phase the
CPU time (user + system, every thread) of the engine process (``encoder-engine``) and of the rest of the service's
processes (the front ends and their supervisor) is read from /proc: microseconds of CPU a text for each, and a
request for the front ends under the one-text load, with the texts a second the whole service reached.

``--against CHECKOUT`` starts another checkout's service beside this one (``git worktree add ../before <commit>``)
and drives the two in turn, the order reversed every round: a change measured side by side.

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
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.frontend import HOST, process_tree, write_tiny_bert
from bench.run import ROOT, cpu_seconds, drive, free_port, make_sentences, start_service, stop_all


@dataclass
class Figures:
    texts_per_s: float
    engine_us_a_text: float
    front_us_a_text: float
    front_us_a_request: float


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def split_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the engine and of the service's other processes (front ends, supervisor)."""
    engine = other = 0.0
    for member in process_tree(pid):
        if comm(member) == "encoder-engine":
            engine += cpu_seconds(member)
        else:
            other += cpu_seconds(member)
    return engine, other


async def phase(pid: int, port: int, bodies: list[bytes], per_request: int, clients: int, seconds: float) -> Figures:
    engine_before, other_before = split_cpu(pid)
    run = await drive("phase", HOST, port, "/encode", bodies, per_request, clients, seconds)
    engine_after, other_after = split_cpu(pid)
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests on port {port}")
    texts = max(run.sentences, 1)
    requests = max(len(run.latencies), 1)
    return Figures(
        run.rate,
        1e6 * (engine_after - engine_before) / texts,
        1e6 * (other_after - other_before) / texts,
        1e6 * (other_after - other_before) / requests,
    )


LOADS = {"16 clients × 32 texts": (32, 16), "32 clients × 1 text": (1, 32)}


def table(results: dict[str, dict[str, list[Figures]]]) -> None:
    for load, by_server in results.items():
        print(f"\n{load}, /encode\n")
        print(
            "| service | texts/s (rounds) | median | engine µs a text | front ends µs a text "
            "| front ends µs a request |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for name, figures in by_server.items():
            rates = [f.texts_per_s for f in figures]
            print(
                f"| {name} | {', '.join(f'{r:.0f}' for r in rates)} | {statistics.median(rates):.0f} | "
                f"{statistics.median(f.engine_us_a_text for f in figures):.1f} | "
                f"{statistics.median(f.front_us_a_text for f in figures):.1f} | "
                f"{statistics.median(f.front_us_a_request for f in figures):.0f} |"
            )


async def compare(servers: dict[str, tuple[int, int]], rounds: int, seconds: float) -> None:
    sentences = make_sentences(4000)
    bodies = {
        load: [orjson.dumps({"texts": sentences[i : i + n]}) for i in range(0, len(sentences) - n + 1, n)] * 400
        for load, (n, _) in LOADS.items()
    }
    for _, port in servers.values():  # warm up
        for load, (n, clients) in LOADS.items():
            await drive("warm-up", HOST, port, "/encode", bodies[load][:300], n, clients, 3)
    results: dict[str, dict[str, list[Figures]]] = {load: {name: [] for name in servers} for load in LOADS}
    for round_ in range(rounds):
        order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
        for load, (n, clients) in LOADS.items():
            for name in order:
                pid, port = servers[name]
                results[load][name].append(await phase(pid, port, bodies[load], n, clients, seconds))
    table(results)


QUEUE_SCRIPT = """
import asyncio, sys, time
import numpy as np
import torch
from app.engine.compute import COMPUTE
from app.engine.messages import Task
from app.engine.work_queue import WorkQueue
from app.engine.worker import Worker
from model import EmbeddingSpec, PackedTokens, TextEmbedding, TokenIds, load_model

class Zeros:
    def embed_encodings(self, encodings, specs):
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
        model, texts = Zeros(), PackedTokens.of([TokenIds(list(range(100, 135)), [0] * 35) for _ in range(32)])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="ENCODER_WORKERS: the front ends")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=value settings for the services")
    parser.add_argument("--against", type=Path, help="a checkout of the service to drive beside this one")
    parser.add_argument("--queue", action="store_true", help="the engine's queue path alone, in process")
    args = parser.parse_args()
    if args.queue:
        checkouts = {"this checkout": ROOT, **({"before": args.against} if args.against is not None else {})}
        queue_path(checkouts, args.rounds)
        return
    model = write_tiny_bert(Path(tempfile.mkdtemp(prefix="host-")) / "tiny")
    env = {
        "ENCODER_MODEL_DIR": str(model),
        "ENCODER_WORKERS": str(args.workers),
        **dict(item.split("=", 1) for item in args.env),
    }
    print(
        f"ENCODER_WORKERS={args.workers}, the near-free model (1 layer, 32 wide), "
        f"{args.rounds} rounds of {args.seconds:g} s"
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
        asyncio.run(compare(servers, args.rounds, args.seconds))
    finally:
        stop_all(processes)


if __name__ == "__main__":
    main()
