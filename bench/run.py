"""The benchmark: the service over HTTP against the in-process reference libraries, in one run.

    make bench            (or: .venv/bin/python -m bench.run [--quick])

Loads the references (sentence-transformers, transformers) into this process and starts `uvicorn --factory
app.main:create_app` on 127.0.0.1 (and infinity-emb beside it with --peers). Every case then runs in rounds:
in each, the service (driven from this process over keep-alive connections, bounded request count and time),
the references and the peer take turns on the same share of the texts, each alone, so that ratios compare
figures taken minutes apart at most. Prints the figures and writes them, with the machine and the command,
into docs/benchmarks/make-bench.md (one section per device, replaced on each run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson

from bench.texts import WORDS, make_sentences  # noqa: F401  (re-exported: the other benchmarks import them here)

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks"  # the figures by topic; BENCHMARKS.md is their summary, kept by hand
MAKE_BENCH = BENCHMARKS / "make-bench.md"


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


def process_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (state, ppid, …); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of one process (every thread), or of one of its threads (``thread``, its id: the
    process's own id is its main thread), in seconds; 0 once it is gone."""
    fields = process_stat(pid if thread is None else f"{pid}/task/{thread}")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


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
    note = f"Resident memory per loaded model (grown while loading and warming it up): {models}{whole}."
    per_model_gpu = re.findall(r'^encoder_model_gpu_memory_bytes\{model="([^"]+)"\} (\S+)$', metrics, re.MULTILINE)
    if per_model_gpu:
        gpu_models = ", ".join(f"{name} {float(value) / 2**20:.0f} MiB" for name, value in per_model_gpu)
        torch_held = {
            kind: sum(
                float(v) for v in re.findall(rf"^encoder_gpu_memory_{kind}_bytes\{{[^}}]*\}} (\S+)$", metrics, re.M)
            )
            for kind in ("peak", "reserved")
        }
        note += (
            f" GPU memory per loaded model (torch's tensors its loading added: weights, graphs): {gpu_models};"
            f" torch's tensors at peak"
            f" {torch_held['peak'] / 2**20:.0f} MiB, its cache {torch_held['reserved'] / 2**20:.0f} MiB after the run"
            f"{gpu_process_note(pid)}."
        )
    return note


def gpu_process_note(pid: int) -> str:
    """The GPU memory nvidia-smi sees the process use (its CUDA context included), where nvidia-smi answers."""
    try:
        found = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in found.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return f"; nvidia-smi: {fields[1]} MiB for the whole process, its CUDA context included"
    return ""


def served_precision(port: int) -> str:
    """What /info says the default model runs on: device and dtype."""
    info = orjson.loads(get(port, "/info"))
    setting = os.environ.get("ENCODER_DTYPE", "auto")
    precision = f"{info['dtype']} products and {info['weights_dtype']} weights"
    return f"on {info['device']} with {precision} (ENCODER_DTYPE={setting})"


class Child:
    """A peer in a process (and Python environment) of its own, driven one line at a time: each command a line on its
    standard input, each answer one JSON line on its standard output (its first line: what it loaded). What it
    prints besides goes to standard error."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.loaded: Any = self.ask("")

    def ask(self, line: str) -> Any:
        """``line`` sent (none: only the next answer read), its JSON answer."""
        assert self.process.stdin is not None and self.process.stdout is not None
        if line:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the peers' process ended (its error is above)"
        return json.loads(answer)

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(
    port: int, env: dict[str, str], checkout: Path = ROOT, quiet: bool = False, supervised: bool = False
) -> subprocess.Popen:
    """The service of ``checkout`` (``-m`` puts it first on the path: its app/ and model/ are the ones served),
    on 127.0.0.1:``port``, once ready; ``quiet`` drops its output; ``supervised``: as ``python -m app.serve``
    (ENCODER_WORKERS front ends around an engine)."""
    output = subprocess.DEVNULL if quiet else None
    server = ["app.serve"] if supervised else ["uvicorn", "--factory", "app.main:create_app"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            *server,
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


def stop_all(processes: list[subprocess.Popen], timeout_s: float = 30) -> None:
    """Terminate every process, then wait for each (all are told before any is waited for)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout_s)


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


