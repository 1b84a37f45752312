"""int8 on the CPU: the schemes tried for all-MiniLM-L6-v2's pass, each's speed against its accuracy.

    .venv/bin/python -m bench.int8 [--sentences 1100] [--rounds 3] [--no-write]

Our encoder converted by OpenVINO (model/runtime/openvino_pass.py, ``convert``), then quantized by NNCF in each scheme —
weights and activations (W8A8, static, calibrated on 320 generated sentences of the repository's own word list,
bench/texts.py: no dataset download) with NNCF's transformer preset, with per-layer exceptions (the feed-forward
contraction, the whole feed-forward, the attention output, the first and last layers kept), with smooth-quant;
weights alone (int8, asymmetric, per output channel), with OpenVINO's dynamic quantization of the activations that
meet them at its default (groups of 32 values) and otherwise (off; groups of 64, 128 and 384), symmetric, and with the
feed-forward contraction kept out of int8 (groups of 64 elsewhere) — and compiled with
float32 and with bfloat16 around the int8 parts (bfloat16 where the CPU has it). Each embeds the same sentences as
bench.runtimes, through tasks.embed_texts: texts/s in passes of 32 (median of the rounds, the schemes
taking turns), and against float32 OpenVINO the least and mean cosine and the top-10 neighbour agreement (100
queries among the rest). What the service runs for ENCODER_DTYPE=int8 was chosen from this table
(model/runtime/openvino_pass.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.accuracy import accuracy_cells
from bench.run import cpu_flags, machine, make_sentences, publish
from bench.runtimes import CPU_RUNTIMES, embed
from model import load_model
from model.runtime.loader import cpu_bfloat16, cpu_threads, example_batch
from model.runtime.openvino_pass import OpenVINOPass, compile_for_cpu, convert, int8_weights

SECTION = "int8 on the CPU"
CALIBRATION = 320  # generated sentences, in passes of 32


def schemes(converted: Any, calibration: list[list[np.ndarray]]) -> dict[str, Callable[[], Any]]:
    """Each scheme's quantized model, made when called."""
    import nncf
    from nncf import IgnoredScope
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    dataset = nncf.Dataset(calibration)
    linears = [op.get_friendly_name() for op in converted.get_ordered_ops() if op.get_type_name() == "MatMul"]

    def static(keep: Callable[[str], bool] = lambda name: False, **kwargs: Any) -> Callable[[], Any]:
        kept = [name for name in linears if keep(name)]
        scope = IgnoredScope(names=kept) if kept else None
        return lambda: nncf.quantize(
            converted,
            dataset,
            subset_size=CALIBRATION,
            model_type=nncf.ModelType.TRANSFORMER,
            ignored_scope=scope,
            **kwargs,
        )

    def weights(mode: Any, keep: Callable[[str], bool] = lambda name: False) -> Callable[[], Any]:
        kept = [name for name in linears if keep(name)]
        scope = IgnoredScope(names=kept) if kept else None

        def compressed() -> Any:  # on a copy: NNCF's weight compression changes the model it is given
            with contextlib.redirect_stdout(io.StringIO()):  # its progress bar
                return nncf.compress_weights(converted.clone(), mode=mode, ignored_scope=scope)

        return compressed

    smooth = AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=0.5))
    return {
        "W8A8 (transformer preset)": static(),
        "W8A8, feed-forward contraction kept": static(lambda name: ".contract/" in name),
        "W8A8, contraction and attention output kept": static(lambda name: ".contract/" in name or ".out/" in name),
        "W8A8, feed-forward kept (contraction and expansion)": static(
            lambda name: ".contract/" in name or ".expand/" in name
        ),
        "W8A8, contraction, first and last layers kept": static(
            lambda name: ".contract/" in name or ".layers.0." in name or f".layers.{len(linears) // 4 - 1}." in name
        ),
        "W8A8, smooth-quant 0.5": static(advanced_parameters=smooth),
        # NNCF's weight compression changes the model it is given: each on a copy
        "weights alone (int8 asymmetric, per channel)": lambda: int8_weights(converted.clone()),
        **{name: lambda: int8_weights(converted.clone()) for name in DYNAMIC_GROUPS},
        "weights alone, symmetric (no zero point)": weights(nncf.CompressWeightsMode.INT8_SYM),
        CONTRACTION_KEPT: weights(nncf.CompressWeightsMode.INT8_ASYM, lambda name: ".contract/" in name),
    }


