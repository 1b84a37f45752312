"""The largest-batch throughput of the embedding pass, in tokens/s, and the share of the device's peak it reaches.

    .venv/bin/python -m bench.throughput [--model DIR] [--length 128] [--rows 128 512 2048]

Runs on CUDA when there is one (float16, as the service does), else on the CPU (the service's ``auto`` dtype).
For each batch shape (rows × length, every row a full ``length`` tokens: no padding, so that every product
counts) it times, after a warm-up:

- ours: the service's embedding pass (``TextEncoder.last_hidden_state``, the traced graph) on tensors already
  on the device;
- ours, the GELU apart: the same where the pass computes the feed-forward's GELU in the product's epilogue (a
  GPU in half precision), with the GELU as a kernel of its own;
- ours, the norms apart: the same where the pass adds each residual and norms the sum in one kernel, and looks
  up, sums and norms the embeddings in one (a GPU in half precision), with torch's kernels instead;
- transformers: ``AutoModel`` in the same dtype (its default attention, SDPA), on the same tensors;

and prints tokens/s, the matrix-product rate that implies (the FLOPs of the products a token needs, counted
from the config, 2 per multiply-add, attention's two products included), and that rate as a share of a
plain float16 (bfloat16 on a CPU) 8192³ matrix product measured on the same device a moment before. On a
GPU whose dense float16 peak is in PEAKS it is also given as a share of that datasheet figure.

Device time is measured with CUDA events around ``repeats`` passes (host clock on the CPU); the median
of ``rounds`` such runs is reported. With ``--profile`` each pass is then run once more at the largest batch
under torch's profiler, and the operations that took the most device time (CPU time without a GPU) are listed:
where one pass spends what the other does not.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from model import TextEncoder, load_model
from model.spec.config import EncoderConfig

# Dense (no sparsity) float16 tensor-core peaks from the vendors' datasheets, TFLOP/s, by device-name fragment.
PEAKS = {
    "H100 80GB HBM3": 989.4,  # H100 SXM5
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10G": 125.0,
    "A10": 125.0,
    "T4": 65.0,
}


def flops_per_token(config: EncoderConfig, length: int) -> float:
    """Multiply-adds × 2 of one token's matrix products through every layer, at sequence length ``length``:
    the fused q/k/v and output projections, the feed-forward (two halves of the first product under a GLU),
    and attention's scores and weighted sum. Embeddings, norms, softmax and activations are not products."""
    d, f = config.d_model, config.d_ff
    projections = 3 * d * d + d * d
    feed_forward = d * f * (2 if config.glu else 1) + f * d
    attention = 2 * length * d
    return 2.0 * config.n_layers * (projections + feed_forward + attention)


