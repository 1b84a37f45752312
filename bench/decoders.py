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
import atexit
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.run import Child, make_sentences, with_bundled_tokenizer

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
    with_bundled_tokenizer(directory, model)
    # the rotary base where transformers before 5 reads it too (Qwen3's own config.json has it there), so that
    # optimum-intel's environment computes the same model (it would take 10,000 for a missing rope_theta)
    config_file = directory / "config.json"
    config_json = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config_json, "rope_theta": QWEN3_06B["rope_theta"]}, indent=2))
    return directory


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


def rate(run: Callable[[Inputs], object], passes: list, texts: int) -> float:
    """Texts a second over every pass (on a GPU, until the device has finished them)."""
    started = time.perf_counter()
    with torch.inference_mode():
        for inputs in passes:
            run(inputs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return texts / (time.perf_counter() - started)


class Peers:
    """optimum-intel's OpenVINO model of the same checkpoint, in a child process of the CPU peers' environment
    (bench/decoder_peers.py), fed the same padded passes; it takes its turns when told."""

    def __init__(self, python: Path, model_dir: Path, passes: dict[int, list[Inputs]], dtypes: list[str]) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="decoders-"))
        inputs = self.scratch / "passes.npz"
        arrays = {}
        for size, each in passes.items():
            for index, (ids, mask, _) in enumerate(each):
                arrays[f"ids_{size}_{index}"], arrays[f"mask_{size}_{index}"] = ids.numpy(), mask.numpy()
        np.savez(inputs, **arrays)  # type: ignore[arg-type]
        command = [str(python), "-m", "bench.decoder_peers", "--model", str(model_dir), "--inputs", str(inputs)]
        self.child = Child([*command, "--dtypes", *dtypes])
        self.load_s: dict[str, float] = self.child.loaded["load_s"]

    def rate(self, dtype: str, size: int) -> float:
        return float(self.child.ask(f"speed {dtype} {size}"))

    def hidden(self, dtype: str) -> torch.Tensor:
        saved = self.scratch / f"hidden-{dtype}.npy"
        self.child.ask(f"hidden {dtype} {saved}")
        return torch.from_numpy(np.load(saved))

    def stop(self) -> None:
        self.child.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


def passes_of(model_dir: Path, device: str = "cpu") -> dict[int, list[Inputs]]:
    """The texts of every pass size (16 single texts, 64 in passes of 32), tokenised and padded."""
    out = {}
    for size in PASS_SIZES:
        texts = make_sentences(16 if size == 1 else 64, seed=size)
        out[size] = [tuple(t.to(device) for t in inputs) for inputs in batches(model_dir, texts, size)]
    return out  # type: ignore[return-value]


def reference_hidden(model_dir: Path, first: Inputs) -> torch.Tensor:
    """transformers' float32 last hidden state of one pass: what every party's is compared with."""
    from transformers import AutoModel

    theirs = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        return theirs(input_ids=first[0], attention_mask=first[1]).last_hidden_state.float()


def speed(
    model_dir: Path,
    dtype: str,
    rounds: int,
    device: str = "cpu",
    runtimes: tuple[str, ...] = ("torch",),
    peers: Peers | None = None,
    reference: torch.Tensor | None = None,
) -> None:
    """Each party's texts/s in passes of 1 and of 32, taking turns (the order rotated every round); and, against
    ``reference`` (transformers float32), the largest difference of its last hidden state on the real tokens."""
    from transformers import AutoModel

    from model import load_model

    runs: dict[str, Callable[[Inputs], torch.Tensor]] = {}
    started: dict[str, float] = {}
    for runtime in runtimes:
        began = time.perf_counter()
        ours = load_model(model_dir, device=device, dtype=dtype, name="qwen3-0.6b-shape", runtime=runtime)
        started[f"ours ({runtime})"] = time.perf_counter() - began
        assert ours.dtype == getattr(torch, dtype), (ours.dtype, dtype)
        runs[f"ours ({runtime})"] = lambda inputs, ours=ours: ours.last_hidden_state(*inputs)  # type: ignore[misc]
    began = time.perf_counter()
    theirs = AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    theirs = theirs.to(device)
    started["transformers"] = time.perf_counter() - began
    runs["transformers"] = lambda inputs: theirs(input_ids=inputs[0], attention_mask=inputs[1]).last_hidden_state
    peer = f"optimum-intel OpenVINO ({'hint f32' if dtype == 'float32' else 'its default precision'})"
    names = [*runs, *([peer] if peers is not None else [])]
    if peers is not None:
        started[peer] = peers.load_s[dtype]
    every = passes_of(model_dir, device)
    print(f"\n{dtype} on {device}: texts/s, {rounds} rounds taking turns, the order rotated every round\n")
    print("| texts a pass | who | rounds | median | ÷ transformers, by round |")
    print("|---:|---|---|---:|---|")
    results: dict[int, dict[str, list[float]]] = {size: {who: [] for who in names} for size in PASS_SIZES}
    for size in PASS_SIZES:
        passes, n = every[size], sum(len(inputs[0]) for inputs in every[size])
        for run in runs.values():  # warm up: the first passes pick their kernels
            rate(run, passes[:2], 2 * size)
        for r in range(rounds):
            for who in names[r % len(names) :] + names[: r % len(names)]:
                got = peers.rate(dtype, size) if who == peer and peers else rate(runs[who], passes, n)
                results[size][who].append(got)
        base = results[size]["transformers"]
        for who, values in results[size].items():
            ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(values, base, strict=True))
            cells = f"{', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} | {ratios}"
            print(f"| {size} | {who} | {cells} |", flush=True)
    if reference is not None:
        first = every[32][0]
        real = first[1].bool().to("cpu")
        print(
            f"\n{dtype}: largest |difference| from transformers float32 on the real tokens of one pass of 32 "
            f"(values up to {reference[real].abs().max():.1f}); load s\n"
        )
        with torch.inference_mode():
            for who in names:
                hidden = peers.hidden(dtype) if who == peer and peers else runs[who](first).float().to("cpu")
                print(f"| {who} | {(hidden[real] - reference[real]).abs().max():.2e} | {started[who]:.1f} |")


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
    parser.add_argument(
        "--runtimes", nargs="+", default=["torch"], help="ours on each (ENCODER_RUNTIME: torch, openvino)"
    )
    parser.add_argument(
        "--peers", type=Path, default=None, help="a Python with optimum-intel (make bench-cpu-peers's environment)"
    )
    args = parser.parse_args()
    if args.device != "cpu" and (args.peers or args.runtimes != ["torch"]):
        parser.error("--runtimes other than torch and --peers are the CPU's")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="qwen3-0.6b-shape-"))
    if args.dir is None:  # a checkpoint of 1.2 GB, written again by every run that keeps none
        atexit.register(shutil.rmtree, directory, True)
    directory.mkdir(parents=True, exist_ok=True)
    write_qwen3(directory, args.layers)
    where = platform.processor() or platform.machine()
    print(f"Qwen3-0.6B shape ({args.layers} layers), random bfloat16 weights, in {directory}")
    print(f"CPU {where}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    every = passes_of(directory)
    reference = reference_hidden(directory, every[32][0]) if args.device == "cpu" else None
    peers = Peers(args.peers, directory, every, args.dtypes) if args.peers else None
    for dtype in args.dtypes:
        speed(directory, dtype, args.rounds, args.device, tuple(args.runtimes), peers, reference)
    if peers is not None:
        peers.stop()
    if args.memory_dtypes != ["none"]:
        memory(directory, args.memory_dtypes)


if __name__ == "__main__":
    main()
