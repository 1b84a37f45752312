"""A decoder embedder on OpenVINO through optimum-intel: what a CPU user gets from ``OVModelForFeatureExtraction``.

    .venv-cpu-peers/bin/python -m bench.decoder_peers --model DIR --inputs NPZ   (bench.decoders --peers drives it)

Runs in the environment of the CPU peers (optimum-intel beside the pinned torch: ``make bench-cpu-peers`` installs
it), as a child of bench.decoders, which tells it when each variant takes its turn in each round beside ours and
transformers'. The checkpoint is exported once (``export=True``, offline, into a temporary directory) and compiled
twice: with the precision hint f32 (exact) and at OpenVINO's default precision (bfloat16 on a CPU with bfloat16
units). The passes are the parent's, read from ``--inputs`` (an npz of ``ids_SIZE_I`` and ``mask_SIZE_I``), so that
every party computes the same padded batches.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HINTS = {"float32": {"INFERENCE_PRECISION_HINT": "f32"}, "bfloat16": {}}  # the parent's dtype → ov_config


def main() -> None:
    """Load every variant, say so (one JSON line), then answer one line per command: ``speed DTYPE SIZE`` runs the
    passes of SIZE texts and answers texts/s; ``hidden DTYPE PATH`` saves the last hidden state of the first pass
    of 32 to PATH (.npy); ``quit`` ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint's directory")
    parser.add_argument("--inputs", type=Path, required=True, help="the parent's padded passes (npz)")
    parser.add_argument("--dtypes", nargs="+", default=list(HINTS))
    args = parser.parse_args()

    from optimum.intel import OVModelForFeatureExtraction  # type: ignore[import-not-found]

    with np.load(args.inputs) as saved:
        arrays = dict(saved)
    passes: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for key in sorted(k for k in arrays if k.startswith("ids_")):
        _, size, index = key.split("_")
        passes.setdefault(int(size), []).append((arrays[key], arrays[f"mask_{size}_{index}"]))

    scratch = Path(tempfile.mkdtemp(prefix="decoder-peers-"))
    atexit.register(shutil.rmtree, scratch, True)  # the exported model: gigabytes, not to pile up in /tmp
    loaded, load_s = {}, {}
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answers
        began = time.perf_counter()
        OVModelForFeatureExtraction.from_pretrained(args.model, export=True, compile=False).save_pretrained(scratch)
        exported = time.perf_counter() - began
        for dtype in args.dtypes:
            began = time.perf_counter()
            loaded[dtype] = OVModelForFeatureExtraction.from_pretrained(scratch, ov_config=HINTS[dtype])
            for size in passes:  # compiled and warmed, as the parent warms ours: two passes of each size
                for ids, mask in passes[size][:2]:
                    loaded[dtype](input_ids=ids, attention_mask=mask)
            load_s[dtype] = exported + time.perf_counter() - began
    print(json.dumps({"load_s": load_s}), flush=True)

    def run(dtype: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.asarray(loaded[dtype](input_ids=ids, attention_mask=mask).last_hidden_state, dtype=np.float32)

    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "speed":
            dtype, size = arguments[0], int(arguments[1])
            began = time.perf_counter()
            for ids, mask in passes[size]:
                run(dtype, ids, mask)
            texts = sum(len(ids) for ids, _ in passes[size])
            print(json.dumps(texts / (time.perf_counter() - began)), flush=True)
        elif command == "hidden":
            np.save(arguments[1], run(arguments[0], *passes[32][0]))
            print(json.dumps(arguments[1]), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