def rerank_pairs(sentences: list[str]) -> list[list[tuple[str, str]]]:
    """The (query, document) pairs of each /rerank request: a sentence as the query, the next 32 as documents."""
    return [
        [(sentences[i], document) for document in sentences[i + 1 : i + 33]] for i in range(0, len(sentences) - 33, 33)
    ]


def rerank_bodies(sentences: list[str]) -> list[bytes]:
    """The /rerank requests for the cross-encoder ``ce``, one for each request of rerank_pairs."""
    return [
        orjson.dumps({"query": pairs[0][0], "documents": [document for _, document in pairs], "model": "ce"})
        for pairs in rerank_pairs(sentences)
    ]


ROUNDS = 3  # every case runs in this many rounds, each on its share of the texts; the parties take turns
CASES = ("a", "b", "c", "idle", "d", "e")


def share(items: list[T], round_: int) -> list[T]:
    """Round ``round_``'s share of ``items``: the ``round_``-th of ROUNDS consecutive slices."""
    return items[round_ * len(items) // ROUNDS : (round_ + 1) * len(items) // ROUNDS]


def pooled(runs: list[Run]) -> Run:
    """The rounds of one case taken together: their items, time, latencies and errors."""
    return Run(
        runs[0].name,
        sum(run.sentences for run in runs),
        sum(run.seconds for run in runs),
        [latency for run in runs for latency in run.latencies],
        sum(run.errors for run in runs),
    )


@dataclass
class Load:
    """One case over HTTP: ``clients`` connections POST ``bodies`` to ``path``, ``per_request`` items in each."""

    name: str
    path: str
    bodies: list[bytes]
    per_request: int
    clients: int
    key: str = "data"
    check: bool = True

    async def drive(self, port: int, limit_s: float, round_: int | None = None) -> Run:
        """The load on 127.0.0.1:``port``: its share of round ``round_``, or all of its bodies."""
        return await drive(
            self.name,
            "127.0.0.1",
            port,
            self.path,
            self.bodies if round_ is None else share(self.bodies, round_),
            self.per_request,
            self.clients,
            limit_s,
            self.check,
            self.key,
        )


def shared_loads(
    path: str, body: Callable[[list[str]], bytes], sentences: list[str], idle_texts: int
) -> dict[str, Load]:
    """The loads every server gets: 32 clients × 1 text (a), 4 × 32 (b), idle 1 × 1 on ``path`` (each request
    ``body(texts)``), and /rerank of 32 documents by 4 clients (d)."""
    singles = [body([s]) for s in sentences]
    batches = [body(sentences[i : i + 32]) for i in range(0, len(sentences) - 31, 32)]
    return {
        "a": Load("(a) 32 clients × 1 text", path, singles, 1, 32),
        "b": Load("(b) 4 clients × 32 texts", path, batches, 32, 4),
        "idle": Load("idle: 1 client × 1 text", path, singles[:idle_texts], 1, 1),
        "d": Load(
            "(d) /rerank, 4 clients × (1 query, 32 documents)", "/rerank", rerank_bodies(sentences), 32, 4, "results"
        ),
    }


def service_loads(
    sentences: list[str], attention_text: str, idle_texts: int, attention_requests: int
) -> dict[str, Load]:
    """The service: the shared loads on /encode, /attention (c) and /v1/embeddings at 32 × 1 (e)."""
    loads = shared_loads("/encode", lambda texts: orjson.dumps({"texts": texts}), sentences, idle_texts)
    attention = orjson.dumps({"text": attention_text})
    v1 = [orjson.dumps({"input": s, "model": "minilm"}) for s in sentences]
    return {
        **loads,
        "c": Load(
            "(c) /attention, 128 tokens, all layers and heads",
            "/attention",
            [attention] * attention_requests,
            1,
            1,
            check=False,
        ),
        "e": Load("(e) /v1/embeddings, 32 clients × 1 text", "/v1/embeddings", v1, 1, 32),
    }


def peer_loads(sentences: list[str], idle_texts: int) -> dict[str, Load]:
    """infinity-emb under the same loads, on its OpenAI-shaped /embeddings (its one embeddings endpoint: its
    32 × 1 run stands for (a) and (e)) and /rerank."""
    loads = shared_loads(
        "/embeddings", lambda texts: orjson.dumps({"input": texts, "model": "minilm"}), sentences, idle_texts
    )
    return {"e": loads.pop("a"), **loads}  # keyed like the service's /v1/embeddings run, first as (a) is


def with_bundled_tokenizer(directory: Path, model: object) -> Path:
    """Save a transformers model (random weights: speed does not depend on them) into ``directory`` with the
    bundled model's tokenizer: no other pretrained checkpoint can be fetched where this runs."""
    import shutil

    from model import default_model_path

    source = default_model_path()
    model.save_pretrained(directory)  # type: ignore[attr-defined]
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, directory / name)
    return directory


