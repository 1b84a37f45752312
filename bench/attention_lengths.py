"""torch's attention kernel for the CPU at each padded length, and the pass at aligned lengths against as it was.

    .venv/bin/python -m bench.attention_lengths [--threads 1] [--texts 960]

1. The kernel: ``scaled_dot_product_attention`` on a padded batch the shape of all-MiniLM-L6-v2's (32 rows, 12
   heads of 32), a key mask, at lengths from 20 to 129 tokens, each as it is and rounded up to a multiple of 16
   (``aligned_length``, model/runtime/backends.py): the least of 7 calls, ms, float32 and (where the CPU has
   bfloat16 products) bfloat16.
2. The pass: the bundled model's passes of 32 generated sentences through its CPU torch pass (the traced graph,
   bucketed rows under bfloat16) with ``AlignedLength`` around it and without, each batch three times, the two
   ways interleaved in alternating order, the least of each batch's three summed: texts/s and their ratio.

Only ratios from one run are compared: the cores are shared and the machine's speed drifts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from bench.run import cpu_flags, machine, make_sentences
from model import EmbeddingSpec, load_model, tasks
from model.runtime.backends import AlignedLength, aligned_length
from model.runtime.loader import cpu_bfloat16

LENGTHS = (20, 25, 30, 35, 40, 45, 50, 55, 60, 70, 80, 100, 129)


def least_ms(call: Callable[[], object], times: int = 7) -> float:
    call()
    spans = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        spans.append(time.perf_counter() - started)
    return min(spans) * 1000


def kernel_rows(dtypes: list[torch.dtype]) -> list[str]:
    rows, heads, head_dim = 32, 12, 32
    lines = [
        "| tokens | " + " | ".join(f"{str(d)[6:]}, as is | {str(d)[6:]}, aligned" for d in dtypes) + " |",
        "|---:|" + "---:|---:|" * len(dtypes),
    ]
    for length in LENGTHS:
        cells = []
        for dtype in dtypes:
            for padded in (length, aligned_length(length, 512)):
                q, k, v = torch.randn(3, rows, heads, padded, head_dim, dtype=dtype)
                mask = (torch.arange(padded) < length - 3)[None, None, None, :].expand(rows, 1, 1, padded)
                cells.append(f"{least_ms(partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)):.2f}")
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return lines


def pass_line(dtype: str, texts: list[str]) -> str:
    model = load_model(device="cpu", dtype=dtype, runtime="torch")
    (aligned,) = model.backends
    assert isinstance(aligned, AlignedLength)
    ways = {"as it was": (aligned.inner,), "aligned": (aligned,)}
    spec = EmbeddingSpec(model.card.config.n_layers, model.card.pooling.mode, True)
    batches = [model.card.tokenizer.encode(texts[start : start + 32]) for start in range(0, len(texts), 32)]
    total = dict.fromkeys(ways, 0.0)
    for index, batch in enumerate(batches):
        spans: dict[str, list[float]] = {way: [] for way in ways}
        for repeat in range(3):
            order = list(ways) if (index + repeat) % 2 == 0 else list(ways)[::-1]
            for way in order:
                model.backends = ways[way]
                started = time.perf_counter()
                tasks.embed_texts(model, batch, [spec] * len(batch))
                spans[way].append(time.perf_counter() - started)
        if index:  # the first batch warms both up
            for way in ways:
                total[way] += min(spans[way])
    counted = len(texts) - len(batches[0])
    rates = {way: counted / seconds for way, seconds in total.items()}
    return (
        f"{dtype}: as it was {rates['as it was']:.0f} texts/s, aligned {rates['aligned']:.0f} "
        f"({rates['aligned'] / rates['as it was']:.3f}×)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--texts", type=int, default=960)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = [torch.float32, torch.bfloat16] if cpu_bfloat16() else [torch.float32]
    print(f"{machine()}; {cpu_flags()}; torch {torch.__version__}, {args.threads} thread(s)\n")
    print("The kernel, 32 rows × 12 heads of 32, ms (least of 7):\n")
    print("\n".join(kernel_rows(dtypes)))
    texts = make_sentences(args.texts, seed=12)
    print("\nThe pass, all-MiniLM-L6-v2, passes of 32:\n")
    for dtype in dtypes:
        print(pass_line(str(dtype)[6:], texts))


if __name__ == "__main__":
    main()
