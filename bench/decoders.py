"""A decoder embedder of Qwen3-Embedding-0.6B's shape: our pass against transformers', and the memory each keeps.

    .venv/bin/python -m bench.decoders [--layers 28] [--rounds 3] [--dtypes float32] [--dir DIR]

Writes (once, into ``--dir`` when given) a random checkpoint of Qwen3-0.6B's shape: 28 layers 1,024 wide, 16 query
heads over 8 key/value heads of 128, a 3,072-wide SwiGLU, per-head query/key RMSNorm, a 151,936-token vocabulary,
stored in bfloat16 as Qwen3 ships (random weights: the speed does not depend on them; no pretrained checkpoint can be
fetched where this runs). The bundled tokenizer cuts the texts (its ids are within the vocabulary).

Speed, for each dtype of ``--dtypes`` (the CPU: float32 unless asked): generated sentences (8 to 40 words) padded
into passes of 1 and of 32 texts, the same tensors for both: ours (``TextEncoder.last_hidden_state``, the traced
pass the service runs, on the real tokens only) and transformers' ``AutoModel`` (SDPA attention, its default), in
this process, alternating every round. Prints texts/s, the median over ``--rounds``, and each round's ratio.

Memory: each library loads the checkpoint in each dtype in a process of its own and reads every weight once (a
file mapped lazily counts as it will once in use); the resident memory the process grew by is the loaded model's
(float32 from a bfloat16 checkpoint is a widened copy; bfloat16 keeps the stored tensors).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.run import make_sentences, with_bundled_tokenizer

# Qwen3-0.6B's config.json, the fields that shape the computation.
QWEN3_06B: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
PASS_SIZES = (1, 32)


def write_qwen3(directory: Path, layers: int) -> Path:
    """The random Qwen3-0.6B-shaped checkpoint, bare (``Qwen3Model``), bfloat16, with the bundled tokenizer."""
    from transformers import Qwen3Config, Qwen3Model

    if (directory / "model.safetensors").is_file():
        return directory
    config = Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": layers}, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Qwen3Model(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)  # type: ignore[arg-type]
    with torch.no_grad():  # normal(0, 0.02) as transformers initialises, norms at 1
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0) if name.endswith("norm.weight") else parameter.normal_(0.0, 0.02)
    model.config.dtype = torch.bfloat16
    return with_bundled_tokenizer(directory, model)


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (B, T) input ids, attention mask, token type ids


def batches(model_dir: Path, texts: list[str], size: int) -> list[Inputs]:
    """The texts tokenised (the bundled tokenizer, as our loader reads it) and padded into passes of ``size``."""
    from model.spec.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_file(model_dir / "tokenizer.json", 512, 0)
    encodings = tokenizer.encode(texts)
    out: list[Inputs] = []
    for start in range(0, len(encodings), size):
        batch = tokenizer.pad(encodings[start : start + size])
        out.append(
            (
                torch.from_numpy(batch.input_ids),
                torch.from_numpy(batch.attention_mask),
                torch.from_numpy(batch.token_type_ids),
            )
        )
    return out


def rate(run: Callable[[tuple[torch.Tensor, ...]], object], passes: list, texts: int) -> float:
    """Texts a second over every pass (on a GPU, until the device has finished them)."""
    started = time.perf_counter()
    with torch.inference_mode():
        for inputs in passes:
            run(inputs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return texts / (time.perf_counter() - started)


def speed(model_dir: Path, dtype: str, rounds: int, device: str = "cpu") -> None:
    from transformers import AutoModel

    from model import load_model

    ours = load_model(model_dir, device=device, dtype=dtype, name="qwen3-0.6b-shape")
    torch_dtype = getattr(torch, dtype)
    theirs = AutoModel.from_pretrained(model_dir, dtype=torch_dtype, attn_implementation="sdpa").eval().to(device)
    assert ours.dtype == torch_dtype, (ours.dtype, torch_dtype)
    runs: dict[str, Callable[[tuple[torch.Tensor, ...]], object]] = {
        "ours": lambda inputs: ours.last_hidden_state(*inputs),
        "transformers": lambda inputs: theirs(input_ids=inputs[0], attention_mask=inputs[1]).last_hidden_state,
    }
    print(
        f"\n{dtype} on {device}: texts/s, {rounds} rounds"
        " (ours, transformers alternating, the order reversed every round)\n"
    )
    print("| texts a pass | texts | who | rounds | median | ratio ours / transformers, round by round |")
    print("|---:|---:|---|---|---:|---|")
    for size in PASS_SIZES:
        n = 16 if size == 1 else 64
        texts = make_sentences(n, seed=size)
        passes = [tuple(t.to(device) for t in inputs) for inputs in batches(model_dir, texts, size)]
        for run in runs.values():  # warm up: the first passes pick their kernels
            rate(run, passes[:2], 2 * size)
        results: dict[str, list[float]] = {who: [] for who in runs}
        for r in range(rounds):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for who in order:
                results[who].append(rate(runs[who], passes, n))
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(results["ours"], results["transformers"], strict=True))
        for who, values in results.items():
            line = (
                f"| {size} | {n} | {who} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |"
            )
            print(line + (f" {ratios} |" if who == "ours" else " |"), flush=True)


MEMORY_CHILD = """
import json, sys, torch, transformers
from bench.run import process_memory
import model
library, directory, dtype = sys.argv[1:4]
before = process_memory(__import__("os").getpid())["VmRSS"]
if library == "ours":
    loaded = model.load_model(directory, device="cpu", dtype=dtype)
    kept = {str(p.dtype) for p in loaded.encoder.parameters()}
