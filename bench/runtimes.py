"""The embedding pass on each runtime and precision of a CPU, in process: speed and accuracy against float32 torch.

    .venv/bin/python -m bench.runtimes [--sentences 1100] [--rounds 3] [--no-write] [--peers PYTHON]

For the bundled all-MiniLM-L6-v2 (the only real weights here: random weights say nothing about accuracy), each
variant — torch float32 (the traced pass), OpenVINO float32 (its precision hint f32), where the CPU has
AVX512-BF16 or AMX torch bfloat16 (autocast products) and OpenVINO bfloat16, and where NNCF is installed
ENCODER_DTYPE=int8 (OpenVINO, int8 weights) — embeds the same generated sentences
(make_sentences) through ``TextEncoder.embed_encodings``, the service's own call:

- speed: texts/s in passes of 32 texts and of one text, ``--rounds`` rounds, the variants taking turns in an order
  rotated each round; the median is reported, and each round's ratio to torch float32;
- accuracy: each sentence's cosine to torch float32's embedding (least and mean), and for 100 queries (the first
  100 sentences) against the other 1,000, how many of their 10 nearest neighbours by cosine are torch float32's
  (top-10 agreement, averaged).

With ``--peers`` (``make bench-cpu-peers``) sentence-transformers' own CPU backends — torch, ONNX Runtime float32
and dynamic int8, OpenVINO float32 and at its default precision — take their turns too, in the same rounds, from a
child process in their own environment (bench/cpu_peers.py), on the same sentences against the same reference.

Prints a table and, unless ``--no-write``, puts it into BENCHMARKS.md under "Runtimes and precisions (CPU)".
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.accuracy import top10_agreement
from bench.run import ROOT, cpu_flags, machine, make_sentences, write_benchmarks
from model import EmbeddingSpec, TextEncoder, load_model
from model.loader import cpu_bfloat16
from model.openvino_pass import quantizer_available

SECTION = "Runtimes and precisions (CPU)"


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
    spec = EmbeddingSpec(model.config.n_layers, model.pooling.mode, True)
    out = []
    for start in range(0, len(texts), size):
        encodings = model.tokenizer.encode(texts[start : start + size])
        out += [result.sentence for result in model.embed_encodings(encodings, [spec] * len(encodings))]
    return np.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1100, help="sentences embedded for the accuracy")
    parser.add_argument("--speed-sentences", type=int, default=320, help="sentences a speed round embeds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument(
        "--peers", type=Path, default=None, help="a Python with sentence-transformers' backends (bench/cpu_peers.py)"
    )
    args = parser.parse_args()

    peers = None
    if args.peers is not None:  # loaded first, in its own process: it takes its turns beside ours in every round
        from model import default_model_path

        command = [str(args.peers), "-m", "bench.cpu_peers", "--model", str(default_model_path())]
        command += ["--sentences", str(args.sentences), "--speed-sentences", str(args.speed_sentences)]
        peers = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert peers.stdin is not None and peers.stdout is not None
        loaded = json.loads(peers.stdout.readline())
        for name, why in loaded["missing"].items():
            print(f"{name}: not measured ({why})")

    started: dict[str, float] = {}
    models = {}
    for name, load in variants().items():
        began = time.perf_counter()
        models[name] = load()
        started[name] = time.perf_counter() - began
    sentences = make_sentences(args.sentences, seed=11)
    speed_texts = make_sentences(args.speed_sentences, seed=12)
    singles = speed_texts[: max(16, args.speed_sentences // 10)]

    def ask(line: str) -> object:
        assert peers is not None and peers.stdin is not None and peers.stdout is not None
        peers.stdin.write(line + "\n")
        peers.stdin.flush()
        return json.loads(peers.stdout.readline())

    with torch.inference_mode():
        for model in models.values():  # warm up
            embed(model, speed_texts[:64], 32)
        names = list(models) + (list(loaded["load_s"]) if peers is not None else [])
        if peers is not None:
            started.update(loaded["load_s"])
        rates: dict[str, dict[str, list[float]]] = {name: {"32": [], "1": []} for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                if name not in models:  # a peer's turn, in its process
                    answer = ask(f"speed {name}")
                    assert isinstance(answer, dict)
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
    if peers is not None:
        with tempfile.TemporaryDirectory() as scratch:
            saved = Path(scratch) / "peers.npz"
            peer_names = ask(f"vectors {saved}")
            assert isinstance(peer_names, list)
            with np.load(saved) as arrays:
                vectors.update({name: arrays[f"arr_{i}"] for i, name in enumerate(peer_names)})
        assert peers.stdin is not None
        peers.stdin.close()
        peers.wait(60)

    reference = vectors["torch float32"]
    base = rates["torch float32"]
    rows = [
        "| variant | texts/s, passes of 32 | ÷ torch float32, by round | texts/s, one text a pass | ÷ torch float32, "
        "by round | least cosine | mean cosine | top-10 agreement | load s |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for name in names:
        cosine = (vectors[name] * reference).sum(axis=1)  # both normalised
        cells = []
        for size in ("32", "1"):
            by_round = ", ".join(f"{a / b:.2f}" for a, b in zip(rates[name][size], base[size], strict=True))
            cells += [f"{statistics.median(rates[name][size]):,.0f}", by_round]
        rows.append(
            f"| {name} | {' | '.join(cells)} | {cosine.min():.6f} | {cosine.mean():.6f} | "
            f"{top10_agreement(vectors[name], reference):.3f} | {started[name]:.1f} |"
        )
    text = "\n".join(
        [
            f"## {SECTION}",
            "",
            f"Measured on {machine()}; CPU flags: {cpu_flags()}; torch threads {torch.get_num_threads()}.",
            f"Command: `python -m bench.runtimes --sentences {args.sentences} --rounds {args.rounds}"
            f"{' --peers ' + str(args.peers) if args.peers else ''}`. "
            "all-MiniLM-L6-v2 in process through TextEncoder.embed_encodings; speed on "
            f"{len(speed_texts)} generated sentences (and {len(singles)} one at a time), median of {args.rounds} "
            f"rounds taking turns; accuracy on {len(sentences)} others against torch float32 (top-10: 100 "
            f"queries among {len(sentences) - 100}). "
            "`load s`: loading, converting, compiling.",
            "",
            *rows,
            "",
        ]
    )
    print(text)
    if not args.no_write:
        write_benchmarks(text, SECTION)


if __name__ == "__main__":
    main()
