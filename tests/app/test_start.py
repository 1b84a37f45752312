"""What a start says and refuses (API.md, part five, "Settings that are checked"): an ``ENCODER_`` variable that
names no setting stops it in one line naming the closest setting; "ready" is logged once the service answers, not
before; and the same machine, model and settings serve the same runtime and the same bytes, start after start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from app.settings import Settings, unknown_settings
from tests.helpers import ROOT, free_port, server_log, start_server

BASE = {**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu"}


@pytest.mark.parametrize(
    ("variable", "closest"),
    [
        ("ENCODER_BATCH_SZE", "ENCODER_MAX_BATCH_SIZE"),  # API.md's own example
        ("ENCODER_WORKER", "ENCODER_WORKERS"),
        ("ENCODER_DTYPES", "ENCODER_DTYPE"),
        ("encoder_max_queue_text", "ENCODER_MAX_QUEUE_TEXTS"),  # the environment's names are read in any case
        ("ENCODER_REQUEST_TIMEOUT", "ENCODER_REQUEST_TIMEOUT_S"),
    ],
)
def test_an_unknown_setting_is_named_with_the_closest(variable: str, closest: str) -> None:
    assert unknown_settings({variable: "8", "ENCODER_DEVICE": "cpu", "PATH": "/bin"}) == [
        f"{variable}: no such setting; did you mean {closest}?"
    ]


def test_every_setting_is_known_and_other_prefixes_are_not_ours() -> None:
    every = {f"ENCODER_{name.upper()}": "x" for name in Settings.model_fields}
    assert unknown_settings({**every, "HF_HOME": "/x", "MY_ENCODER_X": "1", "ENCODER": "1"}) == []


@pytest.mark.parametrize(
    "variables",
    [
        # a Kubernetes Service named encoder-service, as the kubelet writes its links into every pod of its namespace
        {
            "ENCODER_SERVICE_SERVICE_HOST": "10.96.0.12",
            "ENCODER_SERVICE_SERVICE_PORT": "8000",
            "ENCODER_SERVICE_SERVICE_PORT_HTTP": "8000",
            "ENCODER_SERVICE_PORT": "tcp://10.96.0.12:8000",
            "ENCODER_SERVICE_PORT_8000_TCP": "tcp://10.96.0.12:8000",
            "ENCODER_SERVICE_PORT_8000_TCP_PROTO": "tcp",
            "ENCODER_SERVICE_PORT_8000_TCP_PORT": "8000",
            "ENCODER_SERVICE_PORT_8000_TCP_ADDR": "10.96.0.12",
        },
        {"ENCODER_PORT": "tcp://10.96.0.13:80", "ENCODER_SERVICE_HOST": "10.96.0.13"},  # a Service named encoder
    ],
)
def test_the_links_kubernetes_writes_for_a_service_are_not_settings(variables: dict[str, str]) -> None:
    assert unknown_settings(variables) == []


def test_a_port_or_host_that_is_no_service_link_is_still_refused() -> None:
    """Known by name and value together: a port setting misspelt, or a link's name with a value of another kind."""
    lines = unknown_settings({"ENCODER_PORT": "9000", "ENCODER_GRCP_PORT": "50051", "ENCODER_SERVICE_HOST": "db"})
    assert [line.split(":")[0] for line in lines] == ["ENCODER_GRCP_PORT", "ENCODER_PORT", "ENCODER_SERVICE_HOST"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_misspelt_setting_stops_the_start_in_one_line(workers: str) -> None:
    env = {**BASE, "ENCODER_WORKERS": workers, "ENCODER_BATCH_SZE": "8"}
    command = [sys.executable, "-m", "app.serve", "--port", str(free_port())]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == "ENCODER_BATCH_SZE: no such setting; did you mean ENCODER_MAX_BATCH_SIZE?\n"
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ready_is_logged_once_the_service_answers_with_its_address_and_models(workers: str) -> None:
    """Nothing before the line reads as ready (uvicorn's "running on" included), and at the line /ready is 200."""
    port = free_port()
    env = {**BASE, "ENCODER_WORKERS": workers, "ENCODER_DTYPE": "float32"}
    log = ROOT / "build" / f"start-{workers}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.serve", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 180
        ready = re.compile(rf"INFO app\.serve \[-\] ready on http://127\.0\.0\.1:{port}: all-MiniLM-L6-v2")
        while not ready.search(log.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=10).status_code == 200
        said = log.read_text()
        before = said[: ready.search(said).start()]  # type: ignore[union-attr]
        assert f"bound to http://127.0.0.1:{port}; loading" in before
        assert not re.search(r"\bready\b|[Rr]unning on|[Ll]istening", before), before
        assert len(ready.findall(said)) == 1
    finally:
        process.terminate()
        assert process.wait(60) == 0
        log.unlink()


@pytest.mark.slow
def test_two_starts_serve_the_same_runtime_and_the_same_bytes() -> None:
    """The bundled model, every default (ENCODER_RUNTIME=auto included), started twice on this machine: /info's
    runtime and the answers' bytes are the same (a timing race at start once served torch, then OpenVINO)."""
    texts = ["The quick brown fox.", "A lazy dog sleeps in the afternoon sun by the river.", "Rain.", "x " * 120]
    answers = []
    for _ in range(2):
        process, url = start_server({"ENCODER_DTYPE": "auto", "ENCODER_RUNTIME": "auto"})
        try:
            info = httpx.get(f"{url}/info", timeout=30).json()
            one = httpx.post(f"{url}/encode", json={"texts": texts[:1]}, timeout=60).content
            many = httpx.post(f"{url}/encode", json={"texts": texts}, timeout=60).content
            npz = httpx.post(
                f"{url}/encode", json={"texts": texts}, headers={"Accept": "application/x-npz"}, timeout=60
            ).content
            answers.append((info["runtime"], one, many, npz, server_log(process)))
        finally:
            process.terminate()
            process.wait(60)
    (runtime, *first, log), (runtime_again, *second, _) = answers
    assert runtime == runtime_again, log
    assert first == second
