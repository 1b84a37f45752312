"""The service under a long mixed load, its resident memory sampled: what an orchestrator sizes a pod by.

    .venv/bin/python -m bench.soak [--seconds 480] [--clients 16] [--sample-s 30] [--fine-s 2] [--bad 0.25]
        [--only REGEX] [ENCODER_*=... env]

Starts the service as the image runs it (``python -m app.serve``, settings from the environment; the bundled model),
warms every endpoint, then reads the resident memory of all its processes once idle (the "warmed-up idle" figure).
Then ``--clients`` clients send, for ``--seconds``, requests drawn at random from every endpoint family (/encode
of 1 to 64 texts with each of its options, late chunks, /tokenize, /attention JSON and npz,
/attention/heads, /attention/neuron, /similarity with explain, /rerank, /classify, /v1/embeddings, Cohere's /v2/embed
and /v2/rerank, TEI's /tei/embed, /tei/rerank, /tei/tokenize, /positional-encoding, /info, /metrics), a fraction
``--bad`` of them bad input (an empty text, a whitespace text, a field of the wrong type, a request past a limit,
JSON that does not parse); ``--only`` keeps the paths a regular expression finds (``--only '^/attention'``: where
the memory goes, a family at a time). Every ``--sample-s`` it samples the resident memory (the sum over the service's
processes, VmRSS, and each process's), and every ``--fine-s`` (2 s) once more, silently, for the trend and the
peak: the 30-second samples alone swing by the requests in flight at that instant, and a slope over eight of them
moved by ±60 MiB from run to run; after the load it samples again 10 s later.

Reports: requests answered (good and bad), errors (a 5xx, or a status other than the expected one's class), lost
(a request with no answer: the connection broke), the idle figure, every sample, the peak (the largest sample, and
the processes' VmHWM), the trend of the second half (the least-squares slope over its fine samples times its length),
and the figure 10 s after the load. Exits non-zero on an error or a lost request (``--check``: so CI can run it
short). The figures are measurements, printed; nothing asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.run import Connection, free_port, print_header, process_memory, start_service
from bench.texts import make_sentences


@dataclass
class Tally:
    good: int = 0
    bad: int = 0
    errors: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def service_pids(pid: int) -> list[int]:
    """The supervisor (or the one process) and every process under it."""
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                queue.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return pids


def each_mib(pid: int) -> str:
    """Each process's resident memory, in the order of their pids (the supervisor first), in MiB."""
    return " ".join(f"{process_memory(p).get('VmRSS', 0) / 2**20:.0f}" for p in sorted(service_pids(pid)))


def resident_mib(pid: int) -> tuple[float, float]:
    """(resident now, the largest any process has been) over the service's processes, in MiB."""
    figures = [process_memory(p) for p in service_pids(pid)]
    now = sum(f.get("VmRSS", 0) for f in figures) / 2**20
    return now, sum(f.get("VmHWM", 0) for f in figures) / 2**20


