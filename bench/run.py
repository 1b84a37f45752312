"""The benchmark: the service over HTTP against the in-process reference libraries, in one run.

    make bench            (or: .venv/bin/python -m bench.run [--quick])

Starts `uvicorn --factory app.main:create_app` on 127.0.0.1, drives it from this process over keep-alive connections
(bounded request count and time), stops it, then measures sentence-transformers and transformers
in-process on the same texts with nothing else running. Prints the figures and writes them, with the
machine and the command, into BENCHMARKS.md (one section per device, replaced on each run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
WORDS = """the of and to in is was that for it with as his on be at by had are but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said what up its
about into than them can only other new some could time these two may then do first any my now such like our
over man me even most made after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might us great old year off come since
against go came right used take three house city river garden music dog cat morning evening quickly slowly bright
quiet ancient modern small large green blue heavy light storm train station market library teacher student
window table letter story question answer paper model language machine learning network attention token vector
""".split()


def make_sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """n English-word sentences of 8 to 40 words, the same every run."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
        for i in range(3, len(words) - 2, rng.randint(6, 12)):
            words[i] += ","
        sentences.append((" ".join(words)).capitalize() + rng.choice(".?!"))
    return sentences


ATTENTION_TEXT = " ".join(make_sentences(40, seed=1))  # cut to 128 tokens below


# ---- a small HTTP/1.1 client: keep-alive, Content-Length framing, no per-request allocations beyond bytes ----


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host)

    async def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> tuple[int, bytes]:
        """One request; ``headers`` are extra header lines, each ending in CRLF."""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_and_headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(status_and_headers[9:12])
        match = re.search(rb"(?i)content-length: *(\d+)", status_and_headers)
        length = int(match.group(1)) if match else 0
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


@dataclass
class Run:
    name: str
    sentences: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000 if ordered else 0.0


async def drive(
    name: str,
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    per_request: int,
    clients: int,
    limit_s: float,
    check: bool = True,
    key: str = "data",
) -> Run:
    """``clients`` connections take bodies from a shared list until it is empty or ``limit_s`` passes."""
    connections = [await Connection.open(host, port) for _ in range(clients)]
    queue = list(reversed(bodies))
    run = Run(name)
    deadline = time.perf_counter() + limit_s

    async def client(connection: Connection) -> None:
        while queue and time.perf_counter() < deadline:
            body = queue.pop()
            started = time.perf_counter()
            status, payload = await connection.request("POST", path, body)
            run.latencies.append(time.perf_counter() - started)
            if status != 200 or (check and len(orjson.loads(payload)[key]) != per_request):
                run.errors += 1
            else:
                run.sentences += per_request

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    run.seconds = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return run


def get(port: int, path: str) -> bytes:
    """The body of one GET on a fresh connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
    return reply.split(b"\r\n\r\n", 1)[1]


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in bytes (empty where /proc is not there)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.startswith(("VmRSS", "VmHWM"))}


def memory_note(port: int, pid: int, at_start: dict[str, int]) -> str:
    """Resident memory per loaded model (the service's own gauge) and of the whole process."""
    metrics = get(port, "/metrics").decode()
    per_model = re.findall(r'^encoder_model_memory_bytes\{model="([^"]+)"\} (\S+)$', metrics, re.MULTILINE)
    models = ", ".join(f"{name} {float(value) / 2**20:.0f} MiB" for name, value in per_model)
    now = process_memory(pid)
    whole = (
        f"; the whole process {at_start['VmRSS'] / 2**20:.0f} MiB once ready, {now['VmHWM'] / 2**20:.0f} MiB at peak"
        if at_start and now
        else ""
    )
    return f"Resident memory per loaded model (grown while loading and warming it up): {models}{whole}."


def served_precision(port: int) -> str:
    """What /info says the default model runs on: device and dtype."""
    info = orjson.loads(get(port, "/info"))
    setting = os.environ.get("ENCODER_DTYPE", "auto")
    precision = f"{info['dtype']} products and {info['weights_dtype']} weights"
    return f"on {info['device']} with {precision} (ENCODER_DTYPE={setting})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(port: int, env: dict[str, str], checkout: Path = ROOT, quiet: bool = False) -> subprocess.Popen:
    """The service of ``checkout`` (``-m`` puts it first on the path: its app/ and model/ are the ones served),
    on 127.0.0.1:``port``, once ready; ``quiet`` drops its output."""
    output = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "app.main:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=checkout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        stdout=output,
        stderr=output,
    )
    wait_ready(process, port)
    return process


