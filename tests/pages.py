"""The documentation's pages as a reader runs them: their command blocks, read into steps, and what running each
step takes (the services the pages start, the environments their Python blocks install), for tests/test_readme.py
and tests/test_docs.py.

How a page is read:

- Every line of a ``sh`` block is a command, except ``# ...`` comment lines (under a command, the whole answer it
  prints); a line continued with ``\\`` and a quoted string that runs on over a line break (a JSON body) are
  joined to the line they continue.
- ``make serve``, with or without settings before it (``ENCODER_MODELS="a=org/name,b=org/other" make serve``), is
  a service. It serves the examples after it up to the next heading or the next ``make serve`` line; an example
  with none above it in its section is served by plain ``make serve`` (the bundled all-MiniLM-L6-v2). The line
  itself runs, through ``make``, in this checkout: its install step is the set-up ``make`` has already done (the
  venv this test runs in stands for ``.venv``: ``-o``), and it listens on a free port (``PORT=``). A model it
  names by Hub id is fetched from a stand-in Hub (tests/hub.py) that publishes a tiny random stand-in under
  that id (``STAND_INS``), or, under ``sentence-transformers/all-MiniLM-L6-v2``, the bundled model's own files.
- ``make download MODEL=...`` runs likewise, into an empty Hugging Face cache.
- ``curl`` commands are requests to the service of their group; ``localhost:8000`` is that service. A JSON block
  right after a block of one command is its answer with parts left out; a ``# {...}`` or ``# [...]`` line under a
  command is its whole answer (``…`` in it marks values left out). A command that writes a file (``-o``) is run
  with the block's lines after it, whose ``# `` comment is what they print; ``python`` or ``.venv/bin/python``
  there is the project's interpreter (``make serve``'s ``.venv``).
- ``pip install ...`` lines install the client of the Python block right after their block: they run as written
  in a fresh virtual environment (no system site packages; cached under build/page-environments, keyed by the
  lines and the Python version), whose interpreter runs the Python block, against the service of its group. A
  Python block with no such block before it uses the project itself and runs with the project's interpreter,
  from the checkout. A ``print(...)  # value`` line prints that value (numbers within 1e-5).

What an answer is held to: every key and value shown, every list shown the start of the answer's (numbers within
1e-5); a whole answer has no more keys or items than shown. Where the example's model is a random stand-in, its
numbers are held to their type only (random weights give other numbers); its strings and booleans still as shown.
Left-outs are written ``...`` (``[...]``, ``[...32 values...]``, ``{…}``, a string's start left out: ``".../model"``,
its end ``"BjgN..."``: a string at least that long, its characters not compared, since the one kind shown so,
base64 of float32, differs in its last bits from one CPU to the next).

The services compute on the CPU in float32 with the torch runtime (the runtime guide.md's ``/info`` shows; with
``auto`` the service picks one per CPU at start).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, free_port
from tests.hub import StandInHub

BUNDLED = "all-MiniLM-L6-v2"  # the bundled model's name, served by plain `make serve`
BUNDLED_ID = "sentence-transformers/all-MiniLM-L6-v2"  # its Hub id: the stand-in Hub publishes its real files
LEFT_OUT = "⟨left out⟩"
ENVIRONMENTS = ROOT / "build" / "page-environments"
VENV = Path(sys.prefix)  # the project's environment, standing for make serve's .venv
# The environment the services run in, beside what each `make serve` line sets (see the module's docstring).
SERVICE_SETTINGS = {"ENCODER_RUNTIME": "torch", "ENCODER_DEVICE": "cpu", "ENCODER_DTYPE": "float32"}
# Variables of the test's own run that a reader's shell does not have: make's (when pytest runs under `make test`),
# the tests' offline switches, the interpreter's path.
NOT_THE_READERS = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH")


def _stand_ins() -> dict[str, Callable[[Path], Path]]:
    """The Hub ids the pages name, each with what the stand-in Hub publishes under it (written into a folder)."""
    from model import default_model_path
    from tests.families import write_family_model
    from tests.helpers import write_tiny_model
    from tests.retrieval import write_splade

    return {
        BUNDLED_ID: lambda _: default_model_path(),
        "BAAI/bge-small-en-v1.5": lambda d: write_tiny_model(d, seed=1),
        "intfloat/multilingual-e5-small": lambda d: write_tiny_model(d, seed=2),
        "cross-encoder/ms-marco-MiniLM-L6-v2": lambda d: write_tiny_model(
            d, seed=3, head="sequence-classification", num_labels=1
        ),
        "naver/splade-cocondenser-ensembledistil": lambda d: write_splade(d, "bert", "max", seed=3),
        "Qwen/Qwen3-Embedding-0.6B": lambda d: write_family_model(d, "qwen3"),
        "google/embeddinggemma-300m": lambda d: write_family_model(d, "embeddinggemma"),
        "Qwen/Qwen3-Reranker-0.6B": lambda d: write_family_model(d, "qwen3-reranker", head="causal-lm"),
    }


GATED = {"google/embeddinggemma-300m"}  # as on the Hub: its files only with a token


# ---- a page's blocks, read into steps ----


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of its opening fence
    language: str
    text: str
    section: int  # which heading it is under, counted from the top


def read_blocks(path: Path) -> list[Block]:
    """The page's fenced blocks in order."""
    blocks: list[Block] = []
    section, opened, language, lines = 0, 0, "", list[str]()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not opened and line.startswith("```"):
            opened, language, lines = number, line[3:].strip(), []
        elif not opened and line.startswith("#"):
            section += 1
        elif line.startswith("```"):
            blocks.append(Block(path.name, opened, language, "\n".join(lines) + "\n", section))
            opened = 0
        elif opened:
            lines.append(line)
    return blocks