def write_cross_encoder(directory: Path) -> Path:
    """A cross-encoder the size of all-MiniLM-L6-v2, random weights, the bundled tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from model import default_model_path

    config = BertConfig.from_pretrained(default_model_path(), num_labels=1)
    torch.manual_seed(0)
    return with_bundled_tokenizer(directory, BertForSequenceClassification(config))


class References:
    """The reference libraries in this process, each case measured on a round's share of the same inputs as
    the service: sentence-transformers' encode (batches of 32) and CrossEncoder.predict, transformers'
    BertModel (eager, output_attentions) plus json.dumps."""

    def __init__(self, cross_encoder_dir: Path, sentences: list[str], attention_text: str) -> None:
        import torch
        from sentence_transformers import CrossEncoder, SentenceTransformer
        from transformers import AutoTokenizer, BertModel

        from model import default_model_path

        path = default_model_path()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.st = SentenceTransformer(str(path), device=device)
        self.cross_encoder = CrossEncoder(str(cross_encoder_dir), device=device, max_length=256)
        if device == "cuda":  # the service runs float16 on CUDA: compare like with like
            self.st.half()
            self.cross_encoder.half()
        # Warm up. On a GPU, on every input once: the first pass of each new batch shape picks its kernels, which
        # took the reference 4× as long over the first case's rounds as over the same inputs later (an H100).
        warm = sentences if device == "cuda" else sentences[:64]
        self.st.encode(warm, batch_size=32)
        pairs = [pair for request in rerank_pairs(sentences) for pair in request] if device == "cuda" else []
        self.cross_encoder.predict(pairs or [(sentences[0], s) for s in sentences[1:65]], batch_size=32)
        tokenizer = AutoTokenizer.from_pretrained(path)
        self.bert = BertModel.from_pretrained(path, attn_implementation="eager").eval().to(device)
        self.attention_inputs = tokenizer(attention_text, return_tensors="pt", truncation=True, max_length=128).to(
            device
        )

    def encode(self, name: str, texts: list[str]) -> Run:
        started = time.perf_counter()
        self.st.encode(texts, batch_size=32, normalize_embeddings=True)
        return Run(name, len(texts), time.perf_counter() - started)

    def encode_each(self, name: str, texts: list[str]) -> Run:
        run = Run(name, len(texts))
        for text in texts:
            started = time.perf_counter()
            self.st.encode([text], normalize_embeddings=True)
            run.latencies.append(time.perf_counter() - started)
        run.seconds = sum(run.latencies)
        return run

    def rerank(self, name: str, pairs: list[tuple[str, str]]) -> Run:
        started = time.perf_counter()
        self.cross_encoder.predict(pairs, batch_size=32)
        return Run(name, len(pairs), time.perf_counter() - started)

    def attention(self, name: str, times: int) -> Run:
        import torch

        run = Run(name, times)
        for _ in range(times):
            started = time.perf_counter()
            with torch.inference_mode():
                output = self.bert(**self.attention_inputs, output_attentions=True)
            json.dumps({"attention": torch.stack(output.attentions)[:, 0].tolist()})
            run.latencies.append(time.perf_counter() - started)
        run.seconds = sum(run.latencies)
        return run


@dataclass
class Rounds:
    """Each party's runs of each case, round by round: parties "service", "reference" and, with --peers, "peer"."""

    runs: dict[str, dict[str, list[Run]]] = field(default_factory=dict)

    def add(self, party: str, case: str, run: Run) -> None:
        self.runs.setdefault(party, {}).setdefault(case, []).append(run)

    def pooled(self, party: str) -> dict[str, Run]:
        return {case: pooled(runs) for case, runs in self.runs.get(party, {}).items()}


