"""Record how the service answers a fixed corpus of requests, to compare two versions of the code byte for byte.

    .venv/bin/python scripts/answer_corpus.py OUT.jsonl            # from the root of the checkout to record

Run it in two checkouts (say main and a branch that moves code around) and compare the files (``cmp``, or
``diff`` for the line at fault): each line is one request (method, path, body) with the status, the content
type and the body of its answer. The service runs in process (the whole ASGI stack, the short way in included)
on the bundled all-MiniLM-L6-v2 and three tiny random models written by the tests' helpers (a cross-encoder, a
3-label classifier, a SPLADE model), on one compute lane, so the answers depend on the code alone. The corpus
covers every route of every API with good input and bad (``?npz`` at the end of a path: asked with ``Accept:
application/x-npz``); what changes from run to run (Cohere's random ``id``, a model's ``created``, timing
headers) is left out, and floats are rounded to 5 decimals: the same answers to that rounding.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]
LONG = " ".join(f"word{i}" for i in range(400))

# (method, path, JSON body or None): good input and bad, for every API
CORPUS: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("POST", "/encode", {"texts": TEXTS}),
    ("POST", "/encode", {"texts": TEXTS, "return_tokens": True, "return_token_embeddings": True}),
    ("POST", "/encode", {"texts": [LONG], "truncate": False}),
    ("POST", "/encode", {"texts": 3}),
    ("POST", "/encode", {"texts": []}),
    ("POST", "/encode", {"texts": ["x"], "model": "nobody"}),
    ("POST", "/encode", {"texts": ["x"], "dimensions": 0}),
    ("POST", "/encode", {"texts": [LONG], "chunking": {"overlap": 16}}),
    ("POST", "/encode/sparse", {"texts": TEXTS, "model": "splade"}),
    ("POST", "/encode/sparse", {"texts": TEXTS}),
    ("POST", "/encode/late-chunks", {"text": "A fox. A dog. A cat.", "chunks": [[0, 6], [7, 13]]}),
    ("POST", "/encode/multi-vector", {"texts": TEXTS}),
    ("POST", "/tokenize", {"texts": TEXTS}),
    ("POST", "/tokenize", {"texts": ["a"], "text_pair": ["b", "c"]}),
    ("POST", "/attention", {"text": "The fox jumps.", "layers": [0], "heads": [0, 1]}),
    ("POST", "/attention", {"text": "The fox jumps.", "layers": [99]}),
    ("POST", "/attention?npz", {"text": "The fox jumps.", "layers": [0], "heads": [0, 1]}),
    ("POST", "/attention/neuron", {"text": "The fox jumps.", "layer": 1, "head": 2}),
    ("POST", "/attention/heads", {"texts": TEXTS[:2]}),
    ("POST", "/similarity", {"source": "A fox.", "texts": TEXTS, "explain": True}),
    ("GET", "/positional-encoding?length=4&d_model=6", None),
    ("GET", "/positional-encoding?length=0&d_model=6", None),
    ("GET", "/positional-encoding?length=3&kind=learned", None),
    ("GET", "/positional-encoding?length=3&kind=rotary&d_model=4", None),
    ("GET", "/positional-encoding?length=3&kind=relative", None),
    ("POST", "/attention", {"text": "The fox jumps.", "layers": [-1], "aggregate": "mean", "level": "word"}),
    ("POST", "/rerank", {"query": "a fox", "documents": TEXTS, "model": "ce", "return_documents": True}),
    ("POST", "/rerank", {"query": "a fox", "documents": TEXTS}),
    ("POST", "/rerank", {"query": "a fox", "documents": []}),
    ("POST", "/classify", {"texts": TEXTS, "model": "clf"}),
    ("POST", "/classify", {"texts": TEXTS}),
    ("POST", "/v1/embeddings", {"input": TEXTS}),
    ("POST", "/v1/embeddings", {"input": [101, 7592, 102], "encoding_format": "base64"}),
    ("POST", "/v1/embeddings", {"input": ""}),
    ("POST", "/v1/rerank", {"query": "a fox", "documents": TEXTS, "model": "ce", "return_documents": True}),
    ("POST", "/v2/rerank", {"query": "a fox", "documents": TEXTS, "model": "ce"}),
    (
        "POST",
        "/v2/embed",
        {"texts": TEXTS, "model": "minilm", "input_type": "search_query", "embedding_types": ["float", "binary"]},
    ),
    ("POST", "/v2/embed", {"texts": TEXTS, "model": "minilm", "input_type": "search_query", "truncate": "START"}),
    ("POST", "/v2/embed", {"texts": TEXTS}),
    ("POST", "/v2/nothing", {}),
    ("POST", "/tei/embed", {"inputs": TEXTS}),
    ("POST", "/tei/embed", {"inputs": LONG, "truncation_direction": "Left"}),
    ("POST", "/tei/embed", {"inputs": [[101, 7592, 102], "hello"]}),
    ("POST", "/tei/embed", {"inputs": ""}),
    ("POST", "/tei/embed_all", {"inputs": [[101, 7592, 2088, 102]]}),
    ("POST", "/models/splade/tei/embed_sparse", {"inputs": TEXTS}),
    ("POST", "/models/clf/tei/predict", {"inputs": [["a", "b"], ["c"]]}),
    ("POST", "/tei/predict", {"inputs": "a"}),  # an embedder: TEI's 424
    ("POST", "/tei/embed_sparse", {"inputs": "a"}),  # no sparse output: TEI's 424
    ("POST", "/models/ce/tei/embed", {"inputs": "a"}),  # a cross-encoder: TEI's 424
    ("POST", "/classify", {"texts": ["a"]}),  # an embedder: our 422 naming the model
    ("POST", "/models/clf/tei/rerank", {"query": "a", "texts": ["b"]}),  # three labels: TEI's 424
    ("POST", "/rerank", {"query": "a", "documents": ["b"], "model": "clf"}),  # our 422 naming its outputs
    ("POST", "/models/ce/tei/rerank", {"query": "a fox", "texts": TEXTS, "return_text": True, "raw_scores": True}),
    ("POST", "/tei/rerank", {"query": "a fox", "texts": TEXTS}),
    ("POST", "/tei/similarity", {"inputs": {"source_sentence": "a fox", "sentences": TEXTS}}),
    ("POST", "/tei/tokenize", {"inputs": TEXTS[0]}),
    ("POST", "/tei/decode", {"ids": [101, 7592, 102]}),
    ("GET", "/tei/info", None),
    ("GET", "/tei/nothing", None),
    ("GET", "/tei", None),
    ("GET", "/v2", None),
    ("GET", "/models/nobody/tei/info", None),
    ("GET", "/embeddings", None),
    ("GET", "/encode", None),
]


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [rounded(item) for item in value]
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    return value


async def record(out: Path) -> None:
    import httpx

    from app.main import create_app
    from app.settings import Settings
    from model import default_model_path, load_model
    from tests.helpers import wait_until_ready, write_tiny_model
    from tests.retrieval import write_splade

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        directories = {
            "minilm": default_model_path(),
            "ce": write_tiny_model(root / "ce", head="sequence-classification", num_labels=1),
            "clf": write_tiny_model(root / "clf", seed=3, head="sequence-classification", num_labels=3),
            "splade": write_splade(root / "splade", "bert", "max", seed=2),
        }
        models = {
            name: load_model(path, device="cpu", dtype="float32", name=name) for name, path in directories.items()
        }
        app = create_app(Settings(compute_lanes=1), models)  # every pass with the same threads: the same bits
        lines = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
                await wait_until_ready(client)
                for method, path, body in CORPUS:
                    binary = path.endswith("?npz")
                    headers = {"accept": "application/x-npz"} if binary else {}
                    response = await client.request(method, path.removesuffix("?npz"), json=body, headers=headers)
                    kind = response.headers.get("content-type", "")
                    try:
                        answer: Any = rounded(response.json())
                    except ValueError:  # an archive: what it holds, rounded
                        with np.load(io.BytesIO(response.content)) as archive:
                            answer = {name: rounded(archive[name].tolist()) for name in sorted(archive.files)}
                    if path.startswith("/v2/") and isinstance(answer, dict):
                        answer.pop("id", None)  # Cohere's answers carry a random id
                    if path == "/v1/models":
                        for entry in answer["data"]:
                            entry.pop("created")  # when the model was loaded
                    lines.append(json.dumps([method, path, body, response.status_code, kind, answer], sort_keys=True))
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} answers written to {out}")


if __name__ == "__main__":
    asyncio.run(record(Path(sys.argv[1])))
