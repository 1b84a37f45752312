"""What a large answer costs through the processes: /attention of every layer and head, as npz, side by side.

    .venv/bin/python -m bench.large_answers --against ../before [--rounds 5]

Starts two services on the bundled all-MiniLM-L6-v2, each as ``python -m app.serve`` with ``ENCODER_WORKERS=2``
(front ends around an engine, so that the answer crosses from the engine to a front end): this checkout's and
``--against``'s (``git worktree add ../before <commit>``), and ``--one-process``: this checkout in one process,
where nothing crosses. From a new connection each time, in turn, it asks for the attention weights of every layer
and head of a text cut at the model's 256 tokens (6 × 12 × 256² float32: 19 MB) as NumPy npz, and prints each
service's seconds a request, each round and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import orjson

from bench.run import ATTENTION_TEXT, ROOT, Connection, cpu_flags, free_port, machine, start_service


async def timed(port: int, body: bytes) -> tuple[float, int]:
    connection = await Connection.open("127.0.0.1", port)
    try:
        started = time.perf_counter()
        status, answer = await connection.request("POST", "/attention", body, "Accept: application/x-npz\r\n")
        assert status == 200 and len(answer) > 1_000_000, (status, answer[:200])
        return time.perf_counter() - started, len(answer)
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout, served beside this one")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    text = " ".join([ATTENTION_TEXT] * 8)
    body = orjson.dumps({"text": text})
    env = {"ENCODER_WORKERS": "2", "ENCODER_DEVICE": "cpu", "ENCODER_MAX_ATTENTION_VALUES_BINARY": str(10**9)}
    services = {}
    try:
        for name, checkout, as_processes in (
            ("this checkout, 2 front ends", ROOT, True),
            (f"{args.against}, 2 front ends", args.against.resolve(), True),
            ("this checkout, one process", ROOT, False),
        ):
            port = free_port()
            services[name] = (port, start_service(port, env, checkout, quiet=True, supervised=as_processes))
        seconds: dict[str, list[float]] = {name: [] for name in services}
        for port, _ in services.values():
            _, size = asyncio.run(timed(port, body))  # warm
        for round_ in range(args.rounds):
            order = list(services) if round_ % 2 == 0 else list(reversed(services))
            for name in order:
                seconds[name].append(asyncio.run(timed(services[name][0], body))[0])
    finally:
        for _, process in services.values():
            process.terminate()
            process.wait(60)
    print(f"\n{machine()}; {cpu_flags()}")
    print(f"/attention, every layer and head of 256 tokens as npz ({size / 1e6:.1f} MB), {args.rounds} rounds\n")
    print("| service | seconds a request (rounds) | median |")
    print("|---|---|---:|")
    for name, values in seconds.items():
        print(f"| {name} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.median(values):.3f} |")


if __name__ == "__main__":
    main()
