"""What a CPU user gets from one line of sentence-transformers: its torch, ONNX Runtime and OpenVINO backends.

    make bench-cpu-peers    (bench.runtimes in .venv drives this, in .venv-cpu-peers, as a child: one run)

Runs in an environment of its own (sentence-transformers with its onnx and openvino extras, optimum and
optimum-intel, beside the pinned torch; their dependencies are not the service's), as a child of bench.runtimes
(``--peers``), which tells it when each backend takes its turn in each round beside ours, and reads the
embeddings it saves: the same generated sentences, the same rounds, the same float32 reference. The ONNX and
OpenVINO models are exported from the bundled checkpoint into a temporary copy, offline.

Backends: torch float32; ONNX Runtime float32; ONNX Runtime int8 (dynamic quantisation, the CPU's own
instructions: avx512_vnni where there); OpenVINO float32 (precision hint f32) and at its default precision
(bfloat16 on a CPU with bfloat16 units); OpenVINO int8, static (weights and activations), calibrated as
sentence-transformers' ``export_static_quantized_openvino_model`` does it (optimum-intel's OVQuantizer, NNCF's
default scheme, 300 samples padded to 384 tokens) but on 300 generated sentences other than the measured ones
rather than its default hub data set (GLUE's SST-2), which is not reachable here.
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
from collections.abc import Callable
from pathlib import Path

import numpy as np

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

    def openvino_static_int8() -> object:
        import nncf
        from optimum.intel.openvino import OVConfig, OVQuantizationConfig, OVQuantizer  # type: ignore[import-not-found]

        copy = Path(copied("openvino-int8"))
        model = SentenceTransformer(str(copy), backend="openvino", device="cpu")
        texts = make_sentences(300, seed=13)  # not among the measured sentences (seeds 11 and 12)
        encoded = model.tokenizer(texts, padding="max_length", max_length=384, truncation=True, return_tensors="np")
        samples = [{name: array[i : i + 1] for name, array in encoded.items()} for i in range(len(texts))]
        quantized = scratch / "openvino-int8-static"
        OVQuantizer.from_pretrained(model.transformers_model).quantize(
            calibration_dataset=nncf.Dataset(samples),
            save_directory=quantized,
            ov_config=OVConfig(quantization_config=OVQuantizationConfig(num_samples=len(samples))),
        )
        (copy / "openvino").mkdir(exist_ok=True)
        for suffix in (".xml", ".bin"):  # where export_static_quantized_openvino_model puts it
            saved = quantized / "openvino" / f"openvino_model{suffix}"
            shutil.copy(saved, copy / "openvino" / f"openvino_model_qint8_quantized{suffix}")
        return SentenceTransformer(
            str(copy),
            backend="openvino",
            device="cpu",
            model_kwargs={"file_name": "openvino/openvino_model_qint8_quantized.xml"},
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
        "sentence-transformers, OpenVINO int8 (static, calibrated on 300 generated sentences)": openvino_static_int8,
    }


def main() -> None:
    """Load every backend, say so (one JSON line), then answer bench.runtimes' commands one line each: ``speed NAME``
    runs that backend's speed round and answers its texts/s; ``vectors PATH`` saves every backend's embeddings of
    the accuracy sentences into an npz at PATH; ``quit`` ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the bundled model's directory")
    parser.add_argument("--sentences", type=int, default=1100)
    parser.add_argument("--speed-sentences", type=int, default=320)
    parser.add_argument("--single-sentences", type=int, default=96, help="of those, embedded one at a time")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="cpu-peers-"))
    atexit.register(shutil.rmtree, scratch, True)  # the exported models: gigabytes, not to pile up in /tmp
    loaded, load_s, missing = {}, {}, {}
    for name, load in backends(args.model, scratch).items():
        began = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answers to bench.runtimes (NNCF prints)
                loaded[name] = load()
        except Exception as error:  # a backend that cannot be had here is said, not fatal
            missing[name] = f"{type(error).__name__}: {error}"
            continue
        load_s[name] = time.perf_counter() - began
    sentences = make_sentences(args.sentences, seed=11)  # bench.runtimes' seeds: the same texts
    speed_texts = make_sentences(args.speed_sentences, seed=12)
    singles = speed_texts[: args.single_sentences]
    for model in loaded.values():
        model.encode(speed_texts[:64], batch_size=32)  # type: ignore[attr-defined]
    print(json.dumps({"load_s": load_s, "missing": missing}), flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "speed":
            model = loaded[argument]
            began = time.perf_counter()
            model.encode(speed_texts, batch_size=32, normalize_embeddings=True)  # type: ignore[attr-defined]
            batched = len(speed_texts) / (time.perf_counter() - began)
            began = time.perf_counter()
            for text in singles:
                model.encode([text], normalize_embeddings=True)  # type: ignore[attr-defined]
            print(json.dumps({"32": batched, "1": len(singles) / (time.perf_counter() - began)}), flush=True)
        elif command == "vectors":
            vectors = {
                name: np.asarray(model.encode(sentences, batch_size=32, normalize_embeddings=True))  # type: ignore[attr-defined]
                for name, model in loaded.items()
            }
            np.savez(argument, *vectors.values())
            print(json.dumps(list(vectors)), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