def joined(text: str) -> list[str]:
    """A shell block's lines, continued lines joined, and a quoted string that runs on over a line break (a JSON
    body) taken with the line it starts on."""
    out: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        if out and out[-1].count("'") % 2 == 1:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def settings_of(line: str) -> tuple[dict[str, str], list[str]]:
    """A shell line's variable assignments and the command after them."""
    words = shlex.split(line, comments=True)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


@dataclass(frozen=True)
class Serve:
    """A ``make serve`` line: the service it starts and the models it names (name, Hub id or directory)."""

    where: str
    line: str  # as written, without its comment
    env: dict[str, str] = field(hash=False)

    @property
    def models(self) -> list[tuple[str, str]]:
        if "ENCODER_MODELS" in self.env:
            return [tuple(entry.split("=", 1)) for entry in self.env["ENCODER_MODELS"].split(",")]  # type: ignore[misc]
        if "ENCODER_MODEL" in self.env:
            source = self.env["ENCODER_MODEL"]
            return [(self.env.get("ENCODER_MODEL_NAME", source.split("@")[0]), source)]
        return [(BUNDLED, "")]  # the bundled model, from its package

    def real(self, name: str | None) -> bool:
        """Whether the model a request names (the default model for an unknown name or none) has real weights."""
        sources = dict(self.models)
        return sources.get(name or "", self.models[0][1]).split("@")[0] in ("", BUNDLED_ID)


BUNDLED_SERVICE = Serve("make serve", "make serve", {})


@dataclass(frozen=True)
class Request:
    where: str
    command: str
    rest: tuple[str, ...]  # the lines after a command that writes a file, which read it
    answer: str | None  # what the page shows it answers
    whole: bool  # the answer is a `# ...` line under the command: all of it, unless `…` marks a left-out
    serve: Serve

    @property
    def model(self) -> str | None:
        named = re.search(r'"model":\s*"([^"]+)"', self.command)
        return named.group(1) if named else None


@dataclass(frozen=True)
class Script:
    where: str
    code: str
    installs: tuple[str, ...]  # the pip lines that install its client; none: the project's own interpreter
    serve: Serve


@dataclass(frozen=True)
class Download:
    where: str
    line: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Other:
    """A command no step runs: the set-up the test's own run stands for, or one the page should not have."""

    where: str
    line: str


Step = Serve | Request | Script | Download | Other


def steps(path: Path) -> list[Step]:
    """The page's commands in order, each read as a step and given the service of its group."""
    blocks = read_blocks(path)
    found: list[Step] = []
    serve, section, installs = BUNDLED_SERVICE, 0, tuple[str, ...]()
    for index, block in enumerate(blocks):
        if block.section != section:
            serve, section = BUNDLED_SERVICE, block.section
        if block.language == "python":
            found.append(Script(f"{block.page}:{block.line}", block.text, installs, serve))
        installs = ()
        if block.language == "sh":
            following = blocks[index + 1] if index + 1 < len(blocks) else Block("", 0, "", "", 0)
            for step in shell_steps(block, following, serve):
                if isinstance(step, Serve):
                    serve = step
                if isinstance(step, Install):
                    installs = (*installs, step.line)
                else:
                    found.append(step)
    return found


