"""What the size of a CPU pass costs: why the service cuts CPU passes at a few thousand padded tokens.

``python -m bench.passes``: the bundled model's embedding pass on 1,280 generated sentences and a
cross-encoder of the same size (random weights, as in ``make bench``) on 1,280 (query, document) pairs,
both traced as the service runs them and on a thread of their own as the service's compute thread is.
The texts are cut, in their order, into passes of at most 16,384 / 8,192 / 4,096 / 2,048 padded tokens
(and 128 texts), as the service's queue cuts them; the budgets alternate over three rounds. Prints texts a
second and the page faults the thread took per text at each budget.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from bench.run import make_sentences, write_cross_encoder
from model import load_model, tasks
from model.runtime.loader import trace
from model.spec.outputs import EmbeddingSpec
from model.spec.tokenizer import TokenSequence

BUDGETS = (16384, 8192, 4096, 2048)
MAX_TEXTS = 128  # what 4 clients × 32 texts put in the queue at once


def cut(encodings: Sequence[TokenSequence], budget: int) -> list[list[TokenSequence]]:
    """Passes in order, each at most ``budget`` rows × longest row (the service's WorkQueue rule)."""
    passes: list[list[TokenSequence]] = []
    batch: list[TokenSequence] = []
    longest = 0
    for encoding in encodings:
        longest_with = max(longest, len(encoding.ids))
        if batch and (longest_with * (len(batch) + 1) > budget or len(batch) == MAX_TEXTS):
            passes.append(batch)
            batch, longest_with = [], len(encoding.ids)
        batch.append(encoding)
        longest = longest_with
    return passes + [batch]


def measure(compute: Callable[[list[TokenSequence]], object], encodings: Sequence[TokenSequence]) -> dict[int, list]:
    results: dict[int, list] = {budget: [] for budget in BUDGETS}
    passes = {budget: cut(encodings, budget) for budget in BUDGETS}
    for batch in passes[BUDGETS[0]][:2]:  # warm-up
        compute(batch)
    for _ in range(3):
        for budget in BUDGETS:
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            started = time.perf_counter()
            for batch in passes[budget]:
                compute(batch)
            seconds = time.perf_counter() - started
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
            results[budget].append((len(encodings) / seconds, faults / len(encodings)))
    return results


def run(report: list[str]) -> None:
    torch.set_grad_enabled(False)
    sentences = make_sentences(2000)
    embedder = load_model()
    trace(embedder)
    spec = EmbeddingSpec(embedder.card.config.n_layers, embedder.card.pooling.mode, True)
    texts = embedder.card.tokenizer.encode(sentences[:1280])
    cases = {"embeddings (bundled model)": measure(lambda b: tasks.embed_texts(embedder, b, [spec] * len(b)), texts)}
    with tempfile.TemporaryDirectory() as directory:
        cross_encoder = load_model(write_cross_encoder(Path(directory)))
    trace(cross_encoder)
    pairs = [(sentences[i], document) for i in range(0, 2000 - 33, 33) for document in sentences[i + 1 : i + 33]]
    encoded = cross_encoder.card.tokenizer.encode([q for q, _ in pairs[:1280]], [d for _, d in pairs[:1280]])
    cases["cross-encoder pairs"] = measure(lambda b: tasks.logits(cross_encoder, b), encoded)
    for name, results in cases.items():
        report.append(name)
        for budget, rows in results.items():
            rates = ", ".join(f"{rate:.1f}" for rate, _ in rows)
            faults = ", ".join(f"{f:.0f}" for _, f in rows)
            median = statistics.median(rate for rate, _ in rows)
            line = f"  ≤ {budget:>5} tokens a pass: {rates} → {median:.1f} a second; page faults a text {faults}"
            report.append(line)


def main() -> None:
    report: list[str] = []
    thread = threading.Thread(target=run, args=(report,), name="compute")  # a thread's own arena, as served
    thread.start()
    thread.join()
    print("\n".join(report))


if __name__ == "__main__":
    main()