def timed(run: Callable[[], object], device: torch.device, repeats: int, rounds: int) -> float:
    """Median seconds of one call of ``run``, over ``rounds`` runs of ``repeats`` calls each."""
    for _ in range(3):
        run()
    results = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                run()
            end.record()
            end.synchronize()
            results.append(start.elapsed_time(end) / 1000 / repeats)
        else:
            started = time.perf_counter()
            for _ in range(repeats):
                run()
            results.append((time.perf_counter() - started) / repeats)
    return statistics.median(results)


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int) -> float:
    """FLOP/s of a size³ matrix product in ``dtype`` on random data, measured here."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    seconds = timed(lambda: torch.mm(a, b), device, repeats=10 if device.type == "cuda" else 1, rounds=5)
    return 2 * size**3 / seconds


def datasheet_peak(device: torch.device) -> tuple[str, float] | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, tflops in PEAKS.items():
        if fragment in name:
            return name, tflops * 1e12
    return None


def write_bert_base(directory: Path) -> Path:
    """A checkpoint of BERT-base's shape (768 wide, 12 layers of 12 heads, 3,072 in the feed-forward) with random
    weights and the bundled tokenizer: the share of the peak a wider model reaches (no pretrained BERT-base
    can be fetched where this runs, and the speed does not depend on the weights)."""
    from transformers import BertConfig, BertModel

    from bench.run import with_bundled_tokenizer

    config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    torch.manual_seed(0)
    return with_bundled_tokenizer(directory, BertModel(config))


def ours(model: TextEncoder, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> object:
    with torch.inference_mode():
        return model.last_hidden_state(*inputs)


def packed(model: TextEncoder, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> object:
    """The eager pass with the attention core on the packed tokens too (``Encoder.varlen``)."""
    encoder = model.passes
    served, encoder.varlen = encoder.varlen, True
    try:
        with torch.inference_mode(), model.computing():
            return encoder(*inputs).last_hidden_state
    finally:
        encoder.varlen = served


def apart(model: TextEncoder, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], fused: str) -> object:
    """Ours with one fusion undone for the pass: ``gelu_in_product`` (``PositionwiseFeedForward.fuse_gelu``: the
    GELU a kernel of its own) or ``norms_fused`` (``EncoderLayer.fuse_norms``, ``Embeddings.fuse_norm``: torch's
    additions, lookups and LayerNorms). A CUDA graph replays what it recorded, whatever the flags say now."""
    modules = [module for module in model.passes.modules() if getattr(module, fused, False) is True]
    for module in modules:
        setattr(module, fused, False)
    try:
        return ours(model, inputs)
    finally:
        for module in modules:
            setattr(module, fused, True)


def theirs(reference: torch.nn.Module, model: TextEncoder, inputs: tuple[torch.Tensor, ...]) -> object:
    input_ids, mask, segments = inputs
    kwargs = {"input_ids": input_ids, "attention_mask": mask}
    if model.card.config.type_vocab_size > 1:
        kwargs["token_type_ids"] = segments
    autocast = model.device.type == "cpu" and model.dtype != torch.float32  # as ours: float32 weights, autocast
    with torch.inference_mode(), torch.autocast(model.device.type, dtype=model.dtype, enabled=autocast):
        return reference(**kwargs).last_hidden_state


def profiled(who: str, run: Callable[[], object], device: torch.device, rows: int = 12) -> None:
    """The operations of ``run`` (after a warm-up call) that took the most device time, as torch's profiler
    tables them, with the number of kernels launched a pass."""
    from torch.profiler import ProfilerActivity, profile

    run()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as recorded:
        run()
        if cuda:
            torch.cuda.synchronize(device)
    averages = recorded.key_averages()
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\n### {who}: the operations that took the most {'device' if cuda else 'CPU'} time in one pass\n")
    print(averages.table(sort_by=sort_by, row_limit=rows, max_name_column_width=60))
    if cuda:
        kernels = sum(event.count for event in averages if event.device_type == torch.autograd.DeviceType.CUDA)
        print(f"kernels launched in the pass: {kernels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled one)")
    parser.add_argument("--length", type=int, default=128, help="tokens in every row")
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="rows a pass (default: by device)")
    parser.add_argument("--dtype", default="auto", help="as ENCODER_DTYPE (default: auto)")
    parser.add_argument("--bert-base", action="store_true", help="a random checkpoint of BERT-base's shape instead")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers")
    parser.add_argument(
        "--padded", action="store_true", help="rows of 1/4 to all of --length real tokens, the rest padding"
    )
    parser.add_argument("--packed", action="store_true", help="also the eager pass with packed attention (varlen)")
    parser.add_argument(
        "--profile", action="store_true", help="then the operations of each pass at the largest batch, profiled"
    )
    args = parser.parse_args()

    path = args.model
    if args.bert_base:
        import tempfile

        path = write_bert_base(Path(tempfile.mkdtemp(prefix="bert-base-")))
    model = load_model(path, dtype=args.dtype, name="BERT-base shape, random weights" if args.bert_base else None)
    device, dtype = model.device, model.dtype
    cuda = device.type == "cuda"
    rows_list = args.rows or ([128, 512, 2048] if cuda else [32, 128])
    length = min(args.length, model.card.max_tokens)
    per_token = flops_per_token(model.card.config, length)
    sheet = datasheet_peak(device)
    where = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(
        f"{model.card.name} on {device} ({where}), {str(dtype).removeprefix('torch.')} products, "
        f"torch {torch.__version__}"
    )
    print(f"{per_token / 1e6:.1f} MFLOP of matrix products a token at {length} tokens a row")
    if args.padded:
        print("rows of 1/4 to all of the length, right-padded: tokens/s and FLOPs count the real tokens only")
    size, dtype_name = 8192 if cuda else 2048, str(dtype).removeprefix("torch.")
    peak = matmul_rate(device, dtype, size)
    print(f"a {size}³ {dtype_name} matrix product here: {peak / 1e12:.1f} TFLOP/s")
    if sheet is not None:
        print(f"datasheet dense float16 peak of the {sheet[0]}: {sheet[1] / 1e12:.1f} TFLOP/s")

    reference = None
    if not args.no_reference:
        from transformers import AutoModel

        reference = AutoModel.from_pretrained(model.card.path, dtype=dtype if cuda else torch.float32).to(device).eval()

    header = "| rows × tokens | who | tokens/s | TFLOP/s | of the measured product |"
    header += " of the datasheet peak |" if sheet else ""
    print()
    print(header)
    print("|---|---|---:|---:|---:|" + ("---:|" if sheet else ""))
    generator = torch.Generator().manual_seed(0)
    passes: list[tuple[str, Callable[[], object]]] = []
    for rows in rows_list:
        ids = torch.randint(1000, model.card.config.vocab_size, (rows, length), generator=generator)
        mask = torch.ones_like(ids)
        if args.padded:  # right padding, as the tokenizer pads
            real = torch.randint(max(1, length // 4), length + 1, (rows,), generator=generator)
            mask = (torch.arange(length)[None, :] < real[:, None]).long()
            ids = ids.masked_fill(mask == 0, model.card.config.pad_token_id)
        input_ids, mask = ids.to(device), mask.to(device)  # random tokens: the time does not depend on which
        segments = torch.zeros_like(input_ids)
        tokens = int(mask.sum())  # real tokens: what a pass is for
        repeats = max(1, min(50, (2 << 20) // tokens)) if cuda else 1
        inputs = (input_ids, mask, segments)
        passes = [("ours", partial(ours, model, inputs))]
        if args.packed:
            passes.append(("ours, packed attention (eager)", partial(packed, model, inputs)))
        for fused, who in (("gelu_in_product", "ours, the GELU apart"), ("norms_fused", "ours, the norms apart")):
            if any(getattr(module, fused, False) is True for module in model.passes.modules()):
                passes.append((who, partial(apart, model, inputs, fused)))
        if reference is not None:
            passes.append(("transformers", partial(theirs, reference, model, inputs)))
        for who, run in passes:
            seconds = timed(run, device, repeats, rounds=5 if cuda else 3)
            rate = tokens / seconds
            tflops = rate * per_token
            line = f"| {rows} × {length} | {who} | {rate:,.0f} | {tflops / 1e12:.1f} | {tflops / peak:.1%} |"
            line += f" {tflops / sheet[1]:.1%} |" if sheet else ""
            print(line, flush=True)
    if args.profile:
        for who, run in passes:  # the largest batch's
            profiled(f"{who}, {rows_list[-1]} × {length}", run, device)
    if cuda:
        print(f"\npeak GPU memory held by torch's tensors: {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