def good_requests(rng: random.Random, sentences: list[str]) -> list[tuple[str, str, dict | None, str]]:
    """(method, path, body, extra header lines) of every endpoint family, sized at random."""

    def texts(most: int) -> list[str]:
        return rng.sample(sentences, rng.randint(1, most))

    long = " ".join(rng.sample(sentences, 12))
    return [
        ("POST", "/encode", {"texts": texts(64)}, ""),
        ("POST", "/encode", {"texts": texts(8), "return_token_embeddings": True, "return_tokens": True}, ""),
        ("POST", "/encode", {"texts": texts(32)}, "Accept: application/x-npz\r\n"),
        ("POST", "/encode", {"texts": texts(16), "layer": 3, "pooling": "cls", "dimensions": 128}, ""),
        ("POST", "/encode/late-chunks", {"text": long, "chunks": [[0, 40], [40, 120]]}, ""),
        ("POST", "/tokenize", {"texts": texts(16)}, ""),
        ("POST", "/attention", {"text": rng.choice(sentences)}, ""),
        ("POST", "/attention", {"text": long}, "Accept: application/x-npz\r\n"),
        ("POST", "/attention/heads", {"texts": texts(8)}, ""),
        ("POST", "/attention/neuron", {"text": rng.choice(sentences), "layer": 2, "head": 3}, ""),
        ("POST", "/similarity", {"source": rng.choice(sentences), "texts": texts(8), "explain": True}, ""),
        ("POST", "/rerank", {"query": rng.choice(sentences), "documents": texts(16)}, ""),
        ("POST", "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": texts(32)}, ""),
        ("POST", "/v1/embeddings", {"input": texts(8), "encoding_format": "base64"}, ""),
        ("POST", "/v2/embed", {"model": "all-MiniLM-L6-v2", "texts": texts(16), "input_type": "search_query"}, ""),
        ("POST", "/v2/rerank", {"model": "all-MiniLM-L6-v2", "query": "fox", "documents": texts(8)}, ""),
        ("POST", "/tei/embed", {"inputs": texts(32)}, ""),
        ("POST", "/tei/rerank", {"query": rng.choice(sentences), "texts": texts(8)}, ""),
        ("POST", "/tei/tokenize", {"inputs": texts(4)}, ""),
        ("GET", f"/positional-encoding?length={rng.randint(1, 512)}&d_model=64", None, ""),
        ("GET", "/info", None, ""),
        ("GET", "/metrics", None, ""),
    ]


def bad_requests(rng: random.Random, sentences: list[str]) -> list[tuple[str, str, dict | bytes | None, str]]:
    """Bad input of every kind the error table names: each must get a 4xx."""
    return [
        ("POST", "/encode", {"texts": ["fine", ""]}, ""),
        ("POST", "/encode", {"texts": ["  \n "]}, ""),
        ("POST", "/encode", {"texts": [3]}, ""),
        ("POST", "/encode", {"texts": rng.sample(sentences, 8) * 40}, ""),  # past max_batch_texts
        ("POST", "/encode", b'{"texts": ["unfinished', ""),
        ("POST", "/attention", {"text": "x", "layers": [99]}, ""),
        ("POST", "/rerank", {"query": "q", "documents": []}, ""),
        ("POST", "/classify", {"texts": ["an embedder has no labels"]}, ""),
        ("POST", "/encode/sparse", {"texts": ["an embedder has no sparse head"]}, ""),
        ("POST", "/encode/multi-vector", {"texts": ["nor a multi-vector one"]}, ""),
        ("POST", "/v1/embeddings", {"model": "no-such-model", "input": "x"}, ""),
        ("POST", "/tei/embed", {"inputs": []}, ""),
        ("GET", "/positional-encoding?length=0&d_model=64", None, ""),
    ]


async def client(
    port: int,
    rng: random.Random,
    sentences: list[str],
    until: float,
    bad_share: float,
    tally: Tally,
    only: re.Pattern[str] = re.compile(""),
) -> None:
    connection = await Connection.open("127.0.0.1", port)
    try:
        while time.monotonic() < until:
            bad = rng.random() < bad_share
            bad_ones = [r for r in bad_requests(rng, sentences) if only.search(r[1])] if bad else []
            bad = bool(bad_ones)
            method, path, body, headers = rng.choice(
                bad_ones or [r for r in good_requests(rng, sentences) if only.search(r[1])]
            )
            payload = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
            try:
                status, answer = await connection.request(method, path, payload, headers)
            except (OSError, asyncio.IncompleteReadError) as error:
                tally.lost.append(f"{method} {path}: {type(error).__name__}")
                connection.close()
                connection = await Connection.open("127.0.0.1", port)
                continue
            wanted = 400 <= status < 500 if bad else status == 200
            if not wanted:
                tally.errors.append(f"{method} {path} -> {status}: {answer[:200]!r}")
            elif bad:
                tally.bad += 1
            else:
                tally.good += 1
    finally:
        connection.close()


def trend(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MiB) times the span of the seconds: MiB gained over the span."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [t for t, _ in samples], [m for _, m in samples]
    slope = statistics.linear_regression(xs, ys).slope
    return slope * (xs[-1] - xs[0])


