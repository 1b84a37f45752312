"""All of the service's torch work runs on the one compute thread (app/compute.py), whatever asks for it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.compute import COMPUTE, ComputeThread
from app.services import inspection
from app.settings import Settings
from model import TextEncoder
from tests.helpers import serving, write_tiny_model


def recording(threads: list[tuple[str, int]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads.append((name, threading.get_ident()))
        return fn(*args, **kwargs)

    return wrapper


def compute_ident() -> int:
    return COMPUTE.run(threading.get_ident)


async def test_loading_passes_inspection_and_tables_run_on_the_compute_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A classifier, so that /classify runs too; it embeds and attends like any encoder.
    model = TextEncoder.load(
        write_tiny_model(tmp_path / "cls", head="sequence-classification", num_labels=3), device="cpu", name="cls"
    )
    threads: list[tuple[str, int]] = []
    for method in ("warm_up", "embed_encodings", "classify", "attention", "head_statistics", "neuron"):
        monkeypatch.setattr(model, method, recording(threads, method, getattr(model, method)))
    for function in ("sinusoidal_positional_encoding", "rotary_angles", "explain_similarity"):
        monkeypatch.setattr(inspection, function, recording(threads, function, getattr(inspection, function)))

    async with serving(Settings(), model) as service:
        client = service.client
        for path, body in [
            ("/encode", {"texts": ["a short text", "another, longer text of several words"]}),
            ("/classify", {"texts": ["a text to label"]}),
            ("/attention", {"text": "what attends to what"}),
            ("/attention/heads", {"texts": ["one text", "and a second"]}),
            ("/attention/neuron", {"text": "a head step by step", "layer": 0, "head": 0}),
            ("/similarity", {"source": "a cat", "texts": ["a dog", "a car"], "explain": True}),
            ("/v1/embeddings", {"input": "through the OpenAI shape"}),
        ]:
            response = await client.post(path, json=body)
            assert response.status_code == 200, (path, response.text)
        for query in ("kind=sinusoidal&length=64&d_model=32", "kind=rotary&length=16", "kind=learned&length=8"):
            response = await client.get(f"/positional-encoding?{query}")
            assert response.status_code == 200, (query, response.text)

    called = {name for name, _ in threads}
    assert called == {
        "warm_up",
        "embed_encodings",
        "classify",
        "attention",
        "head_statistics",
        "neuron",
        "sinusoidal_positional_encoding",
        "rotary_angles",
        "explain_similarity",
    }
    elsewhere = sorted({name for name, ident in threads if ident != compute_ident()})
    assert elsewhere == [], f"torch work off the compute thread: {elsewhere}"


def test_the_compute_thread_runs_what_it_is_given_and_its_failures_reach_the_caller() -> None:
    compute = ComputeThread("compute-test")
    caller = threading.get_ident()
    ident = compute.run(threading.get_ident)
    assert ident != caller
    assert compute.run(lambda: compute.run(threading.get_ident)) == ident  # from itself: runs inline, no deadlock
    assert compute.run(lambda: compute.on_it()) and not compute.on_it()
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)
    assert compute.run(sum, [1, 2, 3]) == 6  # the thread outlives the failure
