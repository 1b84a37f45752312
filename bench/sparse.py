"""/encode/sparse against sentence-transformers' SparseEncoder in process, and what a vector costs in each encoding.

    .venv/bin/python -m bench.sparse [--seconds 10] [--rounds 3]

A random SPLADE model the size of all-MiniLM-L6-v2 (6 layers, 384 wide, BERT's 30,522-token vocabulary and MLM
head, SpladePooling max; the bundled tokenizer), saved by sentence-transformers itself. Two parties, alternating
every round on the same generated sentences (8 to 40 words):

- the service (``python -m app.serve`` defaults, this checkout): 4 clients × 32 texts to /encode/sparse over HTTP;
- ``SparseEncoder.encode`` in this process, batches of 32, returning its sparse tensors.

Prints texts/s, each round and the median, and the ratio round by round (the goal of "Every retrieval
representation": at least 1.0). Then the bytes a text's vector takes in /encode's answer on all-MiniLM-L6-v2 in
each encoding_format (float, base64, binary), and in /encode/sparse's (indices and values).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from bench.run import cpu_flags, drive, free_port, machine, make_sentences, start_service

HOST = "127.0.0.1"
BATCH = 32


def write_splade(directory: Path) -> Path:
    """A MiniLM-sized random BertForMaskedLM with SpladePooling, saved by sentence-transformers."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    from bench.run import with_bundled_tokenizer
    from model import default_model_path

    torch.manual_seed(0)
    config = BertConfig.from_pretrained(default_model_path())
    mlm = with_bundled_tokenizer(directory / "mlm", BertForMaskedLM(config))
    encoder = SparseEncoder(modules=[Transformer(str(mlm), transformer_task="fill-mask"), SpladePooling("max")])
    encoder.save(str(directory / "splade"))
    return directory / "splade"


def in_process(encoder: object, sentences: list[str], seconds: float) -> float:
    """SparseEncoder.encode in batches of 32 for ``seconds``: texts/s."""
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = sentences[done % len(sentences) :][:BATCH] or sentences[:BATCH]
        encoder.encode(batch, batch_size=BATCH, convert_to_tensor=True)  # type: ignore[attr-defined]
        done += len(batch)
    return done / (time.perf_counter() - started)


async def sizes(port: int, splade_port: int, sentences: list[str]) -> None:
    """Bytes a text's vector takes in the JSON answers (the mean over the sentences)."""
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        print("\nbytes a text in the answer (mean over the texts, JSON body):")
        for fmt in ("float", "base64", "binary"):
            body = {"texts": sentences, "encoding_format": fmt}
            answer = (await client.post(f"http://{HOST}:{port}/encode", json=body)).json()
            per_text = sum(len(orjson.dumps(item["embedding"])) for item in answer["data"]) / len(sentences)
            print(f"  /encode, all-MiniLM-L6-v2, encoding_format {fmt}: {per_text:.0f}")
        answer = (await client.post(f"http://{HOST}:{splade_port}/encode/sparse", json={"texts": sentences})).json()
        per_text = sum(len(orjson.dumps([item["indices"], item["values"]])) for item in answer["data"]) / len(sentences)
        non_zero = sum(len(item["indices"]) for item in answer["data"]) / len(sentences)
        print(f"  /encode/sparse, the random SPLADE model: {per_text:.0f} ({non_zero:.0f} non-zero weights a text)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from sentence_transformers import SparseEncoder

    print(f"{machine()}; CPU flags: {cpu_flags()}")
    directory = write_splade(Path(tempfile.mkdtemp(prefix="sparse-")))
    sentences = make_sentences(2000)
    bodies = [orjson.dumps({"texts": sentences[i : i + BATCH]}) for i in range(0, len(sentences), BATCH)] * 20
    encoder = SparseEncoder(str(directory), device="cpu")
    port, plain_port = free_port(), free_port()
    service = start_service(port, {"ENCODER_MODEL_DIR": str(directory)}, quiet=True, supervised=True)
    plain = None
    try:
        ours: list[float] = []
        theirs: list[float] = []
        asyncio.run(drive("warm-up", HOST, port, "/encode/sparse", bodies[:8], BATCH, 4, 10))
        in_process(encoder, sentences, 3)
        for round_ in range(args.rounds):
            for party in ("service", "SparseEncoder") if round_ % 2 == 0 else ("SparseEncoder", "service"):
                if party == "service":
                    run = asyncio.run(drive("s", HOST, port, "/encode/sparse", bodies, BATCH, 4, args.seconds))
                    assert not run.errors, f"{run.errors} failed requests"
                    ours.append(run.rate)
                else:
                    theirs.append(in_process(encoder, sentences, args.seconds))
        print(f"\n/encode/sparse, 4 clients × {BATCH} texts, against SparseEncoder.encode (batches of {BATCH})\n")
        print("| party | texts/s (rounds) | median |\n|---|---|---:|")
        for name, rates in (("the service", ours), ("SparseEncoder in process", theirs)):
            print(f"| {name} | {', '.join(f'{r:.1f}' for r in rates)} | {statistics.median(rates):.1f} |")
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        print(f"\nservice ÷ SparseEncoder: {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})")
        plain = start_service(plain_port, {}, quiet=True, supervised=True)
        asyncio.run(sizes(plain_port, port, sentences[:64]))
    finally:
        for process in (service, plain):
            if process is not None:
                process.terminate()
                process.wait(60)


if __name__ == "__main__":
    main()