async def take_turns(
    references: References,
    sentences: list[str],
    attention_text: str,
    quick: bool,
    port: int,
    peer_port: int | None,
    cases: frozenset[str] = frozenset(),
) -> Rounds:
    """Every case in ROUNDS rounds; in each, the service, the references and the peer take their turns on the
    same share of the inputs, the order rotated from one round to the next, so that the machine's drift from
    minute to minute (a quarter on a two-core virtual machine) falls on all of them alike."""
    limit = 60 if quick else 120
    idle_texts, attention_requests, attention_runs = (60, 6, 3) if quick else (200, 30, 9)
    loads = service_loads(sentences, attention_text, idle_texts, attention_requests)
    if cases:  # only these (--cases)
        loads = {case: load for case, load in loads.items() if case in cases}
    peers = peer_loads(sentences, idle_texts) if peer_port is not None else {}
    pairs = rerank_pairs(sentences)
    singles = [orjson.dumps({"texts": [text]}) for text in sentences[:64]]
    await drive("warm-up", "127.0.0.1", port, "/encode", singles, 1, 8, limit)
    if peer_port is not None:
        await drive("warm-up", "127.0.0.1", peer_port, "/embeddings", peers["e"].bodies[:64], 1, 8, limit)

    def reference(case: str, name: str, round_: int) -> Run:
        if case == "idle":
            return references.encode_each(name, share(sentences[:idle_texts], round_))
        if case == "c":
            return references.attention(name, len(share(list(range(attention_runs)), round_)))
        if case == "d":
            return references.rerank(name, [pair for request in share(pairs, round_) for pair in request])
        return references.encode(name, share(sentences, round_))

    rounds = Rounds()
    for case, load in loads.items():
        for round_ in range(ROUNDS):
            parties = ["service", "reference"] + (["peer"] if case in peers else [])
            for party in parties[round_ % len(parties) :] + parties[: round_ % len(parties)]:
                if party == "service":
                    rounds.add(party, case, await load.drive(port, limit, round_))
                elif party == "peer":
                    assert peer_port is not None
                    rounds.add(party, case, await peers[case].drive(peer_port, limit, round_))
                else:
                    rounds.add(party, case, reference(case, load.name, round_))
    return rounds


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


def print_header(name: str) -> None:
    """The machine, the command and the service's ENCODER_ settings from the environment: the lines a figure needs."""
    print(f"{machine()}; CPU flags: {cpu_flags()}")
    print(f"command: python -m bench.{name} {' '.join(sys.argv[1:])}")
    settings = {k: v for k, v in os.environ.items() if k.startswith("ENCODER_")}
    print(f"settings: {settings or 'the defaults'}", flush=True)


LATENCY_CASES = {"c", "idle"}  # compared by their p50, lower is better; the others by their rate


def ratio(run: Run, reference: Run, case: str) -> float:
    """A party's figure over the reference's, for a case: rates, or p50 latencies for the latency cases."""
    if case in LATENCY_CASES:
        return run.percentile(50) / reference.percentile(50)
    return run.rate / reference.rate


