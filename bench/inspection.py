"""The inspection benchmark: /similarity with explain against /encode, and npz attention against transformers.

    make bench-inspection        (or: .venv/bin/python -m bench.inspection [--quick])

Starts the service on the bundled all-MiniLM-L6-v2 and, from one client over a keep-alive connection,
alternates /encode of 33 texts with /similarity of the first of them against the other 32 with
explain (and without), so that both see the same machine at the same moments; then asks /attention for
every layer and head of a 256-token text as NumPy npz (Accept: application/x-npz). After the service has
stopped, transformers' BertModel (eager, output_attentions) plus numpy.savez runs in-process on the same
token ids. Prints the figures and writes them into docs/benchmarks/inspection.md (section "Inspection (CPU)" or
"(CUDA)").
"""

from __future__ import annotations

import argparse
import asyncio
import io
import signal
import statistics
import time

import numpy as np
import orjson

from bench.run import (
    ATTENTION_TEXT,
    BENCHMARKS,
    Connection,
    cpu_flags,
    free_port,
    machine,
    make_sentences,
    start_service,
    write_benchmarks,
)

NPZ = "Accept: application/x-npz\r\n"
INSPECTION = BENCHMARKS / "inspection.md"


async def drive(port: int, groups: list[list[str]], npz_body: bytes, rounds: int) -> dict[str, list[float]]:
    """Latencies in ms of each case, the similarity cases interleaved with /encode round by round."""
    connection = await Connection.open("127.0.0.1", port)
    cases = {
        "encode": lambda g: ("/encode", orjson.dumps({"texts": g}), ""),
        "similarity": lambda g: ("/similarity", orjson.dumps({"source": g[0], "texts": g[1:]}), ""),
        "explain": lambda g: ("/similarity", orjson.dumps({"source": g[0], "texts": g[1:], "explain": True}), ""),
    }
    latencies: dict[str, list[float]] = {name: [] for name in [*cases, "npz"]}
    try:
        for warm_up in groups[:3]:
            for case in cases.values():
                await connection.request("POST", *case(warm_up)[:2])
        await connection.request("POST", "/attention", npz_body, NPZ)
        for index in range(rounds):
            group = groups[index % len(groups)]
            for name, case in cases.items():
                path, body, headers = case(group)
                started = time.perf_counter()
                status, answer = await connection.request("POST", path, body, headers)
                latencies[name].append((time.perf_counter() - started) * 1000)
                assert status == 200, answer[:300]
        for _ in range(max(rounds // 3, 5)):
            started = time.perf_counter()
            status, answer = await connection.request("POST", "/attention", npz_body, NPZ)
            latencies["npz"].append((time.perf_counter() - started) * 1000)
            assert status == 200, answer[:300]
            with np.load(io.BytesIO(answer)) as archive:
                assert archive["attention"].shape == (6, 12, 256, 256), archive["attention"].shape
    finally:
        connection.close()
    return latencies


def transformers_npz(ids: list[int], rounds: int) -> list[float]:
    """transformers' BertModel with output_attentions, then numpy.savez of the (L, H, T, T) array, in ms."""
    import torch
    from transformers import BertModel

    from model import default_model_path

    bert = BertModel.from_pretrained(default_model_path(), attn_implementation="eager").eval()
    input_ids = torch.tensor([ids])
    times = []
    for index in range(rounds + 2):
        started = time.perf_counter()
        with torch.inference_mode():
            attentions = bert(input_ids=input_ids, output_attentions=True).attentions
        buffer = io.BytesIO()
        np.savez(buffer, attention=torch.stack(attentions)[:, 0].numpy())
        if index >= 2:  # two warm-up rounds
            times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave inspection.md alone")
    args = parser.parse_args()
    rounds = 15 if args.quick else 60

    import torch

    from model import load_model

    sentences = make_sentences(33 * 20, seed=3)
    groups = [sentences[i : i + 33] for i in range(0, len(sentences), 33)]
    tokenizer = load_model(device="cpu", traced=False).card.tokenizer
    long_text = " ".join([ATTENTION_TEXT] * 3)
    encoding = tokenizer.encode([long_text])[0]  # cut to the model's 256 tokens
    assert len(encoding.ids) == 256, len(encoding.ids)
    npz_body = orjson.dumps({"text": long_text})

    port = free_port()
    service = start_service(port, {})
    try:
        latencies = asyncio.run(drive(port, groups, npz_body, rounds))
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)
    reference = transformers_npz(encoding.ids, max(rounds // 3, 5))

    p50 = {name: statistics.median(values) for name, values in latencies.items()}
    reference_p50 = statistics.median(reference)
    tokens = [len(e.ids) for e in tokenizer.encode(sentences)]
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    command = "make bench-inspection" + (" BENCH_ARGS=--quick" if args.quick else "")
    lines = [
        f"## Inspection ({device})",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}{' (quick run)' if args.quick else ''} on "
        f"{machine()}.",
        f"CPU flags: {cpu_flags()}. Command: `{command}` (bench/inspection.py): one client, keep-alive; each round "
        f"sends /encode of 33 texts ({min(tokens)}–{max(tokens)} tokens), then /similarity of the first against the "
        "other 32 without and with explain; then /attention of a 256-token text, every layer and head, as npz; "
        "transformers in-process afterwards, alone.",
        "",
        "| case | requests | p50 ms | p95 ms |",
        "|---|---:|---:|---:|",
    ]
    names = {
        "encode": "/encode, 33 texts",
        "similarity": "/similarity, 1 source + 32 texts",
        "explain": "/similarity with explain, 1 source + 32 texts",
        "npz": "/attention as npz, 256 tokens × 6 layers × 12 heads",
    }
    for key, name in names.items():
        values = sorted(latencies[key])
        lines.append(f"| {name} | {len(values)} | {p50[key]:.1f} | {values[int(0.95 * (len(values) - 1))]:.1f} |")
    lines.append(
        f"| transformers BertModel (output_attentions) + numpy.savez in-process, same 256 tokens | {len(reference)} | "
        f"{reference_p50:.1f} | {sorted(reference)[int(0.95 * (len(reference) - 1))]:.1f} |"
    )
    lines += [
        "",
        "| ratio | measured | goal |",
        "|---|---:|---:|",
        f"| /similarity with explain p50 ÷ /encode of the same 33 texts p50 | {p50['explain'] / p50['encode']:.2f} "
        "| ≤ 1.3 |",
        f"| /attention npz end to end p50 ÷ transformers + numpy.savez in-process p50 | "
        f"{p50['npz'] / reference_p50:.2f} | — |",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_benchmarks(section, f"Inspection ({device})", INSPECTION)
        print(f"written to {INSPECTION}")


if __name__ == "__main__":
    main()
