"""The README's requests, run as a newcomer runs them against the bundled model served in its own process: every
``curl`` command of its shell blocks, and its Python block (OpenAI's client).

What each answer is held to is what the README shows: a JSON block right after a command is the answer with
parts left out (``...``), so every key it shows is there with the value it shows, and every list it shows
begins the answer's list (numbers within 1e-5); a ``# {...}`` line under a command is the whole answer; a
``# value`` comment after a Python line is what that line prints. The README's other shell lines (``make``,
a model directory of one's own) are the set-up the other tests and CI run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import ROOT, running_server

pytestmark = pytest.mark.slow  # the service in its own process

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)  # (language, text), in order


def shell_commands(text: str) -> Iterator[tuple[str, str | None]]:
    """Each curl command of a shell block (continued lines joined) and the ``# `` answer under it, if any."""
    lines = text.replace("\\\n", " ").splitlines()
    for index, line in enumerate(lines):
        if line.startswith("curl "):
            after = lines[index + 1] if index + 1 < len(lines) else ""
            yield line, after[2:] if after.startswith("# {") else None


def curls() -> list[tuple[str, str | None]]:
    """(command, what the README shows it answers: a whole JSON line, a JSON block with parts left out, or None)."""
    found = []
    for index, (language, text) in enumerate(BLOCKS):
        if language != "sh":
            continue
        commands = list(shell_commands(text))
        following = BLOCKS[index + 1] if index + 1 < len(BLOCKS) else ("", "")
        for command, answer in commands:
            if answer is None and len(commands) == 1 and following[0] == "json":
                answer = following[1]
            found.append((command, answer))
    return found


def shown(text: str) -> Any:
    """A JSON block with its ``...`` left-outs taken away: what the answer must at least hold."""
    return json.loads(re.sub(r",\s*\.\.\.", "", text))


def holds(answer: Any, part: Any, where: str = "answer") -> None:
    """``part`` (what the README shows) is in ``answer``: its keys with their values, its lists as prefixes."""
    if isinstance(part, dict):
        assert isinstance(answer, dict), where
        for key, value in part.items():
            assert key in answer, f"{where}: no {key!r}"
            holds(answer[key], value, f"{where}.{key}")
    elif isinstance(part, list):
        assert isinstance(answer, list) and len(answer) >= len(part), where
        for index, value in enumerate(part):
            holds(answer[index], value, f"{where}[{index}]")
    elif isinstance(part, float):
        assert answer == pytest.approx(part, abs=1e-5), f"{where}: {answer} shown as {part}"
    else:
        assert answer == part, f"{where}: {answer!r} shown as {part!r}"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server() as base:
        yield base


CURLS = curls()


def test_the_readme_shows_requests() -> None:
    assert len(CURLS) >= 3 and all(answer is not None for _, answer in CURLS), CURLS


@pytest.mark.parametrize(("command", "answer"), CURLS, ids=[command[:60] for command, _ in CURLS])
def test_each_curl_answers_as_the_readme_shows(url: str, command: str, answer: str | None) -> None:
    here = command.replace("localhost:8000", url.removeprefix("http://"))
    result = subprocess.run(["sh", "-c", here], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert answer is not None
    if answer.startswith("{") and "\n" not in answer.strip():  # a whole answer
        assert body == json.loads(answer)
    else:
        holds(body, shown(answer))


def test_the_python_example_prints_what_the_readme_says(url: str) -> None:
    (code,) = [text for language, text in BLOCKS if language == "python"]
    expected = [line.split("# ", 1)[1].strip() for line in code.splitlines() if "print(" in line]
    here = code.replace("http://127.0.0.1:8000", url)
    result = subprocess.run([sys.executable, "-c", here], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected
