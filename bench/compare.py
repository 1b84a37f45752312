"""Two versions of the service side by side, under the loads of ``make bench``: how a change is measured here.

``python -m bench.compare BEFORE [AFTER]``: BEFORE and AFTER are checkouts of this repository (AFTER, by
default, this one; ``git worktree add ../before <commit>`` makes one). ``--before-env NAME=VALUE`` and
``--after-env`` set one side's settings: ``python -m bench.compare . --before-env ENCODER_RUNTIME=openvino
--after-env ENCODER_RUNTIME=torch`` compares two settings of one checkout. Each is started as ``make bench``
starts the service (all-MiniLM-L6-v2 as ``minilm`` and a MiniLM-sized random cross-encoder as ``ce``), with
this environment's Python, and both stay up. The cases then run in short phases that alternate between the
two (the order reversed every round), so that the machine's drift from minute to minute falls on both
alike; a two-core virtual machine's speed swings by a quarter within minutes. Prints each case's median
over the rounds, then the rounds.

Cases: a (32 clients × 1 text, /encode, texts/s), b (4 × 32 texts, texts/s), idle (1 client × 1 text, p50
ms), d (/rerank 4 × 32 documents, pairs/s), e (/v1/embeddings 32 × 1, texts/s).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from bench.run import (
    LATENCY_CASES,
    ROOT,
    Load,
    drive,
    free_port,
    get,
    make_sentences,
    service_loads,
    start_service,
    write_cross_encoder,
)

HOST = "127.0.0.1"
UNITS = {"a": "texts/s", "b": "texts/s", "idle": "p50 ms", "d": "pairs/s", "e": "texts/s", "f": "texts/s"}
IDLE_TEXTS = 150  # an idle phase: at most this many sequential texts


async def run_case(loads: dict[str, Load], case: str, port: int, seconds: float) -> float:
    """One phase of ``case`` on ``port``: texts (or pairs) a second, or the p50 in ms for idle."""
    run = await loads[case].drive(port, seconds)
    if run.errors:
        raise RuntimeError(f"{run.errors} failed requests in case {case} on port {port}")
    return run.percentile(50) if case in LATENCY_CASES else run.rate


async def compare(ports: dict[str, int], cases: list[str], rounds: int, seconds: float) -> None:
    sentences = make_sentences(2000)
    loads = service_loads(sentences, "", IDLE_TEXTS, 0)  # no /attention case here
    # a queue deeper than the lanes' fair shares, whose passes are cut by the token budget (the soak's /encode)
    deep = [orjson.dumps({"texts": sentences[i : i + 64]}) for i in range(0, len(sentences) - 63, 64)]
    loads["f"] = Load("(f) 16 clients × 64 texts", "/encode", deep, 64, 16)
    for port in ports.values():
        await drive("warm-up", HOST, port, "/encode", loads["a"].bodies[:64], 1, 8, 30)
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(rounds):
        order = list(ports.items())
        if round_ % 2:
            order.reverse()
        for case in cases:
            for name, port in order:
                results.setdefault((case, name), []).append(await run_case(loads, case, port, seconds))
    for case in cases:
        cells = []
        for name in ports:
            values = results[(case, name)]
            cells.append(f"{name} {statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})")
        print(f"{case:4s} {UNITS[case]:8s} " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a checkout of the version to compare against")
    parser.add_argument("after", type=Path, nargs="?", default=ROOT, help="a checkout (default: this one)")
    parser.add_argument("--cases", default="a,b,idle,d,e", help="comma-separated, of: " + ", ".join(UNITS))
    parser.add_argument(
        "--before-env", action="append", default=[], metavar="NAME=VALUE", help="a setting of BEFORE's service only"
    )
    parser.add_argument(
        "--after-env", action="append", default=[], metavar="NAME=VALUE", help="a setting of AFTER's service only"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if unknown := set(cases) - set(UNITS):
        sys.exit(f"unknown cases: {', '.join(sorted(unknown))}")

    from model import default_model_path

    cross_encoder = write_cross_encoder(Path(tempfile.mkdtemp(prefix="compare-")) / "cross-encoder")
    models = f"minilm={default_model_path()},ce={cross_encoder}"
    services: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    try:
        for name, checkout, settings in (
            ("before", args.before, args.before_env),
            ("after", args.after, args.after_env),
        ):
            env = {"ENCODER_MODELS": models, **dict(setting.split("=", 1) for setting in settings)}
            ports[name] = free_port()
            services[name] = start_service(ports[name], env, checkout.resolve(), quiet=True)
            info = orjson.loads(get(ports[name], "/info"))
            print(f"{name}: {info['dtype']} products, the embedding pass on {info['runtime']}", flush=True)
        asyncio.run(compare(ports, cases, args.rounds, args.seconds))
    finally:
        for process in services.values():
            process.send_signal(signal.SIGTERM)
        for process in services.values():
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
