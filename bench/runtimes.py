"""The embedding pass on each runtime and precision of a CPU, in process: speed and accuracy against float32 torch.

    .venv/bin/python -m bench.runtimes [--sentences 1100] [--rounds 3] [--no-write] [--peers PYTHON] [--http]

For the bundled all-MiniLM-L6-v2 (the only real weights here: random weights say nothing about accuracy), each
variant — torch float32 (the traced pass), OpenVINO float32 (its precision hint f32), where the CPU has
AVX512-BF16 or AMX torch bfloat16 (autocast products) and OpenVINO bfloat16, and where NNCF is installed
ENCODER_DTYPE=int8 (OpenVINO, int8 weights) — embeds the same generated sentences
(make_sentences) through ``tasks.embed_texts``, the service's own call:

- speed: texts/s in passes of 32 texts and of one text, ``--rounds`` rounds, the variants taking turns in an order
  rotated each round; the median is reported, and each round's ratio to torch float32;
- accuracy: each sentence's cosine to torch float32's embedding (least and mean), and for 100 queries (the first
  100 sentences) against the other 1,000, how many of their 10 nearest neighbours by cosine are torch float32's
  (top-10 agreement, averaged).

With ``--peers`` (``make bench-cpu-peers``) sentence-transformers' own CPU backends — torch, ONNX Runtime float32
and dynamic int8, OpenVINO float32, at its default precision and static int8 — take their turns too, in the same
rounds, from a child process in their own environment (bench/cpu_peers.py), on the same sentences against the
same reference.
With ``--http`` the service itself takes its turns as well (``python -m app.serve`` in its own process, one for
each precision the CPU offers: float32, bfloat16, int8), over keep-alive HTTP: 4 clients each sending 32 texts a
request in the "passes of 32" columns, one client sending one text at a time in the "one text" columns, and 32
clients each sending one text a request (make bench's (a)) in a line under the table.

Prints a table and, unless ``--no-write``, puts it into docs/benchmarks/cpu-runtimes.md under "Runtimes and precisions
(CPU)".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import torch

from bench.accuracy import accuracy_cells
from bench.run import (
    BENCHMARKS,
    ROOT,
    Child,
    Connection,
    cpu_flags,
    drive,
    free_port,
    machine,
    make_sentences,
    publish,
    start_service,
)
from model import EmbeddingSpec, TextEncoder, load_model, tasks
from model.runtime.loader import cpu_bfloat16
from model.runtime.openvino_pass import quantizer_available

SECTION = "Runtimes and precisions (CPU)"
# Texts a round embeds one at a time, each party: at ~10 ms a text the 32 of before took a third of a second, too
# short a sample on a machine whose rounds swing; 96 take about a second.
SINGLES = 96
CPU_RUNTIMES = BENCHMARKS / "cpu-runtimes.md"  # the file SECTION is written into


def variants() -> dict[str, Callable[[], TextEncoder]]:
    found: dict[str, Callable[[], TextEncoder]] = {
        "torch float32": lambda: load_model(device="cpu", dtype="float32", runtime="torch"),
        "OpenVINO float32": lambda: load_model(device="cpu", dtype="float32", runtime="openvino"),
    }
    if cpu_bfloat16():
        found["torch bfloat16"] = lambda: load_model(device="cpu", dtype="bfloat16", runtime="torch")
        found["OpenVINO bfloat16"] = lambda: load_model(device="cpu", dtype="bfloat16", runtime="openvino")
    if quantizer_available():
        found["OpenVINO int8 (ENCODER_DTYPE=int8)"] = lambda: load_model(device="cpu", dtype="int8", runtime="openvino")
    return found


def embed(model: TextEncoder, texts: list[str], size: int) -> np.ndarray:
    """Sentence embeddings (n, D), normalised, in passes of ``size`` texts."""
    spec = EmbeddingSpec(model.card.config.n_layers, model.card.pooling.mode, True)
    out = []
    for start in range(0, len(texts), size):
        encodings = model.card.tokenizer.encode(texts[start : start + size])
        out += [result.sentence for result in tasks.embed_texts(model, encodings, [spec] * len(encodings))]
    return np.stack(out)


class Served:
    """The service in its own process (``python -m app.serve``, as make serve runs it) at one precision: its turns
    over keep-alive HTTP, 4 clients × 32 texts a request and one client × one text, and its embeddings."""

    def __init__(self, dtype: str, checkout: Path = ROOT) -> None:
        self.port = free_port()
        began = time.perf_counter()
        self.process = start_service(self.port, {"ENCODER_DTYPE": dtype}, checkout, quiet=True, supervised=True)
        self.load_s = time.perf_counter() - began

    def rate(self, texts: list[str], size: int, clients: int) -> float:
        bodies = [orjson.dumps({"texts": texts[at : at + size]}) for at in range(0, len(texts), size)]
        run = asyncio.run(drive("service", "127.0.0.1", self.port, "/encode", bodies, size, clients, 600.0))
        assert run.errors == 0, f"{run.errors} requests failed"
        return run.rate

    def vectors(self, texts: list[str]) -> np.ndarray:
        async def ask() -> list[list[float]]:
            connection = await Connection.open("127.0.0.1", self.port)
            out = []
            for at in range(0, len(texts), 32):
                status, payload = await connection.request(
                    "POST", "/encode", orjson.dumps({"texts": texts[at : at + 32]})
                )
                assert status == 200, payload
                out += [row["embedding"] for row in orjson.loads(payload)["data"]]
            connection.close()
            return out

        vectors = np.asarray(asyncio.run(ask()), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1100, help="sentences embedded for the accuracy")
    parser.add_argument("--speed-sentences", type=int, default=320, help="sentences a speed round embeds")
    parser.add_argument(
        "--single-sentences", type=int, default=SINGLES, help="of those, sentences a round embeds one at a time"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave cpu-runtimes.md alone")
    parser.add_argument(
        "--peers", type=Path, default=None, help="a Python with sentence-transformers' backends (bench/cpu_peers.py)"
    )
    parser.add_argument(
        "--http", action="store_true", help="the service over HTTP too, at each precision, in the same rounds"
    )
    parser.add_argument(
        "--before", type=Path, default=None, help="with --http: the service of this checkout too, in the same rounds"
    )
    args = parser.parse_args()

    peers = None
    if args.peers is not None:  # loaded first, in its own process: it takes its turns beside ours in every round
        from model import default_model_path

        command = [str(args.peers), "-m", "bench.cpu_peers", "--model", str(default_model_path())]
        command += ["--sentences", str(args.sentences), "--speed-sentences", str(args.speed_sentences)]
        command += ["--single-sentences", str(args.single_sentences)]
        peers = Child(command)
        loaded = peers.loaded
        for name, why in loaded["missing"].items():
            print(f"{name}: not measured ({why})")

    started: dict[str, float] = {}
    models = {}
    for name, load in variants().items():
        began = time.perf_counter()
        models[name] = load()
        started[name] = time.perf_counter() - began
    services: dict[str, Served] = {}
    if args.http:
        for dtype in (
            "float32",
            *(["bfloat16"] if cpu_bfloat16() else []),
            *(["int8"] if quantizer_available() else []),
        ):
            for label, checkout in (("", ROOT), *([(" before", args.before.resolve())] if args.before else [])):
                name = f"the service{label} over HTTP, ENCODER_DTYPE={dtype} (4 clients × 32; 1 × 1)"
                services[name] = Served(dtype, checkout)
                started[name] = services[name].load_s
    sentences = make_sentences(args.sentences, seed=11)
    speed_texts = make_sentences(args.speed_sentences, seed=12)
    singles = speed_texts[: args.single_sentences]

    with torch.inference_mode():
        for model in models.values():  # warm up
            embed(model, speed_texts[:64], 32)
        for service in services.values():  # warm up
            service.rate(speed_texts[:64], 32, 4)
        names = list(models) + list(services) + (list(loaded["load_s"]) if peers is not None else [])
        if peers is not None:
            started.update(loaded["load_s"])
        rates: dict[str, dict[str, list[float]]] = {name: {"32": [], "1": []} for name in names}
        concurrent: dict[str, list[float]] = {name: [] for name in services}  # 32 clients × 1 text
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                if name in services:  # the service's turn, over HTTP
                    rates[name]["32"].append(services[name].rate(speed_texts, 32, 4))
                    rates[name]["1"].append(services[name].rate(singles, 1, 1))
                    concurrent[name].append(services[name].rate(speed_texts, 1, 32))
                    continue
                if name not in models:  # a peer's turn, in its process
                    assert peers is not None
                    answer = peers.ask(f"speed {name}")
                    rates[name]["32"].append(answer["32"])
                    rates[name]["1"].append(answer["1"])
                    continue
                began = time.perf_counter()
                embed(models[name], speed_texts, 32)
                rates[name]["32"].append(len(speed_texts) / (time.perf_counter() - began))
                began = time.perf_counter()
                embed(models[name], singles, 1)
                rates[name]["1"].append(len(singles) / (time.perf_counter() - began))
        vectors = {name: embed(model, sentences, 32) for name, model in models.items()}
        vectors.update({name: service.vectors(sentences) for name, service in services.items()})
        for service in services.values():
            service.stop()
    if peers is not None:
        with tempfile.TemporaryDirectory() as scratch:
            saved = Path(scratch) / "peers.npz"
            peer_names = peers.ask(f"vectors {saved}")
            assert isinstance(peer_names, list)
            with np.load(saved) as arrays:
                vectors.update({name: arrays[f"arr_{i}"] for i, name in enumerate(peer_names)})
        peers.stop()

    reference = vectors["torch float32"]
    base = rates["torch float32"]
    rows = [
        "| variant | texts/s, passes of 32 | ÷ torch float32, by round | texts/s, one text a pass | ÷ torch float32, "
        "by round | least cosine | mean cosine | top-10 agreement | load s |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for name in names:
        cells = []
        for size in ("32", "1"):
            by_round = ", ".join(f"{a / b:.2f}" for a, b in zip(rates[name][size], base[size], strict=True))
            cells += [f"{statistics.median(rates[name][size]):,.0f}", by_round]
        rows.append(
            f"| {name} | {' | '.join(cells)} | {accuracy_cells(vectors[name], reference)} | {started[name]:.1f} |"
        )
    about = [
        f"Measured on {machine()}; CPU flags: {cpu_flags()}; torch threads {torch.get_num_threads()}.",
        f"Command: `python -m bench.runtimes --sentences {args.sentences} --rounds {args.rounds}"
        f"{' --peers ' + str(args.peers) if args.peers else ''}{' --http' if args.http else ''}"
        f"{' --before ' + str(args.before) if args.before else ''}`. "
        "all-MiniLM-L6-v2 in process through tasks.embed_texts; speed on "
        f"{len(speed_texts)} generated sentences (and {len(singles)} one at a time), median of {args.rounds} "
        f"rounds taking turns; accuracy on {len(sentences)} others against torch float32 (top-10: 100 "
        f"queries among {len(sentences) - 100}). "
        "`load s`: loading, converting, compiling.",
    ]
    for name, each in concurrent.items():
        rows.append("")
        rows.append(
            f"{name.split(' (')[0]}, 32 clients × 1 text a request: {statistics.median(each):,.0f} texts/s "
            f"(rounds {', '.join(f'{rate:,.0f}' for rate in each)})"
        )
    publish(SECTION, about, rows, not args.no_write, CPU_RUNTIMES)


if __name__ == "__main__":
    main()
