"""What a linear layer costs per number of rows, with torch's default kernels and with oneDNN's reordered weights.

    .venv/bin/python -m bench.linear [--threads N]

One layer the shape of all-MiniLM-L6-v2's feed-forward expansion (384 → 1,536, random weights), called on
row counts 200..499 once each (every count new to the process), then again, then 300 times on one count;
each way in a process of its own, which also reports how much its resident memory grew. The ways:
float32 ``F.linear`` (what the service runs), float32 on a weight reordered once for oneDNN
(``mkldnn._linear_pointwise``), bfloat16 under autocast over float32 weights, and bfloat16 on a reordered
bfloat16 weight. The service's passes have as many rows as their real tokens, a new count in almost every
pass; oneDNN prepares a kernel for every count it meets.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.run import process_memory

WAYS = ("float32", "float32-reordered", "bfloat16-autocast", "bfloat16-reordered")
ROWS = range(200, 500)


def measure(way: str, threads: int) -> str:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    weight, bias = torch.randn(1536, 384), torch.randn(1536)
    inputs = {rows: torch.randn(rows, 384) for rows in ROWS}
    if way == "float32":

        def linear(x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, weight, bias)

    elif way == "bfloat16-autocast":

        def linear(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.linear(x, weight, bias)

    else:
        dtype = torch.float32 if way == "float32-reordered" else torch.bfloat16
        reordered = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), 256)
        cast_bias = bias.to(dtype)

        def linear(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x.to(dtype), reordered, cast_bias, "none", [], "").float()

    with torch.inference_mode():
        linear(torch.randn(5, 384))
        before = process_memory(os.getpid())["VmRSS"]
        times = []
        for _ in range(2):
            started = time.perf_counter()
            for rows in ROWS:
                linear(inputs[rows])
            times.append(1000 * (time.perf_counter() - started) / len(ROWS))
        started = time.perf_counter()
        for _ in range(300):
            linear(inputs[350])
        fixed = 1000 * (time.perf_counter() - started) / 300
    grown = (process_memory(os.getpid())["VmRSS"] - before) / 2**20
    return f"| {way} | {times[0]:.2f} | {times[1]:.2f} | {fixed:.2f} | {grown:.0f} |"


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=positive, default=1, help="torch threads (default 1, as one lane)")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a child process
    args = parser.parse_args()
    if args.way:
        print(measure(args.way, args.threads))
        return
    print(f"ms a call ({args.threads} thread(s)); resident memory grown over {len(ROWS)} row counts\n")
    print("| way | each count, first call | each count, again | one count (350 rows) | MiB grown |")
    print("|---|---:|---:|---:|---:|")
    for way in WAYS:
        command = [sys.executable, "-m", "bench.linear", "--threads", str(args.threads), "--way", way]
        print(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
