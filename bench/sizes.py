"""torch's pass against OpenVINO's on encoders of growing size, in process: where the runtime rule's size term sits.

    .venv/bin/python -m bench.sizes [--rounds 2]

Random BERTs (the bundled tokenizer) of 1 layer 32 wide, 2 layers 128 wide, 3 layers 256 wide and 6 layers 384 wide
(all-MiniLM-L6-v2's shape), each loaded with ``ENCODER_RUNTIME=torch`` and ``openvino`` in float32, embed 40 single
texts one at a time and 8 batches of 32 texts through ``TextEncoder.embed`` (the service's own pass), ``--rounds``
times each after a warm-up; the best round is reported, wall time and this process's CPU time per pass, and
OpenVINO's over torch's (below 1: OpenVINO the faster). Random weights time as real ones do.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.run import print_header, with_bundled_tokenizer
from bench.texts import make_sentences
from model import TextEncoder, load_model
from model.runtime.loader import layer_weights

SHAPES = [(1, 32, 2, 64), (2, 128, 2, 512), (3, 256, 4, 1024), (6, 384, 12, 1536)]  # layers, width, heads, d_ff


def write_bert(directory: Path, layers: int, width: int, heads: int, d_ff: int) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=d_ff)
    torch.manual_seed(0)
    return with_bundled_tokenizer(directory, BertModel(config))


def timed(model: TextEncoder, inputs: Sequence[list[str]], rounds: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) a pass, the best of ``rounds``."""
    for texts in inputs[:3]:
        model.embed(texts)
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for texts in inputs:
            model.embed(texts)
        this = ((time.perf_counter() - wall) / len(inputs), (time.process_time() - cpu) / len(inputs))
        best = this if best is None or this[0] < best[0] else best
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print_header("sizes")
    sentences, rng = make_sentences(400, seed=3), random.Random(0)
    ones = [[text] for text in rng.sample(sentences, 40)]
    batches = [rng.sample(sentences, 32) for _ in range(8)]
    print(
        "| layers × width | weights in its layers | one text: torch, OpenVINO ms (CPU ms) | ÷ | 32 texts: torch, "
        "OpenVINO ms (CPU ms) | ÷ |"
    )
    print("|---|---:|---|---:|---|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for layers, width, heads, d_ff in SHAPES:
            directory = write_bert(Path(scratch) / f"{layers}x{width}", layers, width, heads, d_ff)
            one, batch = {}, {}
            for runtime in ("torch", "openvino"):
                model = load_model(directory, device="cpu", dtype="float32", runtime=runtime)
                one[runtime], batch[runtime] = timed(model, ones, args.rounds), timed(model, batches, args.rounds)
            weights = layer_weights(model.card.config)

            def cells(times: dict[str, tuple[float, float]]) -> str:
                (tw, tc), (ow, oc) = times["torch"], times["openvino"]
                return f"{tw * 1e3:.2f}, {ow * 1e3:.2f} ({tc * 1e3:.2f}, {oc * 1e3:.2f}) | {ow / tw:.2f}"

            print(f"| {layers} × {width} | {weights:,} | {cells(one)} | {cells(batch)} |", flush=True)


if __name__ == "__main__":
    main()
