"""Models named by Hugging Face Hub id (app/download.py), against a stand-in Hub (tests/hub.py) that
huggingface_hub is pointed at with HF_ENDPOINT: the service as a user starts it, equal to sentence-transformers on
the same files, a second start with no Hub at all, a pinned revision, and each failure in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.download import COMPLETE, wanted
from tests.helpers import server_log, start_server, write_tiny_model
from tests.hub import StandInHub

pytestmark = pytest.mark.slow
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny checkpoints with different weights: the default branch's and a tag's."""
    base = tmp_path_factory.mktemp("hub-models")
    return {"main": write_tiny_model(base / "main", seed=1), "v1": write_tiny_model(base / "v1", seed=2)}


@pytest.fixture
def hub(checkpoints: dict[str, Path]):
    with StandInHub() as stand_in:
        extra = {"pytorch_model.bin": b"not read", "onnx/model.onnx": b"not read", "onnx/config.json": b"{}"}
        stand_in.add_directory("org/tiny", checkpoints["main"], extra=extra)
        stand_in.add_directory("org/tiny", checkpoints["v1"], revision="v1")
        yield stand_in


def hub_env(hub: StandInHub, cache: Path, **more: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(cache), "HF_HUB_OFFLINE": "0", **more}


def download(*models: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.download", *models],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=60)


def embeddings(url: str, model: str | None = None) -> np.ndarray:
    body = {"texts": TEXTS} | ({"model": model} if model else {})
    reply = httpx.post(f"{url}/encode", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return np.array([item["embedding"] for item in reply.json()["data"]])


def reference(directory: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(directory), device="cpu").encode(TEXTS, normalize_embeddings=True)


def test_a_model_named_by_hub_id_is_fetched_once_served_as_sentence_transformers_and_then_needs_no_hub(
    hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    env = hub_env(hub, tmp_path / "hf", ENCODER_MODEL="org/tiny", ENCODER_WORKERS="2")
    process, url = start_server(env, supervised=True)
    try:
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["org/tiny"]
        np.testing.assert_allclose(embeddings(url, "org/tiny"), reference(checkpoints["main"]), atol=1e-5)
        tei = httpx.post(f"{url}/models/org/tiny/tei/embed", json={"inputs": TEXTS[0]}, timeout=60)  # a / in the name
        assert tei.status_code == 200 and np.allclose(tei.json()[0], embeddings(url)[0], atol=1e-6), tei.text
        log = server_log(process)
        assert "fetching org/tiny (commit" in log and "model.safetensors" in log, log
    finally:
        stop_server(process)
    # Only what the service reads, each file once, though an engine and two front ends read the model.
    snapshots = list((tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    assert len(snapshots) == 1
    fetched = sorted(str(p.relative_to(snapshots[0])) for p in snapshots[0].rglob("*") if p.is_file())
    assert fetched == sorted([COMPLETE, "config.json", "model.safetensors", "tokenizer.json"])
    assert set(hub.downloads.values()) == {1} and "org/tiny/pytorch_model.bin" not in hub.downloads

    # A second start: the Hub unreachable (its address given, nothing listening), and again with HF_HUB_OFFLINE=1;
    # the cached files serve, under a name of the user's choosing in ENCODER_MODELS.
    hub.__exit__()
    for offline in ("0", "1"):
        again = {**env, "HF_HUB_OFFLINE": offline, "ENCODER_MODELS": "tiny=org/tiny", "ENCODER_WORKERS": "1"}
        process, url = start_server(again, supervised=True)
        try:
            np.testing.assert_allclose(embeddings(url, "tiny"), reference(checkpoints["main"]), atol=1e-5)
            if offline == "0":
                assert "serving org/tiny as cached" in server_log(process)
        finally:
            stop_server(process)


def test_a_pinned_revision_is_the_one_served(
    hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.download import HubModel, fetch

    env = hub_env(hub, tmp_path / "hf")
    result = download("org/tiny@v1", env=env)
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip())
    assert (snapshot / "model.safetensors").read_bytes() == (checkpoints["v1"] / "model.safetensors").read_bytes()
    assert json.loads((snapshot / COMPLETE).read_text())["model"] == "org/tiny@v1"
    # Then, offline, the cache alone answers for the tag, and only for what was fetched.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch(HubModel("org/tiny", "v1")) == snapshot
    with pytest.raises(
        ValueError, match=r"org/tiny is not in the Hugging Face cache .* \(python -m app\.download org/tiny\)"
    ):
        fetch(HubModel("org/tiny", None))


def test_only_the_files_read_are_wanted() -> None:
    for name in ("config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json", "2_Dense/model.safetensors"):
        assert wanted(name), name
    for name in (
        "pytorch_model.bin",
        "onnx/model.onnx",
        "onnx/config.json",
        "README.md",
        "a/b/config.json",
        "checkpoint-500/model.safetensors",  # a training checkpoint beside the model: not read
    ):
        assert not wanted(name), name
    assert wanted("sparse_linear.pt") and not wanted("optimizer.pt")


def test_a_hub_that_is_down_leaves_a_whole_cached_copy_served_and_a_pinned_commit_needs_no_hub(
    hub: StandInHub, tmp_path: Path
) -> None:
    env = hub_env(hub, tmp_path / "hf")
    first = download("org/tiny", env=env)
    assert first.returncode == 0, first.stderr
    commit = Path(first.stdout.strip()).name
    hub.failing = 503  # every request: 503, as a Hub that is down or overloaded answers
    again = download("org/tiny", env=env)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert "serving org/tiny as cached" in again.stderr
    asked = hub.requests
    pinned = download(f"org/tiny@{commit}", env=env)
    assert pinned.returncode == 0 and pinned.stdout == first.stdout, pinned.stderr
    assert hub.requests == asked  # a commit's whole copy: not even a question to the Hub
    other = download("org/tiny@v1", env=env)  # nothing cached for it: one line, no copy
    assert other.returncode == 1 and "error: could not fetch org/tiny@v1" in other.stderr, other.stderr


def test_a_copy_filled_by_another_tool_is_read_offline_when_whole(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot that huggingface-cli or sentence-transformers filled (no record of ours) serves when it holds the
    config, tokenizer and weights; one that lacks any is named as such."""
    from app.download import HubModel, fetch

    folder = tmp_path / "hf" / "hub" / "models--org--other"
    snapshot = folder / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for path in checkpoints["main"].iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch(HubModel("org/other", None)) == snapshot
    (snapshot / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"the cached copy of org/other in .* lacks tokenizer\.json"):
        fetch(HubModel("org/other", None))


def test_a_path_is_never_taken_for_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.download import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(ValueError, match=r"model directory models/mine does not exist \(read as a directory"):
        resolve("models/mine")  # looks like org/name, but models/ is a directory here: no request to any Hub
    with pytest.raises(ValueError, match=r"model directory nowhere/mine does not exist$"):
        resolve(Path("nowhere/mine"))  # ENCODER_MODEL_DIR: a directory, always


@pytest.mark.parametrize(
    ("case", "model", "says"),
    [
        ("not found", "org/nothing", r"no model org/nothing at http://127\.0\.0\.1:\d+ \(a private one needs HF_TOKEN"),
        ("no such revision", "org/tiny@v9", r"org/tiny has no revision 'v9'"),
        ("gated, no token", "org/gated", r"org/gated is gated: accept its conditions .* then set HF_TOKEN"),
        ("pickled weights only", "org/pickled", r"only as pytorch_model\.bin \(a pickle.*convert them to model"),
        ("sharded weights", "org/sharded", r"several safetensors shards"),
        ("not a Hub id", "nothing-here", r"nothing-here: not a Hugging Face Hub id"),
    ],
)
def test_each_failure_is_one_line_naming_the_model(
    hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path, case: str, model: str, says: str
) -> None:
    files = {p.name: p.read_bytes() for p in checkpoints["main"].iterdir()}
    hub.add("org/gated", files, token="secret")
    hub.add("org/pickled", {"config.json": b"{}", "pytorch_model.bin": b"\x80"})
    hub.add("org/sharded", {"config.json": b"{}", "model.safetensors.index.json": b"{}"})
    result = download(model, env=hub_env(hub, tmp_path / "hf"))
    assert result.returncode == 1, (case, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert re.search(says, errors[0]), errors[0]
    assert not list((tmp_path / "hf").rglob(COMPLETE))


def test_make_download_fetches_into_the_cache(hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """``make download`` as the README gives it: the Makefile keeps the tests offline, not this target."""
    env = {**os.environ, **hub_env(hub, tmp_path / "hf")}
    result = subprocess.run(
        ["make", "-s", "download", "MODEL=org/tiny"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip().splitlines()[-1])
    assert (snapshot / "model.safetensors").read_bytes() == (checkpoints["main"] / "model.safetensors").read_bytes()


def test_a_gated_model_comes_with_its_token(hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    files = {p.name: p.read_bytes() for p in checkpoints["main"].iterdir()}
    hub.add("org/gated", files, token="secret")
    result = download("org/gated", env=hub_env(hub, tmp_path / "hf", HF_TOKEN="secret"))
    assert result.returncode == 0, result.stderr
    assert (Path(result.stdout.strip()) / "model.safetensors").read_bytes() == files["model.safetensors"]


@pytest.mark.parametrize("how", ["stalls", "breaks off"])
def test_a_download_that_stalls_or_breaks_is_never_served(
    hub: StandInHub, checkpoints: dict[str, Path], tmp_path: Path, how: str
) -> None:
    (hub.stalling if how == "stalls" else hub.breaking).add("model.safetensors")
    env = hub_env(hub, tmp_path / "hf", HF_HUB_DOWNLOAD_TIMEOUT="1", HF_HUB_ETAG_TIMEOUT="1")
    result = download("org/tiny", env=env)
    assert result.returncode == 1, result.stderr
    assert "error: could not fetch org/tiny from http://127.0.0.1" in result.stderr, result.stderr
    assert "nothing of it is served" in result.stderr
    assert not list((tmp_path / "hf").rglob(COMPLETE))
    # Offline now, the service refuses the partial copy at start: one line naming the model, exit status 4.
    (hub.stalling if how == "stalls" else hub.breaking).clear()
    serve = subprocess.run(
        [sys.executable, "-m", "app.serve", "--port", "0"],
        env={**os.environ, **env, "HF_HUB_OFFLINE": "1", "ENCODER_MODEL": "org/tiny"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 4, serve.stderr
    assert "cannot serve model 'org/tiny'" in serve.stderr and "incomplete" in serve.stderr, serve.stderr
    # With the Hub back, the next start fetches what is missing and serves.
    result = download("org/tiny", env=env)
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip())
    assert (snapshot / "model.safetensors").read_bytes() == (checkpoints["main"] / "model.safetensors").read_bytes()
