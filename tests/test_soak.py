"""The soak benchmark (bench/soak.py) run short, as CI runs it: every endpoint under mixed load, a quarter of it bad
input, gets the answers it should (no 5xx, no other class than expected, nothing lost), and the memory it reports is
read from every process of the service. Its memory figures are benchmark output (docs/benchmarks/memory.md), not
assertions."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.soak import trend
from tests.helpers import ROOT


def test_the_trend_is_the_least_squares_gain_over_the_span() -> None:
    assert trend([(0.0, 100.0), (10.0, 110.0), (20.0, 120.0)]) == pytest.approx(20.0)
    assert trend([(0.0, 100.0), (10.0, 130.0), (20.0, 100.0)]) == pytest.approx(0.0)  # a swing, no trend
    assert trend([(5.0, 100.0)]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_short_soak_of_every_endpoint_answers_every_request_as_it_should(workers: str) -> None:
    env = {"ENCODER_WORKERS": workers, "ENCODER_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "bench.soak", "--seconds", "20", "--sample-s", "5", "--clients", "8", "--check"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    load = re.search(r"(\d+) good and (\d+) bad requests answered, 0 errors, 0 lost", result.stdout)
    assert load is not None and int(load.group(1)) > 0 and int(load.group(2)) > 0, result.stdout
    assert len(re.findall(r"^ +\d+ s: \d+ MiB", result.stdout, re.M)) == 4, result.stdout  # a sample each 5 s
    assert re.search(r"resident memory: idle \d+ MiB; under load \d+-\d+ MiB", result.stdout), result.stdout
    fine = re.search(r"of the (\d+) samples every 2 s .* trend [+-]\d+ MiB \(its (\d+) fine samples\)", result.stdout)
    assert fine is not None and int(fine.group(1)) >= 8 and int(fine.group(2)) >= 4, result.stdout  # 20 s: about 10, 5
