"""The explanation benchmark: /explain of one 64-token pair on a MiniLM-sized cross-encoder (random weights; 6 layers,
384 wide), 50 steps of integrated gradients, against Captum's ``LayerIntegratedGradients`` on transformers' model of
the same checkpoint in process, which batches all its steps in one pass.

    .venv/bin/python -m bench.explain [--rounds 5] [--documents 16] [--words 6] [--env ENCODER_MAX_BATCH_TOKENS=16384]

The service runs in its own process (``python -m app.serve``, as the image runs it) and is asked over keep-alive
HTTP; Captum runs in this process while the service idles, on the device the service computes on (CUDA where there
is one), the two taking turns round by round. Prints the median seconds a request of each and their ratio (the goal:
the service at most half Captum's time), and the attributions' largest difference (Captum's model and ours computing
the same numbers). Where Captum cannot be imported (it needs matplotlib), the service's time alone. Then /rerank of
``--documents`` generated documents with ``"explain": true`` against the same /rerank without it, taking turns: the
median seconds of each and their ratio (the goal: at most 20).

With ``--beside``, what an explanation does to other requests in flight: 32 clients send /encode of one text each,
one at a time, for ``--seconds`` alone and then with a client asking /explain of 256 steps over and over beside them;
prints their median latency both ways (the goal: within 2x).

With ``--profile``, where the request's time goes: the same explanation computed in this process by the service's
own code (``model.runtime.tasks.attribute`` on the model as the service loads it), timed, then once under torch's
profiler (the operations that took the most time, on a GPU the device's and the host's; how many kernels ran and
their time beside the wall time: a pass whose kernels take a fraction of it waits on its launches) and a few times
under Python's (the functions that held the host).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from bench.run import Connection, free_port, machine, make_sentences, start_service

MINILM: dict[str, Any] = {
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


def write_cross_encoder(directory: Path) -> Path:
    """A MiniLM-shaped BertForSequenceClassification with one output, random weights, the bundled model's
    tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    from model import default_model_path

    tokenizer = default_model_path() / "tokenizer.json"
    vocab = len(json.loads(tokenizer.read_text())["model"]["vocab"])
    torch.manual_seed(0)
    config = BertConfig.from_dict({"vocab_size": vocab, "num_labels": 1, **MINILM})
    BertForSequenceClassification(config).save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return directory