def report(rounds: Rounds, device: str, command: str, quick: bool, served: str, memory: str = "") -> str:
    runs, ref, peers = rounds.pooled("service"), rounds.pooled("reference"), rounds.pooled("peer")
    rows = [
        "| case | sentences/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    named = [(runs[case].name, runs[case]) for case in ("a", "b", "idle", "e", "d") if case in runs]
    named += [(f"infinity-emb: {peers[case].name}", peers[case]) for case in ("e", "b", "idle", "d") if case in peers]
    for name, run in named:
        rows.append(
            f"| {name} | {run.rate:.0f} | {run.percentile(50):.1f} | {run.percentile(95):.1f} | "
            f"{run.percentile(99):.1f} | {run.errors} |"
        )
    if "c" in runs:
        c = runs["c"]
        rows.append(
            f"| {c.name} | {c.sentences / c.seconds:.2f} req/s | {c.percentile(50):.1f} | {c.percentile(95):.1f} | "
            f"{c.percentile(99):.1f} | {c.errors} |"
        )

    def cells(case: str, peer_case: str) -> str:
        by_round = zip(rounds.runs["service"][case], rounds.runs["reference"][case])
        each = ", ".join(f"{ratio(s, r, case):.2f}" for s, r in by_round)
        cell = f" {ratio(runs[case], ref[case], case):.2f} | {each} |"
        if peers:
            cell += f" {ratio(peers[peer_case], ref[peer_case], peer_case):.2f} |" if peer_case in peers else " — |"
        return cell

    st = "sentence-transformers in-process"
    lines = {
        "a": lambda: f"| (a) HTTP rate ÷ {st} ({ref['a'].rate:.0f}/s) |{cells('a', 'e')} ≥ 1.0 |",
        "b": lambda: f"| (b) HTTP rate ÷ {st} ({ref['b'].rate:.0f}/s) |{cells('b', 'b')} ≥ 1.1 |",
        "c": lambda: (
            f"| (c) /attention p50 ÷ transformers + json.dumps in-process ({ref['c'].percentile(50):.0f} ms) |"
            f"{cells('c', 'c')} ≤ 0.1 |"
        ),
        "idle": lambda: (
            f"| idle single-text p50 ÷ {st}, one text ({ref['idle'].percentile(50):.1f} ms) |"
            f"{cells('idle', 'idle')} ≤ 1.0 |"
        ),
        "d": lambda: (
            f"| (d) /rerank pairs/s ÷ CrossEncoder.predict in-process ({ref['d'].rate:.0f} pairs/s) |"
            f"{cells('d', 'd')} ≥ 1.0 |"
        ),
        "e": lambda: f"| (e) /v1/embeddings rate ÷ {st} ({ref['e'].rate:.0f}/s) |{cells('e', 'e')} ≥ 1.0 |",
    }
    ratios = [
        "| ratio | measured | rounds | " + ("infinity-emb | " if peers else "") + "goal |",
        "|---|---:|---:|" + ("---:|" if peers else "") + "---:|",
        *(line() for case, line in lines.items() if case in runs),
    ]
    parties = "the service, the references in this process and infinity-emb"
    if not peers:
        parties = "the service and the references in this process"
    notes = [
        "",
        f"Each case ran in {ROUNDS} rounds, each on a third of its inputs; in every round {parties} took their",
        "turns on the same share, the order rotated from round to round. Figures pool the rounds; each ratio",
        "compares figures of the same rounds, and `rounds` gives it round by round.",
    ]
    if peers:
        notes += [
            "",
            f"infinity-emb {peer_version()} (torch engine, its defaults) ran beside the service, driven only in its",
            "turns, with the same loads on its OpenAI-shaped /embeddings (one endpoint, so its 32 × 1 run stands in",
            "rows (a) and (e), measured in the rounds of (e)) and /rerank; it has no attention endpoint.",
            "text-embeddings-inference is not in this table: it ships as a Docker image and no Docker engine was",
            "available where this ran.",
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


def publish(section: str, about: list[str], rows: list[str], write: bool, path: Path) -> None:
    """A section of a file of docs/benchmarks: its title, what was measured (the machine, the command), its table;
    printed, and written into ``path`` where ``write``."""
    text = "\n".join([f"## {section}", "", *about, "", *rows, ""])
    print(text)
    if write:
        write_benchmarks(text, section, path)


MAKE_BENCH_HEADER = (
    "# make bench: the service against its references\n\n"
    "The latest run of `make bench` and `make bench-peers` on each device (bench/run.py replaces that\n"
    'device\'s section on every run), and how its rounds came to be. A section\'s "above" or "below" may\n'
    "mean one now in another file of docs/benchmarks/; [BENCHMARKS.md](../../BENCHMARKS.md) lists them all.\n\n"
    "Written by `make bench` (bench/run.py): all-MiniLM-L6-v2, 2,000 generated English sentences of 8–40\n"
    "words. The service runs as its own process on 127.0.0.1 and is driven over keep-alive HTTP from the\n"
    "benchmark process, taking turns with the in-process references. (a) 32 concurrent clients each\n"
    "send one text per request; (b) 4 clients send 32 texts per request; (c) one client asks /attention\n"
    "for all layers and heads of a 128-token text, against transformers' BertModel (eager,\n"
    "output_attentions) plus json.dumps in-process; idle: one client, one text, nothing else running;\n"
    "(d) 4 clients each rerank 32 documents against a query with a cross-encoder the size of MiniLM\n"
    "(random weights), against sentence-transformers' CrossEncoder.predict in-process on the same pairs;\n"
    "(e) /v1/embeddings as (a).\n\n"
)


def write_benchmarks(section: str, title: str, path: Path = MAKE_BENCH, header: str | None = None) -> None:
    """Put ``section`` (a text headed ``## title``) into ``path`` in place of the section of that title, or last
    where it has none, every other section kept in its place. The text before the first section is ``header``
    where given (make-bench.md's, rewritten on each run), else kept as the file has it."""
    preamble = header if header is not None else f"# {path.stem}\n\n"
    sections = {}
    if path.exists():
        for block in re.split(r"(?m)^(?=## )", path.read_text()):
            if block.startswith("## "):
                sections[block.splitlines()[0][3:].strip()] = block.rstrip() + "\n"
            elif header is None:
                preamble = block
    sections[title] = section
    path.write_text(preamble + "\n".join(sections.values()))  # the order of the file; a new section last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave make-bench.md alone")
    parser.add_argument("--peers", action="store_true", help="also drive infinity-emb (installed by make bench-peers)")
    parser.add_argument("--cases", default="", help="comma-separated, of a, b, c, idle, d, e (default: all)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=None,
        help="serve as `python -m app.serve` with each of these ENCODER_WORKERS in turn (default: one uvicorn)",
    )
    args = parser.parse_args()
    cases = frozenset(case for case in args.cases.split(",") if case)
    if not cases <= set(CASES):
        sys.exit(f"--cases: unknown {', '.join(sorted(cases - set(CASES)))}; known: {', '.join(CASES)}")
    command = ("make bench-peers" if args.peers else "make bench") + (" BENCH_ARGS=--quick" if args.quick else "")
    if args.cases or args.workers:
        command = "python -m bench.run " + shlex.join(sys.argv[1:])
    if args.peers and not INFINITY.exists():
        sys.exit(f"{INFINITY} is missing: run make bench-peers")

    import torch

    from model import load_model

    sentences = make_sentences(2000)[: 600 if args.quick else None]
    tokenizer = load_model(device="cpu").card.tokenizer
    attention_text = " ".join(tokenizer.encode([ATTENTION_TEXT])[0].tokens[1:127]).replace(" ##", "")
    n_tokens = len(tokenizer.encode([attention_text])[0].ids)
    assert 120 <= n_tokens <= 136, n_tokens

    import tempfile

    from model import default_model_path

    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    cross_encoder = write_cross_encoder(scratch / "cross-encoder")
    references = References(cross_encoder, sentences, attention_text)
    failed: dict[str, int] = {}
    for workers in args.workers or [None]:
        port = free_port()
        env = {"ENCODER_MODELS": f"minilm={default_model_path()},ce={cross_encoder}"}
        if workers is not None:
            env["ENCODER_WORKERS"] = str(workers)
        service = start_service(port, env, supervised=workers is not None)
        infinity = None
        try:
            served = served_precision(port)
            if workers is not None:
                served += f", as `python -m app.serve` with ENCODER_WORKERS={workers}"
            at_start = process_memory(service.pid)
            peer_port = free_port() if args.peers else None
            if peer_port is not None:
                infinity = start_infinity(peer_port, default_model_path(), cross_encoder)
            rounds = asyncio.run(take_turns(references, sentences, attention_text, args.quick, port, peer_port, cases))
            memory = memory_note(port, service.pid, at_start) if workers is None else ""
        finally:
            for process in (service, infinity):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(60)
                    except subprocess.TimeoutExpired:
                        process.kill()

        device = "CUDA" if torch.cuda.is_available() else "CPU"
        if workers is not None:
            device += f", ENCODER_WORKERS={workers}"
        section = report(rounds, device, command, args.quick, served, memory)
        print(section, flush=True)
        if not args.no_write:
            write_benchmarks(section, device, MAKE_BENCH, MAKE_BENCH_HEADER)
            print(f"written to {MAKE_BENCH}")
        service_runs, peer_runs = rounds.pooled("service"), rounds.pooled("peer")
        for k, r in [*service_runs.items(), *((f"infinity {k}", r) for k, r in peer_runs.items())]:
            failed[f"{k} ({workers} workers)" if workers is not None else k] = r.errors
    if any(failed.values()):
        sys.exit(f"errors: {shlex.quote(str(failed))}")


if __name__ == "__main__":
    main()