else:
    loaded = transformers.AutoModel.from_pretrained(directory, dtype=getattr(torch, dtype))
    kept = {str(p.dtype) for p in loaded.parameters()}
with torch.inference_mode():  # read every weight once, so that a lazily mapped file counts as it will in use
    for tensor in (loaded.encoder if library == "ours" else loaded).state_dict().values():
        tensor.sum()
after = process_memory(__import__("os").getpid())
print(json.dumps({"grown": after["VmRSS"] - before, "peak": after["VmHWM"] - before, "kept": sorted(kept)}))
"""


def memory(model_dir: Path, dtypes: list[str]) -> None:
    print("\nResident memory a loaded model adds to its process (MiB), each load in a fresh process\n")
    print("| dtype | who | resident after loading | peak while loading | weights kept in |")
    print("|---|---|---:|---:|---|")
    for dtype in dtypes:
        for library in ("ours", "transformers"):
            done = subprocess.run(
                [sys.executable, "-c", MEMORY_CHILD, library, str(model_dir), dtype],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            kept = ", ".join(k.removeprefix("torch.") for k in result["kept"])
            grown, peak = result["grown"] / 2**20, result["peak"] / 2**20
            print(f"| {dtype} | {library} | {grown:,.0f} | {peak:,.0f} | {kept} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=QWEN3_06B["num_hidden_layers"], help="layers (28: the 0.6B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", nargs="*", default=["float32"], help="dtypes of the speed runs")
    parser.add_argument(
        "--memory-dtypes", nargs="+", default=["float32", "bfloat16"], help="dtypes of the loads (none: no loads)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoint is kept (default: a temporary)")
    parser.add_argument("--device", default="cpu", help="where the speed runs go (cpu, cuda)")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="qwen3-0.6b-shape-"))
    directory.mkdir(parents=True, exist_ok=True)
    write_qwen3(directory, args.layers)
    where = platform.processor() or platform.machine()
    print(f"Qwen3-0.6B shape ({args.layers} layers), random bfloat16 weights, in {directory}")
    print(f"CPU {where}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    for dtype in args.dtypes:
        speed(directory, dtype, args.rounds, args.device)
    if args.memory_dtypes != ["none"]:
        memory(directory, args.memory_dtypes)


if __name__ == "__main__":
    main()
