"""ENCODER_WORKERS=auto: how many front ends ``python -m app.serve`` starts, from the cores and the device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.serve import available_cores, computes_on_gpu, front_ends
from app.settings import Settings
from tests.helpers import ROOT


@pytest.mark.parametrize(
    ("cores", "gpu", "expected"),
    [
        (1, False, 1),
        (2, False, 1),  # this machine: a second process costs more than it saves
        (15, False, 1),
        (16, False, 2),
        (64, False, 5),
        (256, False, 8),
        (2, True, 1),
        (8, True, 2),
        (16, True, 4),  # an H100 host of 16 cores
        (64, True, 8),
    ],
)
def test_auto_is_one_front_end_a_16_cores_on_a_cpu_and_one_a_4_cores_beside_a_gpu(
    cores: int, gpu: bool, expected: int
) -> None:
    assert front_ends("auto", cores, gpu) == expected


def test_a_number_of_workers_is_taken_as_it_is() -> None:
    assert front_ends(3, 64, True) == 3
    assert front_ends(1, 256, False) == 1


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize(
    ("membership", "files", "limit"),
    [
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # v2, in a container's namespace, no quota
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2),
        ("0::/\n", {"cpu.max": "50000 100000\n"}, 1),
        ("0::/\n", {"cpu.max": "garbled\n"}, None),
        # v2 seen from the host: the pod's limit on a parent of the container's group
        (
            "0::/kubepods/pod1/ctr\n",
            {"kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/pod1/ctr/cpu.max": "max"},
            2,
        ),
        # v1, the cpu controller mounted with cpuacct
        (
            "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            3,
        ),
        (
            "3:cpu,cpuacct:/\n",
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            None,
        ),
    ],
)
def test_the_cores_are_the_affinity_within_the_cgroup_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, membership: str, files: dict[str, str], limit: int | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))  # a 64-core node
    cgroups = tmp_path / "cgroup"
    write(cgroups, files)
    (tmp_path / "self").write_text(membership)
    assert available_cores(cgroups, tmp_path / "self") == (64 if limit is None else limit)
    assert available_cores(cgroups, tmp_path / "absent") == 64


def test_a_gpu_is_told_by_the_device_setting_or_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = tmp_path / "nvidiactl"
    assert not computes_on_gpu("cpu", control)
    assert computes_on_gpu("cuda:1", control)
    assert not computes_on_gpu("auto", control)  # no driver
    control.touch()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert computes_on_gpu("auto", control)
    assert not computes_on_gpu("cpu", control)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not computes_on_gpu("auto", control)  # every GPU hidden


def test_encoder_workers_takes_auto_or_a_count_and_refuses_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENCODER_WORKERS", raising=False)
    assert Settings().workers == "auto"
    monkeypatch.setenv("ENCODER_WORKERS", "3")
    assert Settings().workers == 3
    for bad in ("0", "65", "two", "-1"):
        monkeypatch.setenv("ENCODER_WORKERS", bad)
        with pytest.raises(ValidationError):
            Settings()


def test_a_wrong_setting_stops_the_service_with_a_line_naming_it_not_a_traceback() -> None:
    env = {**os.environ, "ENCODER_WORKERS": "two", "ENCODER_MAX_BATCH_SIZE": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "app.serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert any(line.startswith("ENCODER_WORKERS: ") and line.endswith("(got 'two')") for line in lines), lines
    assert any(line.startswith("ENCODER_MAX_BATCH_SIZE: ") and line.endswith("(got '0')") for line in lines), lines


def test_a_front_end_allocator_that_is_not_there_stops_the_service_with_a_line_naming_it(tmp_path: Path) -> None:
    absent = tmp_path / "libnothing.so"
    env = {**os.environ, "ENCODER_FRONT_END_ALLOCATOR": str(absent)}
    result = subprocess.run(
        [sys.executable, "-m", "app.serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"ENCODER_FRONT_END_ALLOCATOR: no shared library at '{absent}' (auto, glibc, or a path)" in result.stderr