# The weights-alone scheme again, compiled with OpenVINO's dynamic quantization of the activations that meet int8
# weights set otherwise than its default (groups of 32 values): off, and coarser groups.
DYNAMIC_GROUPS: dict[str, int] = {
    "weights alone, activations not quantized (dynamic quantization off)": 0,
    "weights alone, activations quantized in groups of 64": 64,
    "weights alone, activations quantized in groups of 128": 128,
    "weights alone, activations quantized in groups of 384 (a row of all-MiniLM-L6-v2)": 384,
}
# Weights alone with the feed-forward's contraction (whose input, after GELU, holds the widest activations) left out
# of int8, so that OpenVINO quantizes no activation there, and the coarser groups of 64 elsewhere.
CONTRACTION_KEPT = "weights alone, feed-forward contraction kept, activations in groups of 64"
GROUPS: dict[str, int] = {**DYNAMIC_GROUPS, CONTRACTION_KEPT: 64}


def packed_pass(encoder: Any, quantized: Any, hint: str, threads: int, **properties: Any) -> OpenVINOPass:
    """The service's packed pass (padding skipped) around a model converted and quantized here rather than by the
    loader, compiled with ``hint`` around its int8 parts (and OpenVINO's CPU ``properties``, where given)."""
    import openvino

    ours = OpenVINOPass.__new__(OpenVINOPass)
    ours.encoder, ours.precision, ours.quantize, ours.padded = encoder, hint, "int8", False
    ours.compiled, ours._requests = compile_for_cpu(quantized, hint, threads, **properties), threading.local()
    ours.bfloat16_out = ours.compiled.output(0).get_element_type() == openvino.Type.bf16
    return ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1100, help="sentences embedded for the accuracy")
    parser.add_argument("--speed-sentences", type=int, default=320, help="sentences a speed round embeds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave cpu-runtimes.md alone")
    args = parser.parse_args()

    import nncf

    nncf.set_log_level(40)
    threads = cpu_threads()
    model = load_model(device="cpu", dtype="float32", runtime="torch")
    example = example_batch(model)
    converted = convert(model.passes, example)
    calibration = []
    texts = make_sentences(CALIBRATION, seed=21)
    for at in range(0, len(texts), 32):
        batch = model.to_tensors(model.card.tokenizer.pad(model.card.tokenizer.encode(texts[at : at + 32])))
        calibration.append([tensor.numpy() for tensor in batch])
    hints = ["f32", "bf16"] if cpu_bfloat16() else ["f32"]
    passes: dict[str, OpenVINOPass] = {}
    took: dict[str, float] = {}

    def compiled(quantized: Any, hint: str, group: int | None = None) -> OpenVINOPass:
        properties = {} if group is None else {"DYNAMIC_QUANTIZATION_GROUP_SIZE": group}
        return packed_pass(model.passes, quantized, hint, threads, **properties)

    for hint in hints:
        passes[f"OpenVINO {hint}, no int8"] = compiled(converted, hint)
        took[f"OpenVINO {hint}, no int8"] = 0.0
    for name, make in schemes(converted, calibration).items():
        began = time.perf_counter()
        quantized = make()
        spent = time.perf_counter() - began
        for hint in hints:
            passes[f"{name} [{hint}]"] = compiled(quantized, hint, GROUPS.get(name))
            took[f"{name} [{hint}]"] = spent

    def run(name: str, texts: list[str]) -> np.ndarray:
        model.backends = (passes[name],)  # one pass at a time, in this thread
        return embed(model, texts, 32)

    sentences = make_sentences(args.sentences, seed=11)
    speed_texts = make_sentences(args.speed_sentences, seed=12)
    names = list(passes)
    rates: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for name in names:
            run(name, speed_texts[:64])  # warm up
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                began = time.perf_counter()
                run(name, speed_texts)
                rates[name].append(len(speed_texts) / (time.perf_counter() - began))
        vectors = {name: run(name, sentences) for name in names}
    reference = vectors[names[0]]
    base = statistics.median(rates[names[0]])
    rows = [
        "| scheme [precision around it] | texts/s, passes of 32 | ÷ OpenVINO f32 | least cosine | mean cosine | "
        "top-10 agreement | quantizing s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        rate = statistics.median(rates[name])
        rows.append(
            f"| {name} | {rate:,.0f} | {rate / base:.2f} | {accuracy_cells(vectors[name], reference)} | "
            f"{took[name]:.1f} |"
        )
    about = [
        f"Measured on {machine()}; CPU flags: {cpu_flags()}; {threads} threads.",
        f"Command: `python -m bench.int8 --sentences {args.sentences} --rounds {args.rounds}`. all-MiniLM-L6-v2's "
        f"pass converted by OpenVINO and quantized by NNCF; speed on {len(speed_texts)} generated sentences, "
        f"median of {args.rounds} rounds taking turns; accuracy on {len(sentences)} others against OpenVINO "
        "float32 (equal to torch float32 within 1e-5).",
    ]
    publish(SECTION, about, rows, not args.no_write, CPU_RUNTIMES)


if __name__ == "__main__":
    main()