def captum_available() -> str | None:
    """None where Captum's integrated gradients can be imported here, else why not."""
    try:
        from captum.attr import LayerIntegratedGradients  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def captum_seconds(directory: Path, ids: list[int], types: list[int], steps: int) -> tuple[float, np.ndarray]:
    """Captum's integrated gradients of the pair on transformers' model, on the GPU where there is one (as the
    service computes there): the seconds they take and the attributions."""
    from captum.attr import LayerIntegratedGradients
    from transformers import BertForSequenceClassification

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = BertForSequenceClassification.from_pretrained(directory, attn_implementation="eager").eval().to(device)
    special = {ids[0], ids[-1]}  # [CLS] and [SEP]
    input_ids, token_types = torch.tensor([ids], device=device), torch.tensor([types], device=device)
    baseline = torch.tensor([[i if i in special else 0 for i in ids]], device=device)

    def f(i: torch.Tensor, t: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return model(input_ids=i, token_type_ids=t, attention_mask=a).logits[:, 0]

    explainer = LayerIntegratedGradients(f, model.bert.embeddings)
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    attributions = explainer.attribute(
        input_ids,
        baselines=baseline,
        additional_forward_args=(token_types, torch.ones_like(input_ids)),
        n_steps=steps,
        method="gausslegendre",
    )
    summed = attributions.sum(-1)[0].detach().cpu().numpy()  # waits for the GPU, as the service's answer does
    return time.perf_counter() - began, summed


async def served_seconds(port: int, body: bytes, path: str = "/explain") -> tuple[float, dict]:
    connection = await Connection.open("127.0.0.1", port)
    began = time.perf_counter()
    status, payload = await connection.request("POST", path, body)
    seconds = time.perf_counter() - began
    connection.close()
    assert status == 200, payload
    return seconds, orjson.loads(payload)


async def encode_p50(port: int, seconds: float, clients: int, explain: bytes | None) -> tuple[float, int]:
    """The median latency (s) of /encode of one text from ``clients`` clients over ``seconds``, with /explain of
    ``explain`` asked over and over beside them where given; and how many explanations were answered."""
    texts = [orjson.dumps({"texts": [text]}) for text in make_sentences(256, seed=3)]
    latencies: list[float] = []
    explained = 0
    deadline = time.perf_counter() + seconds

    async def client(k: int) -> None:
        connection = await Connection.open("127.0.0.1", port)
        n = k
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            status, _ = await connection.request("POST", "/encode", texts[n % len(texts)])
            assert status == 200
            latencies.append(time.perf_counter() - began)
            n += clients
        connection.close()

    async def explainer() -> None:
        nonlocal explained
        connection = await Connection.open("127.0.0.1", port)
        while time.perf_counter() < deadline:
            status, payload = await connection.request("POST", "/explain", explain or b"")
            assert status == 200, payload
            explained += 1
        connection.close()

    await asyncio.gather(*(client(k) for k in range(clients)), *([explainer()] if explain else []))
    return statistics.median(latencies), explained


def beside(directory: Path, body: bytes, seconds: float) -> None:
    port = free_port()
    service = start_service(port, {"ENCODER_MODEL_DIR": str(directory)}, quiet=True, supervised=True)
    try:
        asyncio.run(encode_p50(port, 2, 32, None))  # warm-up
        alone, _ = asyncio.run(encode_p50(port, seconds, 32, None))
        with_explain, explained = asyncio.run(encode_p50(port, seconds, 32, body))
        again, _ = asyncio.run(encode_p50(port, seconds, 32, None))
    finally:
        service.terminate()
        service.wait(60)
    print(machine())
    print(
        f"32 clients x /encode of one text, {seconds:g} s each way, median ms: alone {alone * 1000:.1f}, beside "
        f"/explain of 256 steps {with_explain * 1000:.1f} ({explained} explanations answered), alone again "
        f"{again * 1000:.1f}; ratio {with_explain / alone:.2f} (goal <= 2)"
    )


def versus_captum(port: int, directory: Path, text: str, pair: str, steps: int, rounds: int) -> None:
    """/explain of the pair over HTTP against Captum in process, taking turns: the medians, their ratio and the
    attributions' largest difference."""
    body = orjson.dumps({"text": text, "text_pair": pair, "steps": steps})
    _, answer = asyncio.run(served_seconds(port, body))  # warm-up
    missing = captum_available()
    from model import TextTokenizer

    tokenizer = TextTokenizer.from_file(directory / "tokenizer.json", 512)
    (encoding,) = tokenizer.encode([text], [pair])
    ids, types = list(encoding.ids), list(encoding.type_ids)
    if missing is None:
        captum_seconds(directory, ids, types, steps)  # warm-up
    ours, theirs, reference = [], [], None
    for _ in range(rounds):
        seconds, answer = asyncio.run(served_seconds(port, body))
        ours.append(seconds)
        if missing is None:
            seconds, reference = captum_seconds(directory, ids, types, steps)
            theirs.append(seconds)
    print(f"/explain, {len(ids)} tokens, {steps} steps, {rounds} rounds; seconds a request, median")
    print(f"  the service over HTTP: {statistics.median(ours):.3f} (rounds {', '.join(f'{s:.3f}' for s in ours)})")
    if reference is None:
        print(f"  Captum: not measured, it cannot be imported here ({missing})")
        return
    difference = np.abs(np.asarray(answer["attributions"]) - reference).max() / np.abs(reference).max()
    print(f"  Captum in process:     {statistics.median(theirs):.3f} (rounds {', '.join(f'{s:.3f}' for s in theirs)})")
    print(
        f"  ratio {statistics.median(ours) / statistics.median(theirs):.2f} (goal <= 0.5); attributions differ by at "
        f"most {difference:.1e} of the largest"
    )


def in_process(directory: Path, text: str, pair: str, steps: int, rounds: int) -> None:
    """The explanation by the service's own code in this process: its median seconds, then one under the profiler."""
    from app.services.tasks import baseline_of
    from model import load_model
    from model.runtime.tasks import attribute
    from model.spec.outputs import AttributionOptions

    model = load_model(directory)
    (encoding,) = model.card.tokenizer.encode([text], [pair])
    baseline = baseline_of(encoding, model.card.tokenizer)
    options = AttributionOptions((0,), "integrated_gradients", steps, (baseline,), 16_384)
    cuda = model.device.type == "cuda"

    def once() -> float:
        began = time.perf_counter()
        (answer,) = attribute(model, [encoding], options)  # its attributions on the host: waits for the device
        return time.perf_counter() - began

    once()  # warm-up
    seconds = [once() for _ in range(rounds)]
    print(f"in process on {model.device}: attribute() {statistics.median(seconds):.4f} s, median of {rounds}")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        wall = once()
    events = profiler.key_averages()
    for sort in ("self_device_time_total", "self_cpu_time_total") if cuda else ("self_cpu_time_total",):
        print(events.table(sort_by=sort, row_limit=14, max_name_column_width=60))
    calls = cProfile.Profile()
    calls.runcall(lambda: [once() for _ in range(rounds)])
    print(f"Python's profile of {rounds} calls, by own time:")
    pstats.Stats(calls).sort_stats("tottime").print_stats(16)
    if cuda:
        kernels = [event for event in events if str(event.device_type).endswith("CUDA")]
        busy = sum(event.self_device_time_total for event in kernels) / 1e6
        count = sum(event.count for event in kernels)
        print(f"profiled: wall {wall:.4f} s, {count} kernels taking {busy:.4f} s of the device ({busy / wall:.0%})")


def rerank_with_explanations(port: int, documents: int, rounds: int, words: int | None = None) -> None:
    """/rerank of ``documents`` generated documents (cut to their first ``words``) with ``"explain": true`` against
    the same /rerank without it, taking turns: the medians and their ratio."""
    query, *texts = make_sentences(documents + 1, seed=7)
    if words is not None:
        texts = [" ".join(text.split()[:words]) for text in texts]
    plain = orjson.dumps({"query": query, "documents": texts})
    explained = orjson.dumps({"query": query, "documents": texts, "explain": True})
    for body in (plain, explained):  # warm-up
        asyncio.run(served_seconds(port, body, "/rerank"))
    seconds: dict[bytes, list[float]] = {plain: [], explained: []}
    for _ in range(rounds):
        for body in (plain, explained):
            seconds[body].append(asyncio.run(served_seconds(port, body, "/rerank"))[0])
    alone, with_explanations = statistics.median(seconds[plain]), statistics.median(seconds[explained])
    lengths = "" if words is None else f" of {words} words"
    print(f"/rerank of {documents} documents{lengths}, {rounds} rounds; seconds a request, median")
    print(f"  plain: {alone:.3f} (rounds {', '.join(f'{s:.3f}' for s in seconds[plain])})")
    print(f"  with explain: {with_explanations:.3f} (rounds {', '.join(f'{s:.3f}' for s in seconds[explained])})")
    print(f"  ratio {with_explanations / alone:.1f} (goal <= 20)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--documents", type=int, default=16, help="documents of the /rerank with explanations")
    parser.add_argument("--words", type=int, help="those documents cut to their first WORDS words (else 8 to 40)")
    parser.add_argument("--beside", action="store_true", help="/encode's latency with an explanation beside it")
    parser.add_argument("--seconds", type=float, default=20.0, help="with --beside: how long each way")
    parser.add_argument("--profile", action="store_true", help="the explanation in process, timed and profiled")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=value settings for the service")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.env)
    scratch = Path(tempfile.mkdtemp(prefix="explain-"))
    directory = write_cross_encoder(scratch / "cross-encoder")
    words = "the quick brown fox jumps over the lazy dog while".split()
    text, pair = " ".join(words * 3), " ".join(reversed(words * 3))  # 64 tokens as a pair
    if args.profile:
        print(machine())
        in_process(directory, text, pair, args.steps, args.rounds)
        return
    if args.beside:
        beside(directory, orjson.dumps({"text": text, "text_pair": pair, "steps": 256}), args.seconds)
        return
    port = free_port()
    service = start_service(port, {"ENCODER_MODEL_DIR": str(directory), **settings}, quiet=True, supervised=True)
    try:
        print(machine())
        if settings:
            print("settings:", " ".join(args.env))
        versus_captum(port, directory, text, pair, args.steps, args.rounds)
        rerank_with_explanations(port, args.documents, args.rounds, args.words)
    finally:
        service.terminate()
        service.wait(60)


if __name__ == "__main__":
    main()
