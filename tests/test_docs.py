"""Every ``curl`` example of docs/guide.md and docs/models.md, run as a reader runs it against a served service, and
its answer held to what the page shows.

Three services stand behind them, chosen by the models an example names:

- the bundled all-MiniLM-L6-v2 alone (most examples): the answer must hold every key and value shown;
- tiny random stand-ins under the names the pages use for models that cannot be had here (``splade``: a SPLADE
  model saved by sentence-transformers; ``qwen3``: a Qwen3 embedder with its query prompt; ``reranker``: a
  Qwen3-Reranker-shaped yes/no reranker): the answer must have the shape shown (its keys and types), since
  random weights give other numbers;
- ``minilm`` (the bundled model) and ``e5`` (a stand-in), as the page's ``ENCODER_MODELS`` names them.

What a page shows, as tests/test_readme.py reads the README: a ``# {...}`` line under a command is the whole answer,
a JSON block right after a one-command block is the answer with parts left out. Left-outs are written ``...``
(``[...]``, ``[...32 values...]``, ``{…}``, a string's start left out: ``".../model"``, its end ``"BjgN..."``: a
string at least that long, its
characters not compared, since the one kind shown so, base64 of float32, differs in its last bits from one CPU to
the next). A command that
writes a file (``-o``) is run with the shell lines after it, whose ``# `` comment is what they print.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, running_server

pytestmark = pytest.mark.slow  # services in their own processes

PAGES = [ROOT / "docs" / "guide.md", ROOT / "docs" / "models.md"]
STAND_INS = {"splade", "qwen3", "reranker"}
SEVERAL = {"mpnet"}  # the unknown name of the several-models example
LEFT_OUT = "⟨left out⟩"


def examples() -> Iterator[tuple[str, str, list[str], str | None]]:
    """(page and line, the curl command, the shell lines after it in its block, what the page shows it answers)."""
    for page in PAGES:
        text = page.read_text()
        blocks = [
            (m.group(1), m.group(2), text[: m.start()].count("\n") + 1)
            for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)
        ]
        for index, (language, body, line) in enumerate(blocks):
            if language != "sh":
                continue
            lines = joined(body.replace("\\\n", " ").splitlines())
            commands = [k for k, command in enumerate(lines) if command.startswith("curl ")]
            following = blocks[index + 1] if index + 1 < len(blocks) else ("", "", 0)
            for k in commands:
                after = lines[k + 1] if k + 1 < len(lines) else ""
                answer = after[2:] if after.startswith("# {") else None
                if answer is None and len(commands) == 1 and following[0] == "json":
                    answer = following[1]
                rest = [] if "-o " not in lines[k] else lines[k + 1 :]
                yield f"{page.name}:{line + k}", lines[k], rest, answer


def joined(lines: list[str]) -> list[str]:
    """Shell lines with a quoted string that runs on over a line break (a JSON body) taken as one."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].count("'") % 2 == 1:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


EXAMPLES = list(examples())


def service_of(command: str) -> str:
    named = set(re.findall(r'"model":\s*"([^"]+)"', command))
    return "stand-ins" if named & STAND_INS else "several" if named & SEVERAL else "bundled"


def shown(text: str) -> Any:
    """A page's JSON with its left-outs marked: ``[...]`` lists hold nothing required, ``"abc..."`` strings
    their beginning, ``, ...`` and ``…`` items nothing."""
    text = re.sub(r",\s*-?\d[\d.]*\.\.\.", "", text)  # a number cut short: 0.01...
    text = re.sub(r"\[\s*\.\.\.[^\]\[]*\]", "[]", text)  # [...], [...32 values...]
    text = re.sub(r"\{\s*(\.\.\.|…)\s*\}", "{}", text)  # {...}, {…}
    text = re.sub(r",\s*(\.\.\.|…)", "", text)  # , ... items and keys left out
    text = re.sub(r'"\.\.\.', '"' + LEFT_OUT, text)  # a string's end: ".../model"
    text = re.sub(r'\.\.\."', LEFT_OUT + '"', text)  # a string's beginning: "BjgN..."
    text = re.sub(r":\s*…", ": null", text)  # a value left out
    return json.loads(text)


