"""TEI's gRPC API against its HTTP twin on the same service: texts/s, and the service's CPU a text.

    python -m bench.grpc [--seconds 8] [--rounds 3] [--workers 1] [--model DIR]

The service (``python -m app.serve``) with ENCODER_GRPC_PORT, on the near-free model (1 layer, 32 wide: what a
request costs besides the model) unless ``--model``. Two loads, each over HTTP (``/tei/embed``, keep-alive,
``bench.run.drive``) and over gRPC (``grpc.aio``, a channel a client), the four taking turns in every round:

- 32 clients × 1 text: ``/tei/embed`` with one text against ``Embed``;
- 4 clients × 32 texts: ``/tei/embed`` with 32 texts against ``EmbedStream`` of 32 messages (a stream a request).

Reported: texts/s (each round, and the median), and the CPU time of the service's processes (engine, front ends,
supervisor; from /proc) a text. The clients run in this process, on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson

from app.api.tei.grpc import tei_pb2 as pb
from app.api.tei.grpc import tei_pb2_grpc as pb_grpc
from bench.frontend import HOST, tree_cpu_seconds, write_tiny_bert
from bench.run import drive, free_port, machine, make_sentences, start_service


@dataclass
class Figures:
    texts_per_s: float
    cpu_us_a_text: float


async def grpc_load(target: str, texts: list[str], per_request: int, clients: int, seconds: float) -> tuple[int, float]:
    """``clients`` channels calling Embed (one text) or EmbedStream (``per_request`` messages) until ``seconds``
    pass: the texts answered and the time taken."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(clients)]
    answered = 0
    deadline = time.perf_counter() + seconds

    async def unary(stub: pb_grpc.EmbedStub, at: int) -> int:
        answer = await stub.Embed(pb.EmbedRequest(inputs=texts[at % len(texts)]))
        assert len(answer.embeddings) > 0
        return 1

    async def streamed(stub: pb_grpc.EmbedStub, at: int) -> int:
        async def messages() -> AsyncIterator[pb.EmbedRequest]:
            for i in range(per_request):
                yield pb.EmbedRequest(inputs=texts[(at + i) % len(texts)])

        answers = [answer async for answer in stub.EmbedStream(messages())]
        assert len(answers) == per_request
        return per_request

    call: Callable[[pb_grpc.EmbedStub, int], Awaitable[int]] = unary if per_request == 1 else streamed

    async def client(index: int, channel: grpc.aio.Channel) -> None:
        nonlocal answered
        stub, at = pb_grpc.EmbedStub(channel), index * 97
        while time.perf_counter() < deadline:
            done = await call(stub, at)  # awaited first: `answered += await ...` reads answered before the wait
            answered += done
            at += per_request

    started = time.perf_counter()
    await asyncio.gather(*(client(i, channel) for i, channel in enumerate(channels)))
    elapsed = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return answered, elapsed


async def http_load(port: int, texts: list[str], per_request: int, clients: int, seconds: float) -> tuple[int, float]:
    bodies = [
        orjson.dumps({"inputs": texts[i : i + per_request] if per_request > 1 else texts[i]})
        for i in range(0, len(texts) - per_request + 1, per_request)
    ] * 50
    run = await drive("tei", HOST, port, "/tei/embed", bodies, per_request, clients, seconds, check=False)
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests")
    return run.sentences, run.seconds


async def measure(pid: int, load: Callable[[], Awaitable[tuple[int, float]]]) -> Figures:
    before = tree_cpu_seconds(pid)
    texts, elapsed = await load()
    used = tree_cpu_seconds(pid) - before
    return Figures(texts / elapsed, 1e6 * used / max(texts, 1))


LOADS = {"32 clients × 1 text": (1, 32), "4 clients × 32 texts": (32, 4)}


async def compare(pid: int, port: int, target: str, rounds: int, seconds: float) -> dict[str, dict[str, list[Figures]]]:
    texts = make_sentences(2000)
    results: dict[str, dict[str, list[Figures]]] = {load: {"HTTP": [], "gRPC": []} for load in LOADS}
    for n, clients in LOADS.values():  # warm up
        await http_load(port, texts, n, clients, 2)
        await grpc_load(target, texts, n, clients, 2)
    for round_ in range(rounds):
        for load, (n, clients) in LOADS.items():
            ways = {
                "HTTP": lambda n=n, clients=clients: http_load(port, texts, n, clients, seconds),
                "gRPC": lambda n=n, clients=clients: grpc_load(target, texts, n, clients, seconds),
            }
            for way in list(ways) if round_ % 2 == 0 else list(reversed(ways)):
                results[load][way].append(await measure(pid, ways[way]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="ENCODER_WORKERS: the front ends")
    parser.add_argument("--model", type=Path, help="a model directory (the near-free model by default)")
    args = parser.parse_args()
    model = args.model or write_tiny_bert(Path(tempfile.mkdtemp(prefix="grpc-")) / "tiny")
    grpc_port = free_port()
    port = free_port()
    env = {"ENCODER_MODEL_DIR": str(model), "ENCODER_WORKERS": str(args.workers), "ENCODER_GRPC_PORT": str(grpc_port)}
    process: subprocess.Popen = start_service(port, env, quiet=True, supervised=True)
    try:
        results = asyncio.run(compare(process.pid, port, f"{HOST}:{grpc_port}", args.rounds, args.seconds))
    finally:
        process.terminate()
        process.wait(60)
    print(
        f"{machine()}; ENCODER_WORKERS={args.workers}, {'the near-free model' if args.model is None else model}, "
        f"{args.rounds} rounds of {args.seconds:g} s\n"
    )
    print("| load | way | texts/s (rounds) | median | service CPU µs a text |")
    print("|---|---|---|---:|---:|")
    for load, by_way in results.items():
        for way, figures in by_way.items():
            rates = [f.texts_per_s for f in figures]
            print(
                f"| {load} | {way} | {', '.join(f'{r:,.0f}' for r in rates)} | {statistics.median(rates):,.0f} | "
                f"{statistics.median(f.cpu_us_a_text for f in figures):.0f} |"
            )


if __name__ == "__main__":
    main()
