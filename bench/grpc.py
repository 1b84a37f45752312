"""TEI's gRPC API against its HTTP twin on the same service: texts/s, and the service's CPU a text.

    python -m bench.grpc [--seconds 8] [--rounds 3] [--workers 1] [--model DIR]

The service (``python -m app.serve``) with ENCODER_GRPC_PORT, on the near-free model (1 layer, 32 wide: what a
request costs besides the model) unless ``--model``. Two loads, each over HTTP (``/tei/embed``, keep-alive,
``bench.run.drive``) and over gRPC (``grpc.aio``, a channel a client), the four taking turns in every round:

- 32 clients × 1 text: ``/tei/embed`` with one text against ``Embed``;
- 4 clients × 32 texts: ``/tei/embed`` with 32 texts against ``EmbedStream`` of 32 messages (a stream a request).

Reported: texts/s (each round, and the median), and the CPU time of the service's processes (engine, front ends,
supervisor; from /proc) a text. The clients run in this process, on the same cores.

``--floor``: the same loads against what each way costs without a service: a bare ``grpc.aio`` servicer whose Embed
and EmbedStream answer a constant 32-float vector (``python -m bench.grpc --serve-bare PORT``), and the leanest
FastAPI route (bench/lean_route.py) for HTTP, one with 1 text a request and one with 32; each its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import orjson

from app.api.tei.grpc import tei_pb2 as pb
from app.api.tei.grpc import tei_pb2_grpc as pb_grpc
from bench.frontend import HOST, start_route, tree_cpu_seconds, write_tiny_bert
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


async def http_load(
    port: int, texts: list[str], per_request: int, clients: int, seconds: float, path: str = "/tei/embed"
) -> tuple[int, float]:
    field = "texts" if path == "/encode" else "inputs"  # the lean route's body is /encode's
    bodies = [
        orjson.dumps({field: texts[i : i + per_request] if per_request > 1 else texts[i]})
        for i in range(0, len(texts) - per_request + 1, per_request)
    ] * 50
    run = await drive("tei", HOST, port, path, bodies, per_request, clients, seconds, check=False)
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests")
    return run.sentences, run.seconds


async def measure(pid: int, load: Callable[[], Awaitable[tuple[int, float]]]) -> Figures:
    before = tree_cpu_seconds(pid)
    texts, elapsed = await load()
    used = tree_cpu_seconds(pid) - before
    return Figures(texts / elapsed, 1e6 * used / max(texts, 1))


LOADS = {"32 clients × 1 text": (1, 32), "4 clients × 32 texts": (32, 4)}


class BareEmbed(pb_grpc.EmbedServicer):
    """Embed and EmbedStream answering a constant: what grpcio costs a call and a message, without a service."""

    VECTOR = [0.1767767] * 32  # a unit-length 32-float embedding, the near-free model's width

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        return pb.EmbedResponse(embeddings=self.VECTOR, metadata=pb.Metadata(compute_chars=len(request.inputs)))

    async def EmbedStream(
        self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbedResponse]:
        async for request in requests:
            yield pb.EmbedResponse(embeddings=self.VECTOR, metadata=pb.Metadata(compute_chars=len(request.inputs)))


async def serve_bare(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_EmbedServicer_to_server(BareEmbed(), server)
    server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def start_bare(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.grpc", "--serve-bare", str(port)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready", "the bare server did not start"
    return process


Ways = dict[str, tuple[int, Callable[[int, int], Awaitable[tuple[int, float]]]]]  # way → (its pid, its load)


async def compare(ways: Ways, rounds: int, seconds: float) -> dict[str, dict[str, list[Figures]]]:
    """Each load by each way, taking turns (the order reversed every other round)."""
    results: dict[str, dict[str, list[Figures]]] = {load: {way: [] for way in ways} for load in LOADS}
    for n, clients in LOADS.values():  # warm up
        for _, load in ways.values():
            await load(n, clients)
    for round_ in range(rounds):
        for name, (n, clients) in LOADS.items():
            for way in list(ways) if round_ % 2 == 0 else list(reversed(ways)):
                pid, load = ways[way]
                results[name][way].append(await measure(pid, partial(load, n, clients)))
    return results


def service_ways(pid: int, port: int, target: str, seconds: float) -> Ways:
    texts = make_sentences(2000)
    return {
        "HTTP": (pid, lambda n, clients: http_load(port, texts, n, clients, seconds)),
        "gRPC": (pid, lambda n, clients: grpc_load(target, texts, n, clients, seconds)),
    }


def floor_ways(route: subprocess.Popen, route_port: int, bare: subprocess.Popen, target: str, seconds: float) -> Ways:
    texts = make_sentences(2000)
    return {
        "lean HTTP route": (route.pid, lambda n, clients: http_load(route_port, texts, n, clients, seconds, "/encode")),
        "bare gRPC servicer": (bare.pid, lambda n, clients: grpc_load(target, texts, n, clients, seconds)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="ENCODER_WORKERS: the front ends")
    parser.add_argument("--model", type=Path, help="a model directory (the near-free model by default)")
    parser.add_argument("--floor", action="store_true", help="a bare gRPC servicer against the lean HTTP route")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare is not None:
        asyncio.run(serve_bare(args.serve_bare))
        return
    if args.floor:
        route_port, grpc_port = free_port(), free_port()
        processes = [start_route(route_port), start_bare(grpc_port)]
        ways = floor_ways(processes[0], route_port, processes[1], f"{HOST}:{grpc_port}", args.seconds)
        described = "no service: a bare gRPC servicer and the lean HTTP route"
    else:
        model = args.model or write_tiny_bert(Path(tempfile.mkdtemp(prefix="grpc-")) / "tiny")
        grpc_port, port = free_port(), free_port()
        env = {
            "ENCODER_MODEL_DIR": str(model),
            "ENCODER_WORKERS": str(args.workers),
            "ENCODER_GRPC_PORT": str(grpc_port),
        }
        processes = [start_service(port, env, quiet=True, supervised=True)]
        ways = service_ways(processes[0].pid, port, f"{HOST}:{grpc_port}", args.seconds)
        model_named = "the near-free model" if args.model is None else model
        described = f"ENCODER_WORKERS={args.workers}, {model_named}"
    try:
        results = asyncio.run(compare(ways, args.rounds, args.seconds))
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    print(f"{machine()}; {described}, {args.rounds} rounds of {args.seconds:g} s\n")
    print("| load | way | texts/s (rounds) | median | server CPU µs a text |")
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
