"""What a request costs the service besides the model: against the leanest FastAPI route, over HTTP.

    .venv/bin/python -m bench.frontend [--seconds 10] [--rounds 3] [--clients 32] [--against ../before] [--floor]

Two servers on 127.0.0.1, up at once, driven in turn by the same client:

- the service, on a random BERT of one layer, 32 wide (the bundled tokenizer): a pass costs next to nothing, so
  what is measured is HTTP, validation, tokenisation, queueing, the hand-over to the compute lanes and back, and
  serialisation;
- the leanest FastAPI route that does what /encode must do without a model (``bench/lean_route.py``): uvicorn with
  uvloop and httptools, one process, parsing the same body into a pydantic model and answering the same JSON (one
  32-float embedding a text, the usage), serialised with orjson.

Each phase sends ``clients`` concurrent clients × 1 text to /encode for ``seconds``; the phases alternate between
the two, the order reversed every round. Over each phase the CPU time (user + system) of the server and every
process it started is read from /proc. Prints requests/s and CPU milliseconds a request, each round and the
median, and the service's ratios to the route: the goals of "Past the event loop" (requests/s at least the
route's, CPU at most 1.3× the route's).

``--against CHECKOUT`` drives another checkout's service (``git worktree add ../before <commit>``) in the route's
place: a change measured side by side. ``--floor`` first measures, in this process, what no front end can leave
out of such a request: tokenising its text and its share of a pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from bench.run import (
    ROOT,
    cpu_seconds,
    drive,
    free_port,
    make_sentences,
    process_stat,
    start_service,
    stop_all,
    wait_ready,
    with_bundled_tokenizer,
)

HOST = "127.0.0.1"


def write_tiny_bert(directory: Path) -> Path:
    """A random BERT of one layer, 32 wide, two heads: a pass of next to no cost, the bundled tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    return with_bundled_tokenizer(directory, BertModel(config))


