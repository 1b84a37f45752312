"""What `make serve` runs to install torch on each kind of machine (`make -n`: printed, not run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INDEX = "--index-url https://download.pytorch.org/whl/"


def install_commands(venv: Path, **variables: str) -> list[str]:
    assignments = [f"VENV={venv}", *(f"{name}={value}" for name, value in variables.items())]
    result = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.installed", *assignments], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize(
    ("machine", "variables", "build"),
    [
        ("an NVIDIA GPU answers", {"GPU_PROBE": "true"}, "cu128"),
        ("no NVIDIA GPU", {"GPU_PROBE": "false"}, "cpu"),
        ("a GPU, the CPU build asked for", {"GPU_PROBE": "true", "TORCH_INDEX": "cpu"}, "cpu"),
        ("another CUDA build asked for", {"GPU_PROBE": "false", "TORCH_INDEX": "cu126"}, "cu126"),
        ("what pip finds asked for", {"GPU_PROBE": "true", "TORCH_INDEX": "pypi"}, None),
    ],
)
def test_torch_comes_pinned_from_the_build_for_the_machine_first(
    tmp_path: Path, machine: str, variables: dict[str, str], build: str | None
) -> None:
    commands = install_commands(tmp_path / "venv", **variables)
    installs = [line for line in commands if "pip install" in line and "--upgrade pip" not in line]
    first, _, fallback = installs[0].strip().partition(" || ")
    assert first.endswith(" torch") and "-c constraints.txt" in first, installs[0]  # torch first, pinned
    if build is None:
        assert INDEX not in first and not fallback, machine
    else:
        assert f"{INDEX}{build} " in first, (machine, first)
        # the index unreachable: what pip finds, still pinned
        assert fallback.endswith("-c constraints.txt torch") and INDEX not in fallback, (machine, fallback)
    assert all(INDEX not in line for line in installs[1:])  # the rest from the usual index