async def soak(port: int, pid: int, args: argparse.Namespace) -> Tally:
    sentences = make_sentences(400, seed=3)
    rng = random.Random(7)
    tally = Tally()
    # warm every endpoint once, then the idle figure
    await asyncio.gather(
        *(client(port, random.Random(i), sentences, time.monotonic() + 15, 0.25, tally) for i in range(4))
    )
    await asyncio.sleep(10)
    idle, _ = resident_mib(pid)
    print(f"warmed-up idle: {idle:.0f} MiB resident (all processes: {each_mib(pid)})", flush=True)
    tally = Tally()
    started = time.monotonic()
    until = started + args.seconds
    clients = [
        asyncio.create_task(
            client(port, random.Random(rng.random()), sentences, until, args.bad, tally, re.compile(args.only))
        )
        for _ in range(args.clients)
    ]
    samples: list[tuple[float, float]] = []
    fine: list[tuple[float, float]] = []

    async def sample_finely() -> None:
        while time.monotonic() < until:
            await asyncio.sleep(min(args.fine_s, max(0.0, until - time.monotonic())))
            fine.append((time.monotonic() - started, resident_mib(pid)[0]))

    finely = asyncio.create_task(sample_finely())
    while time.monotonic() < until:
        await asyncio.sleep(min(args.sample_s, max(0.0, until - time.monotonic())))
        now, _ = resident_mib(pid)
        samples.append((time.monotonic() - started, now))
        print(
            f"  {samples[-1][0]:6.0f} s: {now:.0f} MiB ({now - idle:+.0f}; {each_mib(pid)}), {tally.good} good, "
            f"{tally.bad} bad",
            flush=True,
        )
    await asyncio.gather(*clients, finely)
    _, peak_hwm = resident_mib(pid)
    await asyncio.sleep(10)
    after, _ = resident_mib(pid)
    second_half = [s for s in fine if s[0] >= args.seconds / 2]
    peak = max((m for _, m in samples), default=idle)
    fine_peak = max((m for _, m in fine), default=idle)
    print(
        f"load: {args.seconds:.0f} s, {args.clients} clients, {args.bad:.0%} bad input: {tally.good} good and "
        f"{tally.bad} bad requests answered, {len(tally.errors)} errors, {len(tally.lost)} lost"
    )
    print(
        f"resident memory: idle {idle:.0f} MiB; under load {min(m for _, m in samples):.0f}-{peak:.0f} MiB "
        f"(peak {peak - idle:+.0f} over idle; of the {len(fine)} samples every {args.fine_s:g} s "
        f"{fine_peak - idle:+.0f}; "
        f"the processes' VmHWM sum {peak_hwm:.0f}); second half's trend {trend(second_half):+.0f} MiB (its "
        f"{len(second_half)} fine samples); 10 s after the load {after:.0f} MiB ({after - idle:+.0f})"
    )
    for line in (tally.errors + tally.lost)[:20]:
        print("  " + line)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=480.0, help="how long the load lasts")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples of resident memory")
    parser.add_argument("--fine-s", type=float, default=2.0, help="seconds between the samples of the trend and peak")
    parser.add_argument("--bad", type=float, default=0.25, help="the share of requests that are bad input")
    parser.add_argument("--only", default="", help="load only the paths this regular expression finds")
    parser.add_argument("--check", action="store_true", help="exit 1 on an error or a lost request")
    args = parser.parse_args()
    print_header("soak")
    only = re.compile(args.only)
    if not any(only.search(path) for _, path, _, _ in good_requests(random.Random(0), ["a text"] * 64)):
        parser.error(f"--only {args.only!r} finds none of the paths loaded")
    port = free_port()
    process = start_service(port, {}, quiet=True, supervised=True)  # as the image runs it
    try:
        tally = asyncio.run(soak(port, process.pid, args))
    finally:
        process.terminate()
        process.wait(60)
    return 1 if args.check and (tally.errors or tally.lost) else 0


if __name__ == "__main__":
    sys.exit(main())
