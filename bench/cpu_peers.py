"""What a CPU user gets from one line of sentence-transformers: its torch, ONNX Runtime and OpenVINO backends.

    make bench-cpu-peers        (runs this in .venv-cpu-peers, then bench.runtimes in .venv, on the same sentences)

Runs in an environment of its own (sentence-transformers with its onnx and openvino extras, optimum and
optimum-intel, beside the pinned torch; their dependencies are not the service's). For the bundled
all-MiniLM-L6-v2 each backend embeds the same generated sentences as bench.runtimes does (its seeds): speed in
batches of 32 and one text at a time, the median of ``--rounds`` rounds taking turns, and accuracy against the
torch backend in float32 (least and mean cosine, top-10 agreement of 100 queries among 1,000 texts). The ONNX and
OpenVINO models are exported from the bundled checkpoint into a temporary copy, offline.

Backends: torch float32; ONNX Runtime float32; ONNX Runtime int8 (dynamic quantisation, the CPU's own
instructions: avx512_vnni where there); OpenVINO float32 (precision hint f32) and at its default precision
(bfloat16 on a CPU with bfloat16 units). OpenVINO's static int8 needs a calibration data set from a hub, which is
not reachable here: not measured.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.accuracy import top10_agreement
from bench.texts import make_sentences


def backends(model_dir: Path, scratch: Path) -> dict[str, Callable[[], object]]:
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    def onnx_int8() -> object:
        copy = scratch / "onnx-int8"
        shutil.copytree(model_dir, copy, dirs_exist_ok=True)
        model = SentenceTransformer(str(copy), backend="onnx", device="cpu")
        export_dynamic_quantized_onnx_model(model, "avx512_vnni", str(copy))
        return SentenceTransformer(
            str(copy), backend="onnx", device="cpu", model_kwargs={"file_name": "onnx/model_qint8_avx512_vnni.onnx"}
        )

    def copied(name: str) -> str:
        target = scratch / name
        shutil.copytree(model_dir, target, dirs_exist_ok=True)
        return str(target)

    return {
        "sentence-transformers, torch float32": lambda: SentenceTransformer(str(model_dir), device="cpu"),
        "sentence-transformers, ONNX Runtime float32": lambda: SentenceTransformer(
            copied("onnx"), backend="onnx", device="cpu"
        ),
        "sentence-transformers, ONNX Runtime int8 (dynamic)": onnx_int8,
        "sentence-transformers, OpenVINO float32 (hint f32)": lambda: SentenceTransformer(
            copied("openvino-f32"),
            backend="openvino",
            device="cpu",
            model_kwargs={"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}},
        ),
        "sentence-transformers, OpenVINO, its default precision": lambda: SentenceTransformer(
            copied("openvino"), backend="openvino", device="cpu"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the bundled model's directory")
    parser.add_argument("--sentences", type=int, default=1100)
    parser.add_argument("--speed-sentences", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="cpu-peers-"))
    loaded, load_s = {}, {}
    for name, load in backends(args.model, scratch).items():
        began = time.perf_counter()
        try:
            loaded[name] = load()
        except Exception as error:  # a backend that cannot be had here is said, not fatal
            print(f"{name}: not measured ({type(error).__name__}: {error})", flush=True)
            continue
        load_s[name] = time.perf_counter() - began
    sentences = make_sentences(args.sentences, seed=11)  # bench.runtimes' seeds: the same texts
    speed_texts = make_sentences(args.speed_sentences, seed=12)
    singles = speed_texts[: max(16, args.speed_sentences // 10)]
    for model in loaded.values():
        model.encode(speed_texts[:64], batch_size=32)  # type: ignore[attr-defined]
    rates: dict[str, dict[str, list[float]]] = {name: {"32": [], "1": []} for name in loaded}
    names = list(loaded)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            model = loaded[name]
            began = time.perf_counter()
            model.encode(speed_texts, batch_size=32, normalize_embeddings=True)  # type: ignore[attr-defined]
            rates[name]["32"].append(len(speed_texts) / (time.perf_counter() - began))
            began = time.perf_counter()
            for text in singles:
                model.encode([text], normalize_embeddings=True)  # type: ignore[attr-defined]
            rates[name]["1"].append(len(singles) / (time.perf_counter() - began))
    vectors = {
        name: np.asarray(model.encode(sentences, batch_size=32, normalize_embeddings=True))  # type: ignore[attr-defined]
        for name, model in loaded.items()
    }
    reference = vectors[names[0]]
    print("| backend | texts/s, batches of 32 | texts/s, one text | least cosine | mean cosine | top-10 | load s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        cosine = (vectors[name] * reference).sum(axis=1)
        print(
            f"| {name} | {statistics.median(rates[name]['32']):,.0f} | {statistics.median(rates[name]['1']):,.0f} | "
            f"{cosine.min():.6f} | {cosine.mean():.6f} | {top10_agreement(vectors[name], reference):.3f} | "
            f"{load_s[name]:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