@dataclass(frozen=True)
class Install:
    line: str


def shell_steps(block: Block, following: Block, serve: Serve) -> Iterator[Step | Install]:
    """The steps of a shell block: its commands, each ``curl`` with what the page shows it answers (a ``# `` line
    under it, or the JSON block that follows a block of one command) and served by ``serve`` or the ``make serve``
    line above it in the block."""
    lines = joined(block.text)
    curls = [line for line in lines if line.startswith("curl ")]
    k = 0
    while k < len(lines):
        line, where = lines[k], f"{block.page}:{block.line + 1 + k}"
        k += 1
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("curl "):
            after = lines[k] if k < len(lines) else ""
            comment = re.match(r"# [{\[]", after) is not None
            answer = after[2:] if comment else None
            if answer is None and len(curls) == 1 and following.language == "json":
                answer = following.text
            rest: tuple[str, ...] = ()
            if " -o " in line:  # the lines after it read the file it writes
                rest, k = tuple(lines[k:]), len(lines)
            yield Request(where, line, rest, answer, comment, serve)
            continue
        env, words = settings_of(line)
        plain = " ".join([*(f"{n}={shlex.quote(v)}" for n, v in env.items()), shlex.join(words)])
        if words[:2] == ["make", "serve"]:
            serve = Serve(where, plain, env)
            own_directory = any(source.startswith(("/", ".")) for _, source in serve.models)
            yield Other(where, plain) if own_directory else serve
        elif words[:2] == ["make", "download"]:
            models = next((word.split("=", 1)[1] for word in words if word.startswith("MODEL=")), "")
            yield Download(where, plain, tuple(models.split()))
        elif words[:2] == ["pip", "install"] and following.language == "python":
            yield Install(line)
        else:
            yield Other(where, plain)


# ---- what a page shows, and holding an answer to it ----


def shown(text: str) -> Any:
    """A page's JSON with its left-outs marked: ``[...]`` lists hold nothing required, ``"abc..."`` strings
    their beginning, ``, ...`` and ``…`` items nothing, ``: …`` a value left out (null)."""
    text = re.sub(r",\s*-?\d[\d.]*\.\.\.", "", text)  # a number cut short: 0.01...
    text = re.sub(r"\[\s*\.\.\.[^\]\[]*\]", "[]", text)  # [...], [...32 values...]
    text = re.sub(r"\{\s*(\.\.\.|…)\s*\}", "{}", text)  # {...}, {…}
    text = re.sub(r",\s*(\.\.\.|…)", "", text)  # , ... items and keys left out
    text = re.sub(r'"\.\.\.', '"' + LEFT_OUT, text)  # a string's end: ".../model"
    text = re.sub(r'\.\.\."', LEFT_OUT + '"', text)  # a string's beginning: "BjgN..."
    text = re.sub(r":\s*…", ": null", text)  # a value left out
    return json.loads(text)


def holds(answer: Any, part: Any, exact: bool, whole: bool = False, where: str = "answer") -> None:
    """``part`` (what the page shows) is in ``answer``: every key shown, lists as prefixes (``whole``: no other keys
    or items, and null is null, not a left-out); with ``exact`` every number shown too (within 1e-5), else its
    type (a stand-in's numbers are its own); strings and booleans as shown."""
    if isinstance(part, dict):
        assert isinstance(answer, dict), f"{where}: {answer!r}"
        assert not whole or set(answer) == set(part), f"{where}: keys {sorted(answer)} shown as {sorted(part)}"
        for key, value in part.items():
            assert key in answer, f"{where}: no {key!r} in {list(answer)}"
            holds(answer[key], value, exact, whole, f"{where}.{key}")
    elif isinstance(part, list):
        assert isinstance(answer, list), f"{where}: {answer!r}"
        assert not whole or len(answer) == len(part), f"{where}: {len(answer)} items shown as {len(part)}"
        assert len(answer) >= len(part) or not exact, f"{where}: {answer!r}"
        for index, value in enumerate(part[: len(answer)]):
            holds(answer[index], value, exact, whole, f"{where}[{index}]")
    elif part is None:
        assert not whole or answer is None, f"{where}: {answer!r} shown as null"
    elif isinstance(part, str) and part.startswith(LEFT_OUT):
        assert isinstance(answer, str) and answer.endswith(part.removeprefix(LEFT_OUT)), f"{where}: {answer!r}"
    elif isinstance(part, str) and part.endswith(LEFT_OUT):
        # base64 of float32 (the one kind shown cut short) differs in its last bits from one CPU to the next
        assert isinstance(answer, str) and len(answer) >= len(part.removesuffix(LEFT_OUT)), f"{where}: {answer!r}"
    elif isinstance(part, int | float) and not isinstance(part, bool):
        assert isinstance(answer, int | float) and not isinstance(answer, bool), f"{where}: {answer!r}"
        if not exact:
            assert isinstance(answer, int) or not isinstance(part, int), f"{where}: {answer!r} shown as {part!r}"
        else:
            assert answer == pytest.approx(part, abs=1e-5), f"{where}: {answer} shown as {part}"
    else:
        assert answer == part, f"{where}: {answer!r} shown as {part!r}"


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def printed_as_shown(printed: str, expected: str) -> bool:
    """A line a Python block printed against the one its page shows: the same text, numbers within 1e-5."""
    if NUMBER.split(printed) != NUMBER.split(expected):
        return False
    numbers = zip(NUMBER.findall(printed), NUMBER.findall(expected), strict=True)
    return all(float(a) == pytest.approx(float(b), abs=1e-5) for a, b in numbers)