def holds(answer: Any, part: Any, exact: bool, where: str = "answer") -> None:
    """``part`` (what the page shows) is in ``answer``: every key shown, lists as prefixes; with ``exact`` every
    value shown too (numbers within 1e-5), else each value's type (a stand-in's numbers are its own)."""
    if isinstance(part, dict):
        assert isinstance(answer, dict), f"{where}: {answer!r}"
        for key, value in part.items():
            assert key in answer, f"{where}: no {key!r} in {list(answer)}"
            holds(answer[key], value, exact, f"{where}.{key}")
    elif isinstance(part, list):
        assert isinstance(answer, list) and (len(answer) >= len(part) or not exact), f"{where}: {answer!r}"
        for index, value in enumerate(part[: len(answer)]):
            holds(answer[index], value, exact, f"{where}[{index}]")
    elif part is None:
        pass  # left out
    elif isinstance(part, str) and part.startswith(LEFT_OUT):
        assert isinstance(answer, str) and (not exact or answer.endswith(part.removeprefix(LEFT_OUT))), where
    elif isinstance(part, str) and part.endswith(LEFT_OUT):
        # base64 of float32 (the one kind shown cut short) differs in its last bits from one CPU to the next
        assert isinstance(answer, str) and len(answer) >= len(part.removesuffix(LEFT_OUT)), where
    elif isinstance(part, float) and not isinstance(part, bool):
        assert isinstance(answer, int | float), where
        assert not exact or answer == pytest.approx(part, abs=1e-5), f"{where}: {answer} shown as {part}"
    elif exact or isinstance(part, bool):
        assert answer == part, f"{where}: {answer!r} shown as {part!r}"
    else:
        assert type(answer) is type(part), f"{where}: {answer!r} shown as {part!r}"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from model import default_model_path
    from tests.families import write_family_model
    from tests.helpers import write_tiny_model
    from tests.retrieval import write_splade

    root = tmp_path_factory.mktemp("docs-models")
    stand_ins = {
        "splade": write_splade(root / "splade", "bert", "max", seed=3),
        "qwen3": write_family_model(root / "qwen3", "qwen3"),
        "reranker": write_family_model(root / "reranker", "qwen3-reranker", head="causal-lm"),
    }
    several = {"minilm": default_model_path(), "e5": write_tiny_model(root / "e5")}
    entries = {
        name: ",".join(f"{n}={d}" for n, d in models.items())
        for name, models in (("stand-ins", stand_ins), ("several", several))
    }
    torch = {"ENCODER_RUNTIME": "torch"}  # the runtime guide.md's /info shows; `auto` picks it per CPU
    with (
        running_server(torch) as bundled,
        running_server(torch | {"ENCODER_MODELS": entries["stand-ins"]}) as standing_in,
        running_server(torch | {"ENCODER_MODELS": entries["several"]}) as both,
    ):
        yield {"bundled": bundled, "stand-ins": standing_in, "several": both}


def test_the_pages_show_requests_with_their_answers() -> None:
    assert len(EXAMPLES) >= 20, EXAMPLES
    shown_answers = [where for where, _, rest, answer in EXAMPLES if answer is not None or rest]
    assert len(shown_answers) >= 12, shown_answers


@pytest.mark.parametrize(("where", "command", "rest", "answer"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_example_answers_as_its_page_shows(
    services: dict[str, str], tmp_path: Path, where: str, command: str, rest: list[str], answer: str | None
) -> None:
    service = service_of(command)
    url = services[service]
    here = command.replace("localhost:8000", url.removeprefix("http://"))
    lines = (re.sub(r"^python ", f"{sys.executable} ", line) for line in rest if not line.startswith("#"))
    script = "\n".join([here, *lines])
    result = subprocess.run(["sh", "-ec", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (where, result.stderr)
    if rest:  # a file written, then read by the lines after: they print what their comment says
        printed = [line[2:] for line in rest if line.startswith("# ")]
        assert result.stdout.strip() == "\n".join(printed), (where, result.stdout)
        return
    body = json.loads(result.stdout)
    assert "error" not in body or (answer is not None and '"error"' in answer), (where, body)
    if answer is None:
        return
    if answer.startswith("{") and "\n" not in answer.strip() and "…" not in answer and service != "stand-ins":
        assert body == json.loads(answer), where  # a whole answer
    else:
        holds(body, shown(answer), exact=service != "stand-ins", where=where)
