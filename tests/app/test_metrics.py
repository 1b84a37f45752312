"""A front end's metrics in prometheus-client's multiprocess mode, written once a loop turn (app/metrics.py's
TurnWrites): what the files say, read as a scrape reads them, against prometheus-client's own in-process count of the
same requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector

from app import metrics as metrics_module
from app.metrics import Metrics, TurnWrites, front_ends_exposition

REQUESTS = [("/encode", "POST", 200, 0.0012), ("/encode", "POST", 200, 0.03), ("/v1/embeddings", "POST", 422, 0.0004)]
PHASES = [(0.0001, 0.0005, 0.0004, 0.0001), (0.002, 0.01, 0.015, 0.003)]


def count(metrics: Metrics) -> None:
    """Each of REQUESTS answered, /encode's phases and its short way counted, as a front end counts them."""
    for route, method, status, seconds in REQUESTS:
        metrics.observe_request(route, method, status, seconds)
    for phases in PHASES:
        metrics.observe_phases("/encode", *phases)
        metrics.short_way.labels("/encode").inc()
    metrics.timeouts.inc()


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The front ends' families' samples (no _created: multiprocess mode has none), by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        if family.name in metrics_module.HTTP_METRICS
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def in_files(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(directory))
    return samples(merged)


@pytest.fixture
def deferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TurnWrites]:
    """This process's values as a front end's: multiprocess, written once a turn, into files under tmp_path."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    writes = TurnWrites(values.MultiProcessValue())
    monkeypatch.setattr(values, "ValueClass", writes.value_class)
    monkeypatch.setattr(metrics_module, "WRITES", writes)
    yield writes
    values.close_all_multiprocess_files()


async def test_a_turns_counts_are_in_the_files_once_the_turn_ends(deferred: TurnWrites, tmp_path: Path) -> None:
    metrics = Metrics()
    count(metrics)
    assert set(in_files(tmp_path).values()) == {0.0}  # the series made, nothing counted yet during the turn
    await asyncio.sleep(0)  # the turn ends: the loop runs the write it was asked for
    written = in_files(tmp_path)
    with pytest.MonkeyPatch.context() as plain:  # prometheus-client's in-process count of the same requests
        plain.setattr(values, "ValueClass", values.MutexValue)
        reference = Metrics()
        count(reference)
    assert written == samples(reference.registry)
    assert written[("encoder_requests_total", (("method", "POST"), ("route", "/encode"), ("status", "200")))] == 2
    assert written[("encoder_request_seconds_bucket", (("le", "0.05"), ("phase", "total"), ("route", "/encode")))] == 2
    assert written[("encoder_short_way_requests_total", (("route", "/encode"),))] == 2
    count(metrics)  # and the next turn's on top
    await asyncio.sleep(0)
    assert in_files(tmp_path)[("encoder_timeouts_total", ())] == 2


async def test_a_scrape_in_the_same_turn_sees_its_own_processs_counts(deferred: TurnWrites, tmp_path: Path) -> None:
    metrics = Metrics()
    count(metrics)
    exposition = front_ends_exposition(str(tmp_path)).decode()
    assert 'encoder_requests_total{method="POST",route="/encode",status="200"} 2.0' in exposition
    assert "encoder_timeouts_total 1.0" in exposition


def test_where_no_event_loop_runs_an_increment_is_written_at_once(deferred: TurnWrites, tmp_path: Path) -> None:
    metrics = Metrics()
    metrics.timeouts.inc()
    metrics.timeouts.inc(2)
    assert in_files(tmp_path)[("encoder_timeouts_total", ())] == 3


async def test_an_increment_on_a_thread_without_a_loop_is_written_at_once_beside_the_turns(
    deferred: TurnWrites, tmp_path: Path
) -> None:
    metrics = Metrics()
    count(metrics)  # this turn's, held
    thread = threading.Thread(target=metrics.timeouts.inc)  # no loop runs there
    thread.start()
    thread.join()  # within the turn
    assert in_files(tmp_path)[("encoder_timeouts_total", ())] == 2  # written at once, with the loop's own so far
    assert in_files(tmp_path)[("encoder_short_way_requests_total", (("route", "/encode"),))] == 0
    await asyncio.sleep(0)
    assert in_files(tmp_path)[("encoder_short_way_requests_total", (("route", "/encode"),))] == 2