def here(text: str, url: str) -> str:
    """A page's command or code, aimed at the service at ``url`` rather than at localhost:8000."""
    return re.sub(r"(localhost|127\.0\.0\.1):8000", url.removeprefix("http://"), text)


# ---- running the steps ----


def readers_environment(**more: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in NOT_THE_READERS}
    return env | more


def make_arguments(port: int | None = None) -> str:
    """What the test adds to a page's make line: the install step done (this venv stands for .venv), the port."""
    made = f" -o {shlex.quote(str(VENV / '.installed'))} VENV={shlex.quote(str(VENV))}"
    return made + (f" PORT={port}" if port else "")


class StandIns:
    """The stand-in Hub with the pages' models published on it as a service first asks for them, and the Hugging
    Face cache the services share."""

    def __init__(self, hub: StandInHub, root: Path) -> None:
        self.hub, self.root, self.known = hub, root, _stand_ins()
        self.cache = root / "hf"

    def publish(self, serve: Serve | Download) -> None:
        sources = [s for _, s in serve.models] if isinstance(serve, Serve) else list(serve.models)
        for source in sources:
            repo = source.split("@")[0]
            if not repo or repo in self.hub.repositories:
                continue
            if repo not in self.known:
                pytest.fail(f"{serve.where} names {repo}: tests/pages.py has no stand-in to publish under it")
            directory = self.known[repo](self.root / "models" / repo.replace("/", "--"))
            self.hub.add_directory(repo, directory)
            if repo in GATED:
                token = serve.env.get("HF_TOKEN") if isinstance(serve, Serve) else None
                self.hub.repositories[repo].token = token or "a token the page does not give"

    def env(self, **more: str) -> dict[str, str]:
        hub = {"HF_ENDPOINT": self.hub.url, "HF_HOME": str(self.cache), "HF_HUB_OFFLINE": "0"}
        return readers_environment() | hub | SERVICE_SETTINGS | more


@dataclass
class Running:
    process: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.unlink(missing_ok=True)


