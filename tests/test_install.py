"""What `make serve` runs to install torch on each kind of machine: the make recipe run for real, with a stand-in
python in the venv that records each pip command instead of running it (and runs everything else), and PyTorch's
index stood in for by a server on this machine, or by an address where nothing answers."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    """A stand-in for PyTorch's wheel index that answers every page (each build's /torch/)."""

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def install(venv: Path, **variables: str) -> tuple[list[str], str]:
    """Run make's install of the serving environment into ``venv``; (the pip commands it ran, what it printed)."""
    (venv / "bin").mkdir(parents=True)
    stand_in = venv / "bin" / "python"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {venv}/pip.log; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    stand_in.chmod(0o755)
    assignments = [f"VENV={venv}", "PYTHON=true", *(f"{name}={value}" for name, value in variables.items())]
    result = subprocess.run(
        ["make", "-B", f"{venv}/.installed", *assignments], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return (venv / "pip.log").read_text().splitlines(), result.stdout + result.stderr


@pytest.mark.parametrize(
    ("machine", "variables", "build"),
    [
        ("an NVIDIA GPU answers", {"GPU_PROBE": "true"}, "cu128"),
        ("no NVIDIA GPU", {"GPU_PROBE": "false"}, "cpu"),
        ("a GPU, the CPU build asked for", {"GPU_PROBE": "true", "TORCH_INDEX": "cpu"}, "cpu"),
        ("another CUDA build asked for", {"GPU_PROBE": "false", "TORCH_INDEX": "cu126"}, "cu126"),
    ],
)
def test_torch_comes_pinned_from_the_build_for_the_machine_first(
    tmp_path: Path, index: str, machine: str, variables: dict[str, str], build: str
) -> None:
    pips, printed = install(tmp_path / "venv", TORCH_INDEXES=index, **variables)
    installs = [line for line in pips if "--upgrade pip" not in line]
    assert installs[0].endswith(f"-c constraints.txt --index-url {index}/{build} torch"), (machine, installs[0])
    assert f"PyTorch: its {build} build from {index}/{build}\n" in printed, printed
    assert all("--index-url" not in line for line in installs[1:])  # the rest from the usual index


def test_an_index_that_does_not_answer_is_said_once_and_pip_takes_its_own(tmp_path: Path) -> None:
    pips, printed = install(tmp_path / "venv", TORCH_INDEXES=NOWHERE, GPU_PROBE="false")
    installs = [line for line in pips if "--upgrade pip" not in line]
    assert installs[0].endswith("-c constraints.txt torch") and "--index-url" not in installs[0], installs[0]
    said = [line for line in printed.splitlines() if "PyTorch" in line or "Retrying" in line or "WARNING" in line]
    assert said == [f"PyTorch: {NOWHERE}/cpu does not answer here, so what pip finds on its package index"], printed


def test_what_pip_finds_when_asked_for(tmp_path: Path, index: str) -> None:
    pips, printed = install(tmp_path / "venv", TORCH_INDEXES=index, TORCH_INDEX="pypi", GPU_PROBE="true")
    installs = [line for line in pips if "--upgrade pip" not in line]
    assert installs[0].endswith("-c constraints.txt torch") and "--index-url" not in installs[0], installs[0]
    assert "PyTorch: what pip finds on its package index (TORCH_INDEX=pypi)" in printed
