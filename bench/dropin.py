"""The drop-in routes' cost: /tei/embed, /v2/embed and /v1/embeddings against /encode, under make bench's 32 × 1 load.

    .venv/bin/python -m bench.dropin [--seconds 10] [--rounds 3]

One service (``python -m app.serve`` defaults, the bundled all-MiniLM-L6-v2), 32 concurrent clients each sending
one generated sentence a request, for ``seconds`` a route; the routes take turns, the order reversed every round.
Prints sentences/s and latency percentiles, each round and the median, and each route's ratio to /encode round by
round: what translating TEI's, Cohere's and OpenAI's shapes into the native request costs (the goal of "Drop-in
for the clients users already have": nothing measurable).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import orjson

from bench.run import cpu_flags, drive, free_port, machine, make_sentences, start_service

HOST = "127.0.0.1"
CLIENTS = 32


def bodies(route: str, sentences: list[str]) -> list[bytes]:
    """One request a sentence, in the route's own shape."""
    if route == "/encode":
        return [orjson.dumps({"texts": [text]}) for text in sentences]
    if route == "/tei/embed":
        return [orjson.dumps({"inputs": text}) for text in sentences]
    if route == "/v2/embed":
        model = "all-MiniLM-L6-v2"
        return [orjson.dumps({"model": model, "texts": [text], "input_type": "search_query"}) for text in sentences]
    return [orjson.dumps({"input": text}) for text in sentences]


ROUTES = ("/encode", "/tei/embed", "/v2/embed", "/v1/embeddings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{machine()}; CPU flags: {cpu_flags()}")
    sentences = make_sentences(2000)
    port = free_port()
    service = start_service(port, {}, quiet=True, supervised=True)
    try:
        loads = {route: bodies(route, sentences) * 10 for route in ROUTES}
        for route in ROUTES:  # warm-up
            asyncio.run(drive("warm-up", HOST, port, route, loads[route][:200], 1, CLIENTS, 5, check=False))
        rates: dict[str, list[float]] = {route: [] for route in ROUTES}
        p50: dict[str, list[float]] = {route: [] for route in ROUTES}
        for round_ in range(args.rounds):
            for route in ROUTES if round_ % 2 == 0 else ROUTES[::-1]:
                run = asyncio.run(drive(route, HOST, port, route, loads[route], 1, CLIENTS, args.seconds, check=False))
                assert not run.errors, f"{run.errors} failed requests on {route}"
                rates[route].append(run.rate)
                p50[route].append(run.percentile(50))
    finally:
        service.terminate()
        service.wait(60)
    print(f"\n{CLIENTS} clients × 1 text a request, {args.seconds:g} s a route, {args.rounds} rounds\n")
    print("| route | sentences/s (rounds) | median | p50 ms (median) | ÷ /encode (rounds) |")
    print("|---|---|---:|---:|---|")
    for route in ROUTES:
        ratios = [a / b for a, b in zip(rates[route], rates["/encode"], strict=True)]
        shown = ", ".join(f"{r:.1f}" for r in rates[route])
        print(
            f"| {route} | {shown} | {statistics.median(rates[route]):.1f} | {statistics.median(p50[route]):.1f} | "
            f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) |"
        )


if __name__ == "__main__":
    main()
