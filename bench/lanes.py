"""One pass at a time on every core, or passes side by side on a core each: why a CPU service has lanes.

``python -m bench.lanes``: the bundled model embeds 960 generated sentences in passes of 16 (in their
order, unsorted, as requests arrive), submitted by two threads the way two inference threads submit
them, to the service's compute lanes (app/engine/compute.py) set up with one lane (each pass on every torch
thread) or two (side by side, each with its share of the threads). Each runs alone and beside a Python thread that takes
1.3 ms of CPU in every 10 (about what the event loop takes under 32 concurrent clients); three rounds,
alternating. Prints texts a second.

Then what a pass of n texts costs on one core, as a lane computes it under load: 320 of the sentences in
passes of 1, 2, 4, 8, 16 and 32, one pass at a time (why the queue gives each lane its fair share, rather
than the few texts that have arrived when it comes free).

Last, the ceiling of make bench's ratios on this machine: in the same rounds, the 960 texts in passes of 16
and of 32 on two lanes, alone, against sentence-transformers' ``encode`` in batches of 32 on every thread
(make bench's in-process reference, which sorts the texts by length). Over HTTP the service also spends CPU
on the event loop, and the load client on the same cores, so its ratios stay below these.

Why two cores get a third lane shows only under HTTP load, where a lane waits for its share of the queue
while the event loop answers and reads requests (docs/benchmarks/cpu-passes.md, "A third compute lane on two cores
(CPU)").
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from app.engine.compute import TORCH_THREADS, ComputeLanes
from bench.run import make_sentences
from model import TextEncoder, load_model, tasks
from model.spec.outputs import EmbeddingSpec
from model.spec.tokenizer import TokenSequence

PASS_TEXTS = 16
PASS_SIZES = (1, 2, 4, 8, 16, 32)


def rate(
    compute: ComputeLanes,
    model: TextEncoder,
    encodings: Sequence[TokenSequence],
    pass_texts: int = PASS_TEXTS,
    submitters: int = 2,
) -> float:
    """Texts a second, in passes of ``pass_texts`` submitted by ``submitters`` threads (inference threads), each
    pass with more queued behind it, as under load."""
    spec = EmbeddingSpec(model.card.config.n_layers, model.card.pooling.mode, True)
    passes = [encodings[i : i + pass_texts] for i in range(0, len(encodings), pass_texts)]
    started = time.perf_counter()
    with ThreadPoolExecutor(submitters) as threads:
        list(threads.map(lambda p: compute.run(tasks.embed_texts, model, p, [spec] * len(p), spread=False), passes))
    return len(encodings) / (time.perf_counter() - started)


class Busy:
    """A Python thread that spins for 1.3 ms in every 10 while on."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            if self.on.is_set():
                started = time.perf_counter()
                while time.perf_counter() - started < 0.0013:
                    pass
            time.sleep(0.0087)


def main(rounds: int = 3) -> None:
    # As in the service, no torch work runs anywhere but on the lanes (a thread that has run an operator holds an
    # OpenMP team, and a second team slows the first): one set of lanes, which loads the model too.
    compute = ComputeLanes("bench")
    model = compute.run(load_model)
    encodings = model.card.tokenizer.encode(make_sentences(960))
    busy = Busy()
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(rounds):
        for beside in (False, True):
            busy.on.set() if beside else busy.on.clear()
            for name, lanes in (("one lane, every thread on each pass", 1), ("two lanes side by side", 2)):
                compute.configure(lanes)  # fresh threads: the previous lanes and their team are gone
                rate(compute, model, encodings[:64])  # warm-up
                results.setdefault((name, beside), []).append(rate(compute, model, encodings))
    busy.stop = True
    print(f"torch threads: {TORCH_THREADS}; {len(encodings)} texts in passes of {PASS_TEXTS}, texts/s (rounds; median)")
    for (name, beside), rates in results.items():
        where = "beside the busy thread" if beside else "alone"
        print(f"{name:38s} {where:23s}", " ".join(f"{r:6.1f}" for r in rates), f"; {statistics.median(rates):.1f}")

    compute.configure(2)  # one pass at a time, with a lane's share of the threads
    sizes: dict[int, list[float]] = {}
    for _ in range(rounds):
        for n in PASS_SIZES:
            rate(compute, model, encodings[:32], n, submitters=1)  # warm-up
            sizes.setdefault(n, []).append(rate(compute, model, encodings[:320], n, submitters=1))
    print(f"one pass at a time with {compute.share()} thread(s), 320 texts, texts/s (rounds; median)")
    for n, rates in sizes.items():
        print(f"passes of {n:2d}", " ".join(f"{r:6.1f}" for r in rates), f"; {statistics.median(rates):.1f}")
    ceiling(compute, model, encodings, rounds)


def ceiling(compute: ComputeLanes, model: TextEncoder, encodings: Sequence[TokenSequence], rounds: int) -> None:
    """Two lanes in passes of 16 and 32 against sentence-transformers in batches of 32, in the same rounds."""
    from sentence_transformers import SentenceTransformer

    sentences = make_sentences(960)
    compute.configure(1)
    reference = compute.run(lambda: SentenceTransformer(str(model.card.path), device="cpu"))

    def sentence_transformers() -> float:
        started = time.perf_counter()
        compute.run(lambda: reference.encode(sentences, batch_size=32))
        return len(sentences) / (time.perf_counter() - started)

    rates: dict[str, list[float]] = {}
    for _ in range(rounds):
        compute.configure(1)
        compute.run(lambda: reference.encode(sentences[:64], batch_size=32))  # warm-up
        rates.setdefault("sentence-transformers, batches of 32", []).append(sentence_transformers())
        compute.configure(2)
        for n in (16, 32):
            rate(compute, model, encodings[:64], n)  # warm-up
            rates.setdefault(f"two lanes, passes of {n}", []).append(rate(compute, model, encodings, n))
    st = rates["sentence-transformers, batches of 32"]
    print(f"{len(sentences)} texts, texts/s (rounds; median), and the ratio to sentence-transformers round by round")
    for name, found in rates.items():
        ratios = " ".join(f"{r / s:.2f}" for r, s in zip(found, st, strict=True))
        print(f"{name:38s}", " ".join(f"{r:6.1f}" for r in found), f"; {statistics.median(found):.1f}  ({ratios})")


if __name__ == "__main__":
    main()