def write_tiny_cross_encoder(directory: Path) -> Path:
    """``write_tiny_bert``'s model with a one-logit head: a cross-encoder whose pass costs next to nothing."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config.num_labels = 1
    torch.manual_seed(0)
    return with_bundled_tokenizer(directory, BertForSequenceClassification(config))


def connections_held(pid: int, port: int) -> int:
    """How many established TCP connections to ``port`` process ``pid`` holds (its descriptors' socket inodes,
    found in /proc/net/tcp and tcp6)."""
    inodes = set()
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(descriptor)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            held += local_port == port and state == "01" and inode in inodes  # 01: ESTABLISHED
    return held


def start_route(port: int) -> subprocess.Popen:
    """bench/lean_route.py under uvicorn, as the service runs (uvloop, httptools, no access log)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.lean_route:app",
            "--host",
            HOST,
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
    )
    wait_ready(process, port)
    return process


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = process_stat(int(entry)) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and its descendants (every thread), in seconds."""
    return sum(cpu_seconds(member) for member in process_tree(pid))


async def phase(pid: int, port: int, bodies: list[bytes], clients: int, seconds: float) -> tuple[float, float]:
    """Requests a second and CPU milliseconds a request of one phase."""
    before = tree_cpu_seconds(pid)
    run = await drive("phase", HOST, port, "/encode", bodies, 1, clients, seconds)
    used = tree_cpu_seconds(pid) - before
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests on port {port}")
    return run.rate, 1000 * used / max(run.sentences, 1)


async def compare(servers: dict[str, tuple[int, int]], rounds: int, clients: int, seconds: float) -> None:
    sentences = make_sentences(4000)
    bodies = [orjson.dumps({"texts": [text]}) for text in sentences] * 50
    for _, port in servers.values():  # warm up
        await drive("warm-up", HOST, port, "/encode", bodies[:500], 1, clients, 5)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    for round_ in range(rounds):
        order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
        for name in order:
            pid, port = servers[name]
            results[name].append(await phase(pid, port, bodies, clients, seconds))
    print(f"\n{clients} clients × 1 text, /encode, {rounds} rounds of {seconds:g} s\n")
    print("| server | requests/s (rounds) | median | CPU ms a request (rounds) | median |")
    print("|---|---|---:|---|---:|")
    for name, values in results.items():
        rates, cpus = [v[0] for v in values], [v[1] for v in values]
        print(
            f"| {name} | {', '.join(f'{r:.0f}' for r in rates)} | {statistics.median(rates):.0f} | "
            f"{', '.join(f'{c:.3f}' for c in cpus)} | {statistics.median(cpus):.3f} |"
        )
    service, route = (results[name] for name in servers)
    rate_ratios = [s[0] / r[0] for s, r in zip(service, route, strict=True)]
    cpu_ratios = [s[1] / r[1] for s, r in zip(service, route, strict=True)]
    first, second = servers
    goals = second == "lean FastAPI route"
    print(
        f"\n{first} ÷ {second}: requests/s {statistics.median(rate_ratios):.2f} "
        f"({', '.join(f'{x:.2f}' for x in rate_ratios)}{'; goal ≥ 1.0' if goals else ''}), CPU a request "
        f"{statistics.median(cpu_ratios):.2f} ({', '.join(f'{x:.2f}' for x in cpu_ratios)}"
        f"{'; goal ≤ 1.3' if goals else ''})"
    )


def floor(model_dir: Path, repeats: int = 2000) -> None:
    """What the service cannot leave out of a request, measured in this process on one thread: tokenising one
    text (as a request of one text is tokenised) and its share of a pass of 8 and of 32 texts, CPU microseconds."""
    import time

    import torch

    from model import EmbeddingSpec, load_model, tasks

    torch.set_num_threads(1)
    model = load_model(model_dir)
    texts = make_sentences(repeats)
    tokenizer = model.card.tokenizer
    for text in texts[:200]:
        tokenizer.encode([text])
    started = time.process_time()
    for text in texts:
        tokenizer.encode([text])
    tokenise = (time.process_time() - started) / len(texts)
    spec = EmbeddingSpec(layer=model.card.config.n_layers, pooling=model.card.pooling.mode, normalize=True)
    print(f"\nin-process floor, one thread: tokenising one text {tokenise * 1e6:.0f} µs", end="")
    for size in (8, 32):
        encodings = tokenizer.encode(texts[:size])
        for _ in range(20):
            tasks.embed_texts(model, encodings, [spec] * size)
        rounds = max(1, repeats // size)
        started = time.process_time()
        for _ in range(rounds):
            tasks.embed_texts(model, encodings, [spec] * size)
        print(
            f"; a text's share of a pass of {size}: {(time.process_time() - started) / rounds / size * 1e6:.0f} µs",
            end="",
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--env", nargs="*", default=[], help="NAME=value settings for the service")
    parser.add_argument(
        "--supervised", action="store_true", help="serve as python -m app.serve (ENCODER_WORKERS front ends, an engine)"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout of the service (git worktree add ../before <commit>) to drive in the route's place",
    )
    parser.add_argument(
        "--floor", action="store_true", help="also measure tokenisation and the pass alone, in this process"
    )
    args = parser.parse_args()
    model = write_tiny_bert(Path(tempfile.mkdtemp(prefix="frontend-")) / "tiny")
    if args.floor:
        floor(model)
    env = {"ENCODER_MODEL_DIR": str(model), **dict(item.split("=", 1) for item in args.env)}
    processes: list[subprocess.Popen] = []
    try:
        service_port, route_port = free_port(), free_port()
        processes.append(start_service(service_port, env, quiet=True, supervised=args.supervised))
        if args.against is not None:
            other = start_service(route_port, env, checkout=args.against, quiet=True, supervised=args.supervised)
            processes.append(other)
        else:
            processes.append(start_route(route_port))
        servers = {
            "service": (processes[0].pid, service_port),
            "lean FastAPI route" if args.against is None else "before": (processes[1].pid, route_port),
        }
        asyncio.run(compare(servers, args.rounds, args.clients, args.seconds))
    finally:
        stop_all(processes)


if __name__ == "__main__":
    main()
