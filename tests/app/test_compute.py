"""All of the service's torch work runs on the compute lanes (app/engine/compute.py), whatever asks for it; the
lanes run passes side by side, each with its share of torch's threads."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from app.engine.compute import COMPUTE, ComputeLanes
from app.serving.registry import compute_lanes
from app.settings import Settings
from model import load_model, tasks
from tests.helpers import serving, write_tiny_model


def recording(threads: list[tuple[str, bool]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads.append((name, COMPUTE.on_it()))
        return fn(*args, **kwargs)

    return wrapper


async def test_loading_passes_inspection_and_tables_run_on_the_compute_lanes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A classifier, so that /classify runs too; it embeds and attends like any encoder.
    model = load_model(
        write_tiny_model(tmp_path / "cls", head="sequence-classification", num_labels=3), device="cpu", name="cls"
    )
    threads: list[tuple[str, bool]] = []
    monkeypatch.setattr(model, "warm_up", recording(threads, "warm_up", model.warm_up))
    passes = ("embed_texts", "logits", "attention_maps", "head_statistics", "neuron_view", "explain_similarities")
    for name in (*passes, "position_encoding"):  # model/runtime/tasks.py
        monkeypatch.setattr(tasks, name, recording(threads, name, getattr(tasks, name)))

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
        queries = ("kind=sinusoidal&length=64&d_model=32", "kind=rotary&length=16", "kind=learned&length=8")
        for query in queries:
            response = await client.get(f"/positional-encoding?{query}")
            assert response.status_code == 200, (query, response.text)

    called = [name for name, _ in threads]
    assert set(called) == {"warm_up", *passes, "position_encoding"}
    assert called.count("position_encoding") == len(queries)
    elsewhere = sorted({name for name, on_a_lane in threads if not on_a_lane})
    assert elsewhere == [], f"torch work off the compute lanes: {elsewhere}"


def test_a_lane_runs_what_it_is_given_and_its_failures_reach_the_caller() -> None:
    compute = ComputeLanes("compute-test")
    caller = threading.get_ident()
    ident = compute.run(threading.get_ident)
    assert ident != caller
    assert compute.run(lambda: compute.run(threading.get_ident)) == ident  # from a lane: runs inline, no deadlock
    assert compute.run(lambda: compute.on_it()) and not compute.on_it()
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)
    assert compute.run(sum, [1, 2, 3]) == 6  # the lane outlives the failure


class Held:
    """A computation that reports its thread and torch thread count once started, then waits to be let go."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()
        self.seen: tuple[int, int] | None = None

    def __call__(self) -> tuple[int, int]:
        self.seen = threading.get_ident(), torch.get_num_threads()
        self.started.set()
        assert self.go.wait(5)
        return self.seen


def side_by_side(compute: ComputeLanes, calls: int) -> list[tuple[int, int]]:
    """Each of ``calls`` threads runs one computation on ``compute`` that waits (2 s at most) until all of them
    run at once; each reports its lane's thread and its torch thread count. Each says that more work is queued
    behind it (``spread=False``), as passes under load do: one alone would go wide and keep the others out."""
    meeting = threading.Barrier(calls, timeout=2)

    def computation() -> tuple[int, int]:
        meeting.wait()
        return threading.get_ident(), torch.get_num_threads()

    with ThreadPoolExecutor(calls) as callers:
        return list(callers.map(lambda _: compute.run(computation, spread=False), range(calls)))


def test_two_lanes_compute_side_by_side_each_with_its_share_of_the_threads() -> None:
    compute = ComputeLanes("compute-test", lanes=2, threads=2, quiet_s=0.0)
    assert len({ident for ident, _ in side_by_side(compute, 2)}) == 2
    first, second, third = Held(), Held(), Held()
    with ThreadPoolExecutor(3) as callers:
        ran_first = callers.submit(compute.run, first, spread=False)  # more is queued behind it: its share
        assert first.started.wait(5)
        ran_second = callers.submit(compute.run, second)  # lane 0 is busy: lane 1, with its share
        assert second.started.wait(5)
        first.go.set()
        ran_first.result(5)
        ran_third = callers.submit(compute.run, third)  # lane 0 again, but lane 1 is at work: its share
        assert third.started.wait(5)
        second.go.set()
        third.go.set()
        (lane_0, first_threads), (lane_1, beside), (lane_0_again, shared) = (
            f.result(5) for f in (ran_first, ran_second, ran_third)
        )
    assert lane_0 == lane_0_again != lane_1
    assert (first_threads, beside, shared) == (1, 1, 1)
    assert compute.run(torch.get_num_threads) == 2  # alone, nothing queued behind: every thread