def wait_ready(process: subprocess.Popen, port: int) -> None:
    """Until GET /health answers 200 (three minutes at most)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited during start-up"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if b" 200 " in s.recv(200):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not become ready")


INFINITY = ROOT / ".venv-peers" / "bin" / "infinity_emb"  # installed by `make bench-peers`


def start_infinity(port: int, embedder: Path, cross_encoder: Path) -> subprocess.Popen:
    """infinity-emb (the pip-installable peer) serving the same two models, torch engine on the same device."""
    process = subprocess.Popen(
        [
            str(INFINITY),
            "v2",
            "--model-id",
            str(embedder),
            "--served-model-name",
            "minilm",
            "--model-id",
            str(cross_encoder),
            "--served-model-name",
            "ce",
            "--engine",
            "torch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"},
        stdout=subprocess.DEVNULL,
    )
    wait_ready(process, port)
    return process


def rerank_bodies(sentences: list[str]) -> list[bytes]:
    """/rerank requests for the cross-encoder ``ce``: each a sentence as the query and the next 32 as documents."""
    return [
        orjson.dumps({"query": sentences[i], "documents": sentences[i + 1 : i + 33], "model": "ce"})
        for i in range(0, len(sentences) - 33, 33)
    ]


async def shared_runs(
    port: int, path: str, body: Callable[[list[str]], bytes], sentences: list[str], quick: bool
) -> dict[str, Run]:
    """The loads every server gets: 32 clients × 1 text (a), 4 × 32 (b), idle 1 × 1 on ``path`` (each request
    ``body(texts)``), and /rerank of 32 documents by 4 clients (d)."""
    host = "127.0.0.1"
    limit = 60 if quick else 120
    singles = [body([s]) for s in sentences]
    batches = [body(sentences[i : i + 32]) for i in range(0, len(sentences) - 31, 32)]
    reranks = rerank_bodies(sentences if not quick else sentences[:640])
    await drive("warm-up", host, port, path, singles[:64], 1, 8, limit)
    return {
        "a": await drive("(a) 32 clients × 1 text", host, port, path, singles, 1, 32, limit),
        "b": await drive("(b) 4 clients × 32 texts", host, port, path, batches, 32, 4, limit),
        "idle": await drive("idle: 1 client × 1 text", host, port, path, singles[: 60 if quick else 200], 1, 1, limit),
        "d": await drive(
            "(d) /rerank, 4 clients × (1 query, 32 documents)",
            host,
            port,
            "/rerank",
            reranks,
            32,
            4,
            limit,
            key="results",
        ),
    }


async def peer_runs(port: int, sentences: list[str], quick: bool) -> dict[str, Run]:
    """infinity-emb under the same loads, on its OpenAI-shaped /embeddings (its one embeddings endpoint: its
    32 × 1 run stands for (a) and (e)) and /rerank."""
    runs = await shared_runs(
        port, "/embeddings", lambda texts: orjson.dumps({"input": texts, "model": "minilm"}), sentences, quick
    )
    return {"e": runs.pop("a"), **runs}  # keyed like the service's /v1/embeddings run, first as (a) is


async def http_runs(port: int, sentences: list[str], attention_text: str, quick: bool) -> dict[str, Run]:
    """The service: the shared loads on /encode, then /attention (c) and /v1/embeddings at 32 × 1 (e)."""
    runs = await shared_runs(port, "/encode", lambda texts: orjson.dumps({"texts": texts}), sentences, quick)
    host, limit = "127.0.0.1", 60 if quick else 120
    attention = orjson.dumps({"text": attention_text})
    runs["c"] = await drive(
        "(c) /attention, 128 tokens, all layers and heads",
        host,
        port,
        "/attention",
        [attention] * (10 if quick else 30),
        1,
        1,
        limit,
        check=False,
    )
    v1 = [orjson.dumps({"input": s, "model": "minilm"}) for s in sentences]
    runs["e"] = await drive("(e) /v1/embeddings, 32 clients × 1 text", host, port, "/v1/embeddings", v1, 1, 32, limit)
    return runs


def write_cross_encoder(directory: Path) -> Path:
    """A cross-encoder the size of all-MiniLM-L6-v2 (random weights: speed does not depend on them), with
    the bundled tokenizer: no pretrained cross-encoder can be fetched where this runs."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from model import default_model_path

    source = default_model_path()
    config = BertConfig.from_pretrained(source, num_labels=1)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, directory / name)
    return directory


