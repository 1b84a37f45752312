"""/encode/multi-vector against sentence-transformers' MultiVectorEncoder in process, and what a text's vectors cost
in each encoding.

    .venv/bin/python -m bench.multi_vector [--seconds 10] [--rounds 3]

A random ColBERT model the size of all-MiniLM-L6-v2 (6 layers, 384 wide; the bundled tokenizer) with
ColBERT's usual parts, saved by sentence-transformers itself: a 384 → 128 projection, queries expanded with
[MASK] to 32 tokens (not attended to), documents up to 180 tokens with punctuation skipped, the vectors
normalised. Two parties, alternating every round on the same generated sentences (8 to 40 words), documents and
then queries (the sentences' first 12 words):

- the service (``python -m app.serve`` defaults, this checkout): 4 clients × 32 texts to /encode/multi-vector
  over HTTP (``is_query`` for queries), the vectors answered as JSON numbers and as base64 (a text's 25 to 32
  vectors of 128 are some 40 kB of JSON numbers);
- ``MultiVectorEncoder.encode_document`` / ``encode_query`` in this process, batches of 32, returning tensors.

Prints texts/s, each round and the median, and the ratio round by round (the goal of "Every retrieval
representation": at least 1.0). Then the bytes a document's vectors take in the answer in each encoding_format
(float, base64, binary).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import string
import tempfile
import time
from pathlib import Path

import orjson

from bench.run import cpu_flags, drive, free_port, machine, make_sentences, start_service

HOST = "127.0.0.1"
BATCH = 32
FORMATS = ("float", "base64")  # the answer's encoding: JSON numbers, or base64 of the float32 bytes


def write_colbert(directory: Path) -> Path:
    """A MiniLM-sized random BERT as a ColBERT MultiVectorEncoder, saved by sentence-transformers."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import BertConfig, BertModel

    from bench.run import with_bundled_tokenizer
    from model import default_model_path

    torch.manual_seed(0)
    bert = with_bundled_tokenizer(directory / "bert", BertModel(BertConfig.from_pretrained(default_model_path())))
    expansion = {"strategy": "fixed", "attend": False, "length": 32}
    transformer = Transformer(str(bert), document_length=180, query_expansion=expansion)
    dense = Dense(384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
    modules = [transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation))]
    modules.append(Normalize(module_input_name="token_embeddings"))
    MultiVectorEncoder(modules=modules, device="cpu").save(str(directory / "colbert"))
    return directory / "colbert"


def in_process(encoder: object, texts: list[str], query: bool, seconds: float) -> float:
    """encode_query or encode_document in batches of 32 for ``seconds``: texts/s."""
    encode = getattr(encoder, "encode_query" if query else "encode_document")
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = texts[done % len(texts) :][:BATCH] or texts[:BATCH]
        encode(batch, batch_size=BATCH)  # a list of tensors
        done += len(batch)
    return done / (time.perf_counter() - started)


async def sizes(port: int, texts: list[str]) -> None:
    """Bytes a document's vectors take in the JSON answer (the mean over the texts)."""
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        print("\nbytes a document's vectors take in the answer (mean over the texts, JSON):")
        for fmt in ("float", "base64", "binary"):
            body = {"texts": texts, "encoding_format": fmt}
            answer = (await client.post(f"http://{HOST}:{port}/encode/multi-vector", json=body)).json()
            per_text = sum(len(orjson.dumps(item["embeddings"])) for item in answer["data"]) / len(texts)
            vectors = sum(len(item["embeddings"]) for item in answer["data"]) / len(texts)
            print(f"  encoding_format {fmt}: {per_text:.0f} ({vectors:.1f} vectors of 128 a text)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from sentence_transformers import MultiVectorEncoder

    print(f"{machine()}; CPU flags: {cpu_flags()}")
    directory = write_colbert(Path(tempfile.mkdtemp(prefix="colbert-")))
    documents = make_sentences(2000)[: 2000 // BATCH * BATCH]  # whole requests of BATCH texts
    queries = [" ".join(text.split()[:12]) for text in documents]
    encoder = MultiVectorEncoder(str(directory), device="cpu")
    port = free_port()
    service = start_service(port, {"ENCODER_MODEL_DIR": str(directory)}, quiet=True, supervised=True)
    try:
        for side, texts in (("documents", documents), ("queries", queries)):
            query = side == "queries"
            bodies = {
                fmt: [
                    orjson.dumps({"texts": texts[i : i + BATCH], "is_query": query, "encoding_format": fmt})
                    for i in range(0, len(texts), BATCH)
                ]
                * 20
                for fmt in FORMATS
            }
            rates: dict[str, list[float]] = {party: [] for party in (*FORMATS, "encoder")}
            asyncio.run(drive("warm-up", HOST, port, "/encode/multi-vector", bodies["float"][:8], BATCH, 4, 10))
            in_process(encoder, texts, query, 3)
            for round_ in range(args.rounds):
                parties = [*FORMATS, "encoder"]
                for party in parties if round_ % 2 == 0 else parties[::-1]:
                    if party == "encoder":
                        rates[party].append(in_process(encoder, texts, query, args.seconds))
                        continue
                    run = asyncio.run(
                        drive("s", HOST, port, "/encode/multi-vector", bodies[party], BATCH, 4, args.seconds)
                    )
                    assert not run.errors, f"{run.errors} failed requests"
                    rates[party].append(run.rate)
            method = "encode_query" if query else "encode_document"
            print(f"\n{side}: /encode/multi-vector, 4 clients × {BATCH} texts, against {method} (batches of {BATCH})\n")
            print("| party | texts/s (rounds) | median |\n|---|---|---:|")
            names = {fmt: f"the service, encoding_format {fmt}" for fmt in FORMATS}
            names["encoder"] = f"MultiVectorEncoder.{method}"
            for party, name in names.items():
                shown = ", ".join(f"{r:.1f}" for r in rates[party])
                print(f"| {name} | {shown} | {statistics.median(rates[party]):.1f} |")
            for fmt in FORMATS:
                ratios = [a / b for a, b in zip(rates[fmt], rates["encoder"], strict=True)]
                shown = ", ".join(f"{r:.2f}" for r in ratios)
                print(f"service ({fmt}) ÷ {method}: {statistics.median(ratios):.2f} ({shown})")
        asyncio.run(sizes(port, documents[:64]))
    finally:
        service.terminate()
        service.wait(60)


if __name__ == "__main__":
    main()