def test_a_pass_with_every_thread_has_the_cores_to_itself() -> None:
    """Beside a wide pass a second one would leave three threads on two cores: it waits for the wide one."""
    compute = ComputeLanes("compute-test", lanes=2, threads=2, quiet_s=0.0)
    wide, after = Held(), Held()
    with ThreadPoolExecutor(2) as callers:
        ran_wide = callers.submit(compute.run, wide)
        assert wide.started.wait(5)
        ran_after = callers.submit(compute.run, after)
        assert not after.started.wait(0.3)  # a lane is free, yet it does not start
        wide.go.set()
        assert after.started.wait(5)
        after.go.set()
        assert (ran_wide.result(5)[1], ran_after.result(5)[1]) == (2, 2)  # each alone in its turn


def test_no_pass_goes_wide_until_passes_with_a_share_have_stopped_for_a_while() -> None:
    now = [100.0]  # the lanes' clock, moved by hand
    compute = ComputeLanes("compute-test", lanes=2, threads=2, quiet_s=3.0, clock=lambda: now[0])
    assert compute.run(torch.get_num_threads) == 2  # nothing has run yet: quiet
    side_by_side(compute, 2)  # under load: two passes with their shares
    assert compute.run(torch.get_num_threads) == 1  # alone, but load was a moment ago: the next pass is near
    now[0] += 2.9
    assert compute.run(torch.get_num_threads) == 1  # still within quiet_s of the last shared pass
    now[0] += 3.1
    assert compute.run(torch.get_num_threads) == 2
    side_by_side(compute, 2)
    now[0] += 1.0
    assert compute.run(torch.get_num_threads) == 1  # a share, yet alone: it does not put off the next wide pass
    now[0] += 2.1
    assert compute.run(torch.get_num_threads) == 2  # 3.1 s after the last pass that had company
    one_lane = ComputeLanes("compute-test", lanes=1, threads=2)
    assert [one_lane.run(torch.get_num_threads, spread=spread) for spread in (False, True)] == [2, 2]


def test_one_lane_computes_one_thing_at_a_time() -> None:
    compute = ComputeLanes("compute-test", lanes=1, threads=2)
    with pytest.raises(threading.BrokenBarrierError):  # the second never starts while the first waits for it
        side_by_side(compute, 2)
    compute.configure(2)
    assert len({ident for ident, _ in side_by_side(compute, 2)}) == 2


def test_lanes_by_default_where_a_lanes_share_is_one_cpu_thread() -> None:
    cpu = Settings(device="cpu")
    assert [compute_lanes(cpu, threads) for threads in (1, 2, 3, 4, 16)] == [1, 3, 2, 1, 1]
    assert compute_lanes(Settings(device="cpu", compute_lanes=3), 16) == 3  # a setting wins
    assert compute_lanes(Settings(device="cuda:7"), 2) == 1  # a device that cannot be had: loading will say so


SAME_BITS_ON_ANY_THREADS = """
import json, sys
import torch
from model import load_model
from model.nn.encoder import Keep

model = load_model(device="cpu", runtime="torch", dtype="float32")
words = "the quick brown fox jumps over the lazy dog and then runs far away into the forest while birds sing".split()
counts = sorted({1, 2, torch.get_num_threads()})
differing = []
for size in (1, 3):
    for n in range(1, len(words) + 1):
        batch = model.card.tokenizer.pad(model.card.tokenizer.encode([" ".join(words[i : i + n]) for i in range(size)]))
        outputs = []
        for threads in counts:
            torch.set_num_threads(threads)
            output = model.forward(batch, Keep(attentions=True))
            outputs.append([output.last_hidden_state, *output.attentions])
        if any(not all(map(torch.equal, outputs[0], other)) for other in outputs[1:]):
            differing.append((size, n))
json.dump({"mode": __import__("os").environ.get("MKL_CBWR"), "threads": counts, "differing": differing}, sys.stdout)
"""


def test_a_pass_gives_the_same_bits_on_one_thread_as_on_every_thread() -> None:
    # A lane computes a pass with every thread alone, with its share beside others: the load must not show in the
    # bits. Without MKL's strict mode, on AMD EPYC with AVX2, texts of 5 to 9 tokens gave other bits on two threads.
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}  # the package's default, from its first product
    done = subprocess.run(
        [sys.executable, "-c", SAME_BITS_ON_ANY_THREADS], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "AUTO,STRICT"
    assert len(result["threads"]) >= 2
    assert result["differing"] == []
