"""Late chunking of one long text on a ModernBERT-shaped model: the time of POST /encode/late-chunks and the
memory it takes.

    .venv/bin/python -m bench.late_chunks [--tokens 8000] [--repeats 3]

A random model of ModernBERT-base's shape (22 layers, 768 wide, 12 heads, 1,152-wide gated feed-forward,
global attention every third layer and a 128-token window in the others, 8,192 positions; the bundled
tokenizer, so a 30,522-token vocabulary), served by ``python -m app.serve`` (this checkout, defaults). One
text of ``--tokens`` tokens (generated sentences), its chunks the sentences (``chunks`` null): one pass over
the whole text, each sentence pooled from its own tokens. Prints the request's time (each repeat and the
median), the chunks and tokens, and the service's peak resident memory (every process of it, VmHWM) before
the first request and after the last; then transformers' ModernBertModel on the same tokens in this process
(eager, one pass) for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import cpu_flags, free_port, machine, make_sentences, start_service

HOST = "127.0.0.1"


def write_modernbert(directory: Path) -> Path:
    """A ModernBERT-base-shaped model, random weights, with the bundled tokenizer read to 8,192 tokens."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    from bench.run import with_bundled_tokenizer

    fields: dict[str, Any] = {  # as ModernBERT-base's config.json has them
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "intermediate_size": 1152,
        "max_position_embeddings": 8192,
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
        "pad_token_id": 0,
        "cls_token_id": 101,
        "sep_token_id": 102,
        "bos_token_id": 101,
        "eos_token_id": 102,
    }
    config = ModernBertConfig(**fields)
    torch.manual_seed(0)
    with_bundled_tokenizer(directory, ModernBertModel(config))
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 8192
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory


def long_text(directory: Path, tokens: int) -> str:
    """Generated sentences up to ``tokens`` tokens, [CLS] and [SEP] included."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_truncation()
    sentences, text = make_sentences(4000), ""
    for sentence in sentences:
        longer = f"{text} {sentence}".strip()
        if len(tokenizer.encode(longer).ids) > tokens:
            break
        text = longer
    return text


def peak_memory(pid: int) -> int:
    """VmHWM (peak resident set) of the process and all of its descendants, summed, in bytes."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending.extend(int(child) for child in children)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import httpx

    print(f"{machine()}; CPU flags: {cpu_flags()}")
    directory = write_modernbert(Path(tempfile.mkdtemp(prefix="modernbert-")))
    text = long_text(directory, args.tokens)
    port = free_port()
    service = start_service(port, {"ENCODER_MODEL_DIR": str(directory)}, quiet=True, supervised=True)
    try:
        before = peak_memory(service.pid)
        times = []
        with httpx.Client(timeout=600) as client:
            for _ in range(args.repeats):
                started = time.perf_counter()
                response = client.post(f"http://{HOST}:{port}/encode/late-chunks", json={"text": text})
                times.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
                body = response.json()
        after = peak_memory(service.pid)
    finally:
        service.terminate()
        service.wait(60)
    chunks, tokens = len(body["data"]), body["usage"]["prompt_tokens"]
    print(f"\nPOST /encode/late-chunks: one text of {tokens} tokens, {chunks} chunks (its sentences)\n")
    print(f"time: {', '.join(f'{t:.2f}' for t in times)} s; median {statistics.median(times):.2f} s")
    mib = 1024 * 1024
    print(f"service peak resident memory: {before / mib:.0f} MiB loaded, {after / mib:.0f} MiB after the requests")

    import torch
    from transformers import AutoTokenizer, ModernBertModel

    torch.set_num_threads(os.cpu_count() or 1)
    model = ModernBertModel.from_pretrained(directory).eval()
    ids = AutoTokenizer.from_pretrained(directory)(text, return_tensors="pt")
    with torch.inference_mode():
        started = time.perf_counter()
        model(**ids)
        print(
            f"transformers' ModernBertModel, the same {ids['input_ids'].shape[1]} tokens, one pass in this "
            f"process: {time.perf_counter() - started:.2f} s"
        )


if __name__ == "__main__":
    main()