def rerank_in_process(cross_encoder_dir: Path, sentences: list[str], quick: bool) -> float:
    """sentence-transformers' CrossEncoder.predict on the same (query, document) pairs: pairs a second."""
    from sentence_transformers import CrossEncoder

    pairs = [
        (sentences[i], document)
        for i in range(0, (len(sentences) if not quick else 640) - 33, 33)
        for document in sentences[i + 1 : i + 33]
    ]
    cross_encoder = CrossEncoder(str(cross_encoder_dir), device="cpu", max_length=256)
    cross_encoder.predict(pairs[:64], batch_size=32)
    started = time.perf_counter()
    cross_encoder.predict(pairs, batch_size=32)
    return len(pairs) / (time.perf_counter() - started)


def in_process(sentences: list[str], attention_text: str, quick: bool) -> dict[str, float]:
    """The reference libraries in this process: sentence-transformers encode, transformers + json.dumps."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel

    from model import default_model_path

    path = default_model_path()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    st = SentenceTransformer(str(path), device=device)
    if device == "cuda":
        st.half()  # the service runs float16 on CUDA: compare like with like
    st.encode(sentences[:64], batch_size=32)
    started = time.perf_counter()
    st.encode(sentences, batch_size=32, normalize_embeddings=True)
    st_rate = len(sentences) / (time.perf_counter() - started)

    single = []
    for text in sentences[: 200 if not quick else 60]:
        started = time.perf_counter()
        st.encode([text], normalize_embeddings=True)
        single.append(time.perf_counter() - started)

    tokenizer = AutoTokenizer.from_pretrained(path)
    bert = BertModel.from_pretrained(path, attn_implementation="eager").eval().to(device)
    inputs = tokenizer(attention_text, return_tensors="pt", truncation=True, max_length=128).to(device)
    times = []
    for _ in range(3 if quick else 10):
        started = time.perf_counter()
        with torch.inference_mode():
            output = bert(**inputs, output_attentions=True)
        json.dumps({"attention": torch.stack(output.attentions)[:, 0].tolist()})
        times.append(time.perf_counter() - started)
    return {
        "st_rate": st_rate,
        "st_single_p50_ms": statistics.median(single) * 1000,
        "hf_attention_ms": statistics.median(times) * 1000,
    }


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        found = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        kib = int(found.group(1)) if found else 0
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu}, {os.cpu_count()} cores{memory}{gpu}; Python {platform.python_version()}, torch {torch.__version__}"


def cpu_flags() -> str:
    """The CPU flags that decide the matrix kernels (and the service's dtype under `auto`)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return ", ".join(flag for flag in wanted if flag in present) or "none of " + ", ".join(wanted)
    except OSError:
        pass
    return "unknown"


def report(
    runs: dict[str, Run],
    ref: dict[str, float],
    device: str,
    command: str,
    quick: bool,
    served: str,
    peers: dict[str, Run] | None = None,
    memory: str = "",
) -> str:
    a, b, c, idle, d, e = runs["a"], runs["b"], runs["c"], runs["idle"], runs["d"], runs["e"]
    c_ms = statistics.median(c.latencies) * 1000
    rows = [
        "| case | sentences/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    named = [(run.name, run) for run in (a, b, idle, e, d)]
    if peers:
        named += [(f"infinity-emb: {run.name}", run) for run in peers.values()]
    for name, run in named:
        rows.append(
            f"| {name} | {run.rate:.0f} | {run.percentile(50):.1f} | {run.percentile(95):.1f} | "
            f"{run.percentile(99):.1f} | {run.errors} |"
        )
    rows.append(
        f"| {c.name} | {c.sentences / c.seconds:.2f} req/s | {c.percentile(50):.1f} | {c.percentile(95):.1f} | "
        f"{c.percentile(99):.1f} | {c.errors} |"
    )

    def peer(key: str, value: str) -> str:
        if peers is None:
            return ""
        if key not in peers:
            return " — |"
        run = peers[key]
        rate_ratio = run.rate / (ref["ce_rate"] if key == "d" else ref["st_rate"])
        return f" {run.percentile(50) / ref['st_single_p50_ms']:.2f} |" if value == "p50" else f" {rate_ratio:.2f} |"

    ratios = [
        "| ratio | measured | " + ("infinity-emb | " if peers else "") + "goal |",
        "|---|---:|" + ("---:|" if peers else "") + "---:|",
        f"| (a) HTTP rate ÷ sentence-transformers in-process ({ref['st_rate']:.0f}/s) | "
        f"{a.rate / ref['st_rate']:.2f} |{peer('e', 'rate')} ≥ 1.0 |",
        f"| (b) HTTP rate ÷ sentence-transformers in-process | {b.rate / ref['st_rate']:.2f} |"
        f"{peer('b', 'rate')} ≥ 1.1 |",
        f"| (c) /attention p50 ÷ transformers + json.dumps in-process ({ref['hf_attention_ms']:.0f} ms) | "
        f"{c_ms / ref['hf_attention_ms']:.2f} |{peer('c', 'p50')} ≤ 0.1 |",
        f"| idle single-text p50 ÷ sentence-transformers encode of one text ({ref['st_single_p50_ms']:.1f} ms) | "
        f"{idle.percentile(50) / ref['st_single_p50_ms']:.2f} |{peer('idle', 'p50')} ≤ 1.0 |",
        f"| (d) /rerank pairs/s ÷ CrossEncoder.predict in-process ({ref['ce_rate']:.0f} pairs/s) | "
        f"{d.rate / ref['ce_rate']:.2f} |{peer('d', 'rate')} ≥ 1.0 |",
        f"| (e) /v1/embeddings rate ÷ sentence-transformers in-process | {e.rate / ref['st_rate']:.2f} |"
        f"{peer('e', 'rate')} ≥ 1.0 |",
    ]
    notes = []
    if peers:
        notes = [
            "",
            f"infinity-emb {peer_version()} (torch engine, its defaults) ran after the service, alone, with the",
            "same loads on its OpenAI-shaped /embeddings (one endpoint, so its 32 × 1 run stands in rows (a) and (e))",
            "and /rerank; it has no attention endpoint. text-embeddings-inference is not in this table: it ships",
            "as a Docker image and no Docker engine was available where this ran.",
        ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            f"## {device}",
            "",
            f"Measured {stamp}{' (quick run)' if quick else ''} on {machine()}.",
            f"CPU flags: {cpu_flags()}. The service ran {served}.",
            f"Command: `{command}`",
            "",
            *rows,
            "",
            *ratios,
            *notes,
            "",
            memory,
            "",
        ]
    )


def peer_version() -> str:
    try:
        found = subprocess.run(
            [str(INFINITY.parent / "python"), "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return found.stdout.strip() or "?"
    except OSError:
        return "?"


def write_benchmarks(section: str, device: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    header = (
        "# Benchmarks\n\n"
        "Written by `make bench` (bench/run.py): all-MiniLM-L6-v2, 2,000 generated English sentences of 8–40\n"
        "words. The service runs as its own process on 127.0.0.1 and is driven over keep-alive HTTP from the\n"
        "benchmark process; the in-process references run afterwards, alone. (a) 32 concurrent clients each\n"
        "send one text per request; (b) 4 clients send 32 texts per request; (c) one client asks /attention\n"
        "for all layers and heads of a 128-token text, against transformers' BertModel (eager,\n"
        "output_attentions) plus json.dumps in-process; idle: one client, one text, nothing else running;\n"
        "(d) 4 clients each rerank 32 documents against a query with a cross-encoder the size of MiniLM\n"
        "(random weights), against sentence-transformers' CrossEncoder.predict in-process on the same pairs;\n"
        "(e) /v1/embeddings as (a).\n\n"
    )
    sections = {}
    if path.exists():
        for block in re.split(r"(?m)^(?=## )", path.read_text()):
            if block.startswith("## "):
                sections[block.splitlines()[0][3:].strip()] = block.rstrip() + "\n"
    sections[device] = section
    path.write_text(header + "\n".join(sections.values()))  # the order of the file; a new device's section last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument("--peers", action="store_true", help="also drive infinity-emb (installed by make bench-peers)")
    args = parser.parse_args()
    command = ("make bench-peers" if args.peers else "make bench") + (" BENCH_ARGS=--quick" if args.quick else "")
    if args.peers and not INFINITY.exists():
        sys.exit(f"{INFINITY} is missing: run make bench-peers")

    import torch

    from model import TextEncoder

    sentences = make_sentences(2000)
    tokenizer = TextEncoder.load(device="cpu").tokenizer
    attention_text = " ".join(tokenizer.encode([ATTENTION_TEXT])[0].tokens[1:127]).replace(" ##", "")
    n_tokens = len(tokenizer.encode([attention_text])[0].ids)
    assert 120 <= n_tokens <= 136, n_tokens

    import tempfile

    from model import default_model_path

    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    cross_encoder = write_cross_encoder(scratch / "cross-encoder")
    port = free_port()
    service = start_service(port, {"ENCODER_MODELS": f"minilm={default_model_path()},ce={cross_encoder}"})
    try:
        served = served_precision(port)
        at_start = process_memory(service.pid)
        runs = asyncio.run(http_runs(port, sentences, attention_text, args.quick))
        memory = memory_note(port, service.pid, at_start)
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)
    peers = None
    if args.peers:
        peer_port = free_port()
        infinity = start_infinity(peer_port, default_model_path(), cross_encoder)
        try:
            peers = asyncio.run(peer_runs(peer_port, sentences, args.quick))
        finally:
            infinity.send_signal(signal.SIGTERM)
            try:
                infinity.wait(60)
            except subprocess.TimeoutExpired:
                infinity.kill()
    reference = in_process(sentences, attention_text, args.quick)
    reference["ce_rate"] = rerank_in_process(cross_encoder, sentences, args.quick)

    device = "CUDA" if torch.cuda.is_available() else "CPU"
    section = report(runs, reference, device, command, args.quick, served, peers, memory)
    print(section)
    if not args.no_write:
        write_benchmarks(section, device)
        print(f"written to {ROOT / 'BENCHMARKS.md'}")
    failed = {k: r.errors for k, r in [*runs.items(), *((f"infinity {k}", r) for k, r in (peers or {}).items())]}
    if any(failed.values()):
        sys.exit(f"errors: {shlex.quote(str(failed))}")


if __name__ == "__main__":
    main()