class Services:
    """The services of the pages' ``make serve`` lines, each started as a step first needs it and kept for the
    steps after it (at most ``keep`` at once: the one used longest ago is stopped first)."""

    def __init__(self, stand_ins: StandIns, keep: int = 3) -> None:
        self.stand_ins, self.keep = stand_ins, keep
        self.running: dict[str, Running] = {}

    def url(self, serve: Serve) -> str:
        if serve.line in self.running:
            self.running[serve.line] = self.running.pop(serve.line)  # the most recently used last
            return self.running[serve.line].url
        while len(self.running) >= self.keep:
            self.running.pop(next(iter(self.running))).stop()
        self.stand_ins.publish(serve)
        self.running[serve.line] = self.start(serve)
        return self.running[serve.line].url

    def start(self, serve: Serve, timeout: float = 240.0) -> Running:
        port = free_port()
        log = Path(tempfile.mkstemp(prefix="page-service-", suffix=".log")[1])
        with log.open("w") as out:
            process = subprocess.Popen(
                ["sh", "-c", serve.line + make_arguments(port)],
                cwd=ROOT,
                env=self.stand_ins.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # make, its shell and the service: stopped together
            )
        running = Running(process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{running.url}/health", timeout=1).status_code == 200:
                    return running
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        written = log.read_text()[-3000:]
        why = "exited during start-up" if process.poll() is not None else f"not ready in {timeout:.0f} s"
        running.stop()
        pytest.fail(f"{serve.where}: `{serve.line}` {why}:\n{written}")

    def close(self) -> None:
        for running in self.running.values():
            running.stop()
        self.running.clear()


@contextmanager
def services(root: Path) -> Iterator[Services]:
    with StandInHub() as hub:
        pool = Services(StandIns(hub, root))
        try:
            yield pool
        finally:
            pool.close()


def check_serve(step: Serve, pool: Services) -> None:
    """The line starts the service, which serves the models it names under the names it gives them."""
    url = pool.url(step)
    served = [model["id"] for model in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
    assert served == [name for name, _ in step.models], (step.where, served)


def check_download(step: Download, pool: Services, cache: Path) -> None:
    """The line fills an empty cache with every model it names, whole."""
    from app.download import COMPLETE

    pool.stand_ins.publish(step)
    done = subprocess.run(
        ["sh", "-c", step.line + make_arguments()],
        cwd=ROOT,
        env=pool.stand_ins.env(HF_HOME=str(cache)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (step.where, done.stdout[-2000:], done.stderr[-2000:])
    for model in step.models:
        folder = cache / "hub" / f"models--{model.split('@')[0].replace('/', '--')}" / "snapshots"
        assert list(folder.glob(f"*/{COMPLETE}")), (step.where, model, done.stderr[-2000:])


def check_request(step: Request, pool: Services, tmp_path: Path) -> None:
    """The command answers as the page shows; a command that writes a file, with the lines that read it, prints
    what their comments say."""
    url = pool.url(step.serve)
    readers = (line for line in step.rest if not line.startswith("#"))
    lines = [re.sub(r"^(\.venv/bin/)?python ", f"{sys.executable} ", line) for line in readers]
    script = "\n".join([here(step.command, url), *lines])
    result = subprocess.run(["sh", "-ec", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (step.where, result.stderr)
    if step.rest:
        printed = [line[2:] for line in step.rest if line.startswith("# ")]
        assert result.stdout.strip() == "\n".join(printed), (step.where, result.stdout)
        return
    body = json.loads(result.stdout)
    answer = step.answer
    assert "error" not in body or (answer is not None and '"error"' in answer), (step.where, body)
    if answer is None:
        return
    exact = step.serve.real(step.model)
    whole = step.whole and "…" not in answer and "..." not in answer
    holds(body, shown(answer), exact, whole, step.where)


def environment(installs: tuple[str, ...]) -> Path:
    """A virtual environment of its own (no system site packages) in which ``installs``, pip lines, ran as written;
    made once for those lines and this Python, under build/page-environments."""
    key = hashlib.sha256("\n".join([sys.version, *installs]).encode()).hexdigest()[:16]
    venv = ENVIRONMENTS / key
    ENVIRONMENTS.mkdir(parents=True, exist_ok=True)
    with (ENVIRONMENTS / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be making it
        if not (venv / "made").is_file():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            for line in installs:
                done = subprocess.run(
                    ["sh", "-ec", line], env=activated(venv), capture_output=True, text=True, timeout=280
                )
                assert done.returncode == 0, (line, done.stderr[-3000:])
            (venv / "made").write_text("\n".join(installs) + "\n")
    return venv


def activated(venv: Path) -> dict[str, str]:
    """A reader's shell with ``venv`` activated."""
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env = readers_environment(PATH=path, VIRTUAL_ENV=str(venv))
    env.pop("PYTHONHOME", None)
    return env


def check_script(step: Script, pool: Services, tmp_path: Path) -> None:
    """The Python block runs, in the environment its install lines make (or the project's own), and prints what its
    comments say."""
    served = re.search(r"(localhost|127\.0\.0\.1):8000", step.code) is not None
    url = pool.url(step.serve) if served else ""
    if step.installs:
        venv = environment(step.installs)
        python, env, cwd = str(venv / "bin" / "python"), activated(venv), tmp_path
    else:
        python, env, cwd = sys.executable, readers_environment(), ROOT
    result = subprocess.run(
        [python, "-c", here(step.code, url)], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, (step.where, result.stderr[-3000:])
    expected = [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+# (.*)$", step.code, re.M)]
    printed = result.stdout.strip().splitlines()
    assert len(printed) == len(expected), (step.where, printed, expected)
    for line, shown_line in zip(printed, expected, strict=True):
        assert printed_as_shown(line, shown_line), (step.where, line, shown_line)
