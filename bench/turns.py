"""Services taking turns over HTTP: several at once, each with its own settings (and checkout), under the same loads.

    python -m bench.turns 'ENCODER_DTYPE=bfloat16@/path/to/a/checkout' 'ENCODER_DTYPE=bfloat16' --load 4x32 --load 1x32

Each service is ``python -m app.serve`` of its checkout (this one unless ``@path`` says another) with the environment
its spec names (``KEY=VALUE,KEY=VALUE``), all started first. Then, round after round, every load (``CLIENTS x TEXTS``:
that many keep-alive clients, each sending requests of that many texts, one after another) drives each service in
turn for ``--seconds``, the order rotating with the round, on texts new to every turn. Prints each load's texts/s
by service, and each service's rate over the first's round by round: ratios taken minutes apart at most, which is
what this shared machine can be trusted with.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path

import orjson

from bench.run import ROOT, drive, free_port, make_sentences, start_service, stop_all


def parse_spec(spec: str) -> tuple[dict[str, str], Path]:
    """``KEY=VALUE,KEY=VALUE[@checkout]`` → (the environment, the checkout)."""
    settings, _, checkout = spec.partition("@")
    env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
    return env, Path(checkout) if checkout else ROOT


def parse_load(load: str) -> tuple[int, int]:
    """``CLIENTSxTEXTS`` → (clients, texts a request)."""
    clients, texts = load.lower().split("x")
    return int(clients), int(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("services", nargs="+", help="KEY=VALUE,KEY=VALUE[@checkout], the first the reference")
    parser.add_argument("--load", action="append", default=[], help="CLIENTSxTEXTS (repeatable; default 4x32)")
    parser.add_argument("--seconds", type=float, default=5.0, help="a turn's length")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    loads = [parse_load(load) for load in args.load or ["4x32"]]
    sentences = iter(make_sentences(400_000, seed=21))
    processes, ports = [], []
    try:
        for spec in args.services:
            env, checkout = parse_spec(spec)
            ports.append(free_port())
            processes.append(start_service(ports[-1], env, checkout, quiet=True, supervised=True))

        def bodies(clients: int, texts: int) -> list[bytes]:  # enough new texts for a turn, at up to 500 texts/s
            count = int(500 * args.seconds / texts) + clients
            return [orjson.dumps({"texts": [next(sentences) for _ in range(texts)]}) for _ in range(count)]

        for port in ports:  # warm up: every load once
            for clients, texts in loads:
                asyncio.run(drive("warm-up", "127.0.0.1", port, "/encode", bodies(clients, texts), texts, clients, 2))
        rates: dict[tuple[int, int, int], list[float]] = {}
        for round_ in range(args.rounds):
            for clients, texts in loads:
                order = list(range(len(ports)))
                for i in order[round_ % len(order) :] + order[: round_ % len(order)]:
                    run = asyncio.run(
                        drive(
                            "turn",
                            "127.0.0.1",
                            ports[i],
                            "/encode",
                            bodies(clients, texts),
                            texts,
                            clients,
                            args.seconds,
                        )
                    )
                    assert run.errors == 0, f"{args.services[i]}: {run.errors} requests failed"
                    rates.setdefault((i, clients, texts), []).append(run.rate)
            print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    finally:
        stop_all(processes)
    for clients, texts in loads:
        print(f"{clients} clients × {texts} texts a request, texts/s (median; ÷ the first service by round):")
        first = rates[(0, clients, texts)]
        for i, spec in enumerate(args.services):
            each = rates[(i, clients, texts)]
            ratios = [mine / theirs for mine, theirs in zip(each, first, strict=True)]
            print(
                f"  [{i}] {statistics.median(each):7.1f}  {statistics.median(ratios):.2f}×"
                f" ({', '.join(f'{r:.2f}' for r in ratios)})  {spec}"
            )


if __name__ == "__main__":
    main()
