"""What a second OpenMP team costs a pass: why the service runs all of its torch work on one thread.

``python -m bench.openmp``: one-text passes of the bundled model on this thread, in blocks, alternating
between nothing else and a second thread that has run one torch operation (so it holds an OpenMP team of
its own) and stays alive. Prints each block's median pass in milliseconds.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from bench.run import make_sentences
from model import TextEncoder, load_model


def block(model: TextEncoder, texts: list[str]) -> float:
    times = []
    for text in texts:
        started = time.perf_counter()
        model.embed([text])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(rounds: int = 5) -> None:
    texts = make_sentences(40)
    model = load_model()
    model.warm_up()
    torch.set_grad_enabled(False)
    release = threading.Event()

    def second_team() -> None:
        torch.randn(1000, 1000) @ torch.randn(1000, 1000)  # a parallel region: this thread now has a team
        release.wait()

    alone, beside = [], []
    for _ in range(rounds):
        alone.append(block(model, texts))
        release.clear()
        thread = threading.Thread(target=second_team)
        thread.start()
        time.sleep(0.2)
        beside.append(block(model, texts))
        release.set()
        thread.join()  # the team goes with its thread
        time.sleep(0.2)
    print(f"torch threads: {torch.get_num_threads()}; one-text pass, median of each block of {len(texts)}, ms")
    print("one OpenMP team       ", " ".join(f"{x:.1f}" for x in alone), f" median {statistics.median(alone):.1f}")
    print("a second team alive   ", " ".join(f"{x:.1f}" for x in beside), f" median {statistics.median(beside):.1f}")


if __name__ == "__main__":
    main()
