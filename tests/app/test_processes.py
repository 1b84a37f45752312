"""The service as processes (python -m app.serve): front ends that answer as one process does, an engine that
computes, and what happens when one of them dies or the service is told to stop."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from app.engine.admission import Admission
from app.engine.errors import ComputeFailed, DeadlinePassed, QueueFull
from app.engine.messages import REQUEST_TIMING, Task, Timing
from app.engine.remote import Engine, EngineClient, EngineQueue, unpacked, wire_task
from app.engine.work_queue import WorkQueue
from app.engine.worker import Worker
from app.main import create_app
from app.metrics import Metrics
from app.settings import Settings
from bench.frontend import connections_held
from model import EmbeddingSpec, TextEncoder, tasks
from tests.helpers import (
    ROOT,
    assert_error,
    free_port,
    metric,
    server_log,
    standing_in,
    start_server,
    tiny_tokenizer,
    wait_until,
    wait_until_ready,
    write_tiny_model,
)

pytestmark = pytest.mark.slow

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # a long text: a slow inspection


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def started(pid: int) -> list[int]:
    """The engine and front ends that the supervisor ``pid`` started (not multiprocessing's resource tracker)."""
    spawned = []
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                spawned.append(child)
        except OSError:
            pass
    return spawned


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None where there is no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, started_at: int | None) -> bool:
    """Whether the process that was ``pid`` when it had ``started_at`` still runs: not where /proc/PID holds
    only its zombie (exited, waiting for init to reap it), nor where its PID has been given to a new process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and int(fields[19]) == started_at


def engine_pid(process: subprocess.Popen) -> int:
    match = re.search(r"one engine \(pid (\d+)\)", server_log(process))
    assert match, server_log(process)
    return int(match.group(1))


def front_ends(process: subprocess.Popen) -> list[int]:
    """The front-end processes: the supervisor's children but the engine and multiprocessing's resource tracker."""
    engine = engine_pid(process)
    return [
        pid
        for pid in children(process.pid)
        if pid != engine and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("processes")
    # Products 16 columns wide (the tiny model's width) give other bits on one thread than on two even in MKL's strict
    # mode (docs/operations.md, "The same numbers"); a lane's thread count follows the timing, and these services are
    # compared bit for bit: twice the width.
    tiny = write_tiny_model(root / "tiny", hidden_size=32, intermediate_size=64)
    ce = write_tiny_model(
        root / "ce", head="sequence-classification", num_labels=1, hidden_size=32, intermediate_size=64
    )
    return f"tiny={tiny},ce={ce}"


@pytest.fixture
def service(models: str) -> Iterator[tuple[subprocess.Popen, str]]:
    with supervised({"ENCODER_MODELS": models, "ENCODER_WORKERS": "2", "ENCODER_MAX_QUEUE_TEXTS": "100000"}) as running:
        yield running


@contextmanager
def supervised(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m app.serve`` for the block, then stopped; no process it started is left behind."""
    process, url = start_server(env, supervised=True)
    started = children(process.pid)
    try:
        yield process, url
    finally:
        started += children(process.pid)  # a front end started again meanwhile
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # it stops its front ends and its engine
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
        for pid in started:  # none is left behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


REQUESTS = [
    ("/encode", {"texts": ["the cat sat on the mat", "a lazy dog"], "model": "tiny"}),
    ("/v1/embeddings", {"input": ["the cat sat"], "model": "tiny"}),
    ("/attention", {"text": "the cat sat", "model": "tiny", "layers": [-1]}),
    ("/attention", {"text": LONG, "model": "tiny"}),  # every layer of a long text: an answer read into its own buffer
    ("/attention/neuron", {"text": "the cat sat", "model": "tiny", "layer": 0, "head": 1}),
    ("/attention/heads", {"texts": ["the cat sat", "a lazy dog"], "model": "tiny"}),
    ("/similarity", {"source": "a cat", "texts": ["a dog", "the mat"], "model": "tiny", "explain": True}),
    ("/rerank", {"query": "a cat", "documents": ["a dog", "the mat"], "model": "ce"}),
    ("/classify", {"texts": ["a cat"], "model": "ce"}),
    ("/explain", {"text": "a cat", "text_pair": "a dog on the mat", "model": "ce", "steps": 8}),
    ("/rerank", {"query": "a cat", "documents": ["a dog", "the mat", "a cat sat"], "model": "ce", "explain": True}),
    ("/tokenize", {"texts": ["a cat"], "model": "tiny"}),
    ("/encode", {"texts": [""], "model": "tiny"}),  # 422
    ("/rerank", {"query": "a cat", "documents": ["a dog"], "model": "tiny"}),  # 422: no head
    ("/encode", {"texts": ["x"], "model": "absent"}),  # 404
]


async def test_front_ends_answer_every_endpoint_as_one_process_does(
    service: tuple[subprocess.Popen, str], models: str
) -> None:
    _, url = service
    app = create_app(Settings(models=models, max_queue_texts=100000, dtype="float32"))  # as the service runs
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://one") as one,
            httpx.AsyncClient(base_url=url, timeout=30) as split,
        ):
            await wait_until_ready(one)
            for path, body in REQUESTS:
                expected, got = await one.post(path, json=body), await split.post(path, json=body)
                assert got.status_code == expected.status_code, (path, got.text)
                assert got.json() == expected.json(), path
            for path in ("/info?model=ce", "/positional-encoding?kind=learned&length=4"):
                expected, got = await one.get(path), await split.get(path)
                assert (got.status_code, got.json()) == (expected.status_code, expected.json()), path
            listed = [{**m, "created": 0} for m in (await split.get("/v1/models")).json()["data"]]
            assert listed == [{**m, "created": 0} for m in (await one.get("/v1/models")).json()["data"]]


def test_a_front_end_that_dies_is_replaced_while_the_others_serve(service: tuple[subprocess.Popen, str]) -> None:
    process, url = service
    before = front_ends(process)
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    statuses = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # served throughout by the other, then by both
        statuses.append(httpx.post(f"{url}/encode", json={"texts": ["a text"], "model": "tiny"}).status_code)
    assert set(statuses) == {200}
    after = front_ends(process)
    assert len(after) == 2 and before[0] not in after and before[1] in after
    assert all(JEMALLOC in mapped(pid) for pid in after)  # the new one allocates as the others do
    assert "front end 0 exited (status -9): starting another" in server_log(process) or "front end 1 exited" in (
        server_log(process)
    )


JEMALLOC = "libjemalloc.so.2"


def mapped(pid: int) -> str:
    """The files a process has mapped (its shared libraries among them)."""
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_front_ends_allocate_with_jemalloc_and_the_engine_with_the_c_librarys(
    service: tuple[subprocess.Popen, str], models: str
) -> None:
    """ENCODER_FRONT_END_ALLOCATOR=auto where libjemalloc2 is installed (the Makefile's test target installs it):
    the front ends start with it preloaded, the engine with glibc's malloc, bounded and trimmed; glibc: none does."""
    from app.allocator import front_end_allocator

    library = front_end_allocator("auto")
    assert library is not None, "libjemalloc2 is not installed (make test installs it)"
    process, url = service
    assert all(library in mapped(pid) for pid in front_ends(process))
    assert JEMALLOC not in mapped(engine_pid(process)) and JEMALLOC not in mapped(process.pid)
    assert f"2 front ends starting (allocating with {library})" in server_log(process)
    assert httpx.post(f"{url}/encode", json={"texts": ["a text"], "model": "tiny"}).status_code == 200
    with supervised({"ENCODER_MODELS": models, "ENCODER_WORKERS": "2", "ENCODER_FRONT_END_ALLOCATOR": "glibc"}) as (
        plain,
        plain_url,
    ):
        assert [JEMALLOC in mapped(pid) for pid in (plain.pid, engine_pid(plain), *front_ends(plain))] == [False] * 4
        assert "2 front ends starting (allocating with the C library's malloc)" in server_log(plain)
        assert httpx.post(f"{plain_url}/encode", json={"texts": ["a text"], "model": "tiny"}).status_code == 200


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_the_front_ends_tokenize_on_their_own_thread_unless_the_operator_says_otherwise(models: str) -> None:
    """A front end's tokenizer calls run on the thread that makes them: the tokenizers library's pool (its threads
    started on its first spread call) never starts. With TOKENIZERS_PARALLELISM=true set by the operator it does,
    and the vectors are the same either way."""
    answers = []
    for setting in (None, "true"):
        env = {"ENCODER_MODELS": models, "ENCODER_WORKERS": "2"}
        if setting is not None:
            env["TOKENIZERS_PARALLELISM"] = setting
        with supervised(env) as (process, url):
            fronts = front_ends(process)
            before = [threads(pid) for pid in fronts]
            for index in range(16):  # a connection each: both front ends take some
                texts = [f"the cat sat on mat number {index}", "a lazy dog", "über naïve café"] * 4
                response = httpx.post(f"{url}/encode", json={"texts": texts, "model": "tiny"})
                assert response.status_code == 200, response.text
                answers.append(response.json()["data"])
            grown = [threads(pid) - count for pid, count in zip(fronts, before, strict=True)]
        if setting is None:
            assert grown == [0, 0], grown
        else:
            assert max(grown) >= 1, grown  # the library's pool: the check sees it where it starts
    assert answers[:16] == answers[16:]


async def test_connections_opened_at_once_are_shared_evenly_by_the_front_ends(
    service: tuple[subprocess.Popen, str],
) -> None:
    """A pool of keep-alive connections opened together, as a client's pool is: each front end gets its share, not
    whichever front end woke first (left to that, 32 connections over 4 front ends went 32, 0, 0, 0, and 16 over 2
    went 16, 0). Again once the first pool is closed."""
    process, url = service
    port = int(url.rsplit(":", 1)[1])
    for _ in range(2):
        clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(8)]
        try:
            responses = await asyncio.gather(*(client.get("/health") for client in clients))
            assert all(response.status_code == 200 for response in responses)
            assert sorted(connections_held(pid, port) for pid in front_ends(process)) == [4, 4]
        finally:
            for client in clients:
                await client.aclose()


async def test_a_front_end_that_holds_fewer_connections_but_does_not_run_does_not_hold_up_new_ones(
    service: tuple[subprocess.Popen, str],
) -> None:
    """The rule leaves a waiting connection to the front end that holds fewer; when that one does not take it (here
    stopped by SIGSTOP, as a front end busy for long would be), the other takes it after a short wait."""
    process, url = service
    stopped = front_ends(process)[0]
    os.kill(stopped, signal.SIGSTOP)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as kept:
            # taken by the front end that runs (both held none): it now holds one more than the stopped one
            assert (await kept.get("/health")).status_code == 200
            for _ in range(5):  # each on a connection of its own
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    response = await client.post("/encode", json={"texts": ["a text"], "model": "tiny"})
                assert response.status_code == 200
    finally:
        os.kill(stopped, signal.SIGCONT)


async def test_when_the_engine_dies_waiting_requests_get_503_and_the_service_exits_non_zero(
    service: tuple[subprocess.Popen, str],
) -> None:
    process, url = service
    body = {"texts": [LONG] * 256, "model": "tiny"}  # head statistics: the engine is busy with them for seconds
    # The service's deadline (ENCODER_REQUEST_TIMEOUT_S, 60 s by default) is past this client's 30 s: a request left
    # waiting for it would end in the client's timeout, an exception here, not in a response.
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        requests = [asyncio.ensure_future(client.post("/attention/heads", json=body)) for _ in range(16)]
        await every_one_admitted(client, requests)  # sent, and waiting for the engine
        assert not all(request.done() for request in requests)
        os.kill(engine_pid(process), signal.SIGKILL)
        responses = await asyncio.gather(*requests, return_exceptions=True)
    answered = [r for r in responses if isinstance(r, httpx.Response)]
    assert len(answered) == len(responses), "none waited for its deadline: " + repr(responses)
    failed = [r for r in answered if r.status_code != 200]
    assert failed, "some requests were still waiting for the engine"
    for response in failed:
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "not_ready"
    assert process.wait(30) == 1
    assert "the engine exited (status -9)" in server_log(process)


async def every_one_admitted(client: httpx.AsyncClient, requests: Sequence[asyncio.Future]) -> None:
    """Until the service has admitted every request not answered yet (encoder_admitted_texts, where an inspection
    request counts one): then each is in flight, not still on its way in."""
    deadline = time.monotonic() + 30
    admitted = 0.0
    while time.monotonic() < deadline:
        metrics = (await client.get("/metrics")).text
        found = re.search(r"^encoder_admitted_texts (\S+)$", metrics, re.MULTILINE)
        assert found is not None, "no encoder_admitted_texts in /metrics"
        admitted = float(found.group(1))
        if admitted + sum(request.done() for request in requests) >= len(requests):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the service admitted {admitted:.0f} of {len(requests)} requests in 30 s")


@pytest.mark.parametrize("to", ["supervisor", "every process"])
async def test_sigterm_answers_what_is_in_flight_then_every_process_exits_zero(
    service: tuple[subprocess.Popen, str], to: str
) -> None:
    """Sent to the supervisor (as Kubernetes and Docker send it) or to every process at once (as a terminal sends
    Ctrl-C to its whole process group): the request in flight is answered either way."""
    process, url = service
    processes = children(process.pid)
    body = {"texts": [LONG] * 16, "model": "tiny"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        requests = [asyncio.ensure_future(client.post("/attention/heads", json=body)) for _ in range(48)]
        await every_one_admitted(client, requests)
        assert not all(request.done() for request in requests), "nothing was in flight"
        for pid in [process.pid, *(started(process.pid) if to == "every process" else [])]:
            os.kill(pid, signal.SIGTERM)
        responses = await asyncio.gather(*requests)
    assert [response.status_code for response in responses] == [200] * 48
    assert process.wait(60) == 0
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in processes), "a child outlived the supervisor"


def test_the_service_leaves_nothing_in_the_temporary_directory(models: str, tmp_path: Path) -> None:
    """The engine's socket and the front ends' metrics files live in temporary directories of their own: gone
    once the service has stopped."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with supervised({"ENCODER_MODELS": models, "ENCODER_WORKERS": "2", "TMPDIR": str(scratch)}) as (process, url):
        assert httpx.post(f"{url}/encode", json={"texts": ["a"], "model": "tiny"}, timeout=30).status_code == 200
        made = sorted(path.name.rsplit("-", 1)[0] for path in scratch.iterdir())
        assert made == ["encoder-engine", "encoder-metrics"], made  # the test looks where the service writes
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    assert list(scratch.iterdir()) == []


class Blocking:
    """Embedding passes that wait for ``release`` (``standing_in``)."""

    def __init__(self) -> None:
        self.release, self.computing, self.embed = threading.Event(), threading.Event(), tasks.embed_texts

    def embed_texts(self, model, encodings, specs):
        self.computing.set()
        assert self.release.wait(30)
        return self.embed(model, encodings, specs)


class OneModel:
    """A registry of one model for the engine: its name, queue and facts."""

    def __init__(self, queue: WorkQueue) -> None:
        self.served = SimpleNamespace(name="tiny", queue=queue, facts=None)

    def get(self, name: str | None = None) -> SimpleNamespace:
        return self.served

    def __iter__(self) -> Iterator[SimpleNamespace]:
        return iter([self.served])


async def test_a_message_the_engine_cannot_take_fails_alone_and_the_connection_serves_on(
    tmp_path: Path, tiny_model: TextEncoder
) -> None:
    queue = WorkQueue()
    worker = Worker(queue, tiny_model)
    server = await Engine(OneModel(queue), Admission(100, lambda: None, Metrics()), Metrics()).serve(
        str(tmp_path / "engine.sock")
    )
    client = EngineClient(str(tmp_path / "engine.sock"))
    try:
        await client.start()
        with pytest.raises(ComputeFailed):
            await client.request("task", "tiny")  # a task message without its task: the engine cannot run it
        spec = EmbeddingSpec(layer=2, pooling="mean", normalize=True)
        task = Task("embed", tiny_model.card.tokenizer.encode(["still served"]), spec)
        (result, _) = await client.request("task", "tiny", wire_task(task), 30.0)
        (embedding,) = unpacked(result)  # the sentence vectors cross in one array (EmbeddedRows)
        np.testing.assert_allclose(embedding.sentence, tiny_model.embed(["still served"]).numpy()[0], atol=1e-5)
        assert client.connected
    finally:
        await client.close()
        server.close()
        worker.stop()


async def test_a_task_sent_to_the_engine_carries_the_time_its_request_has_left(tiny_model: TextEncoder) -> None:
    """The engine drops what is still queued once a request's time is up: a front end sends it the seconds its
    request has left (the Responder's deadline, in its Timing), not the whole timeout; given none, the request's own
    (``REQUEST_TIMING``, as the responder sets it), to which the engine's queue and pass times are added."""
    sent: list[tuple] = []

    class Recording:
        async def request(self, *message: object) -> list:
            sent.append(message)
            return [["done"], (0.25, 0.5)]

    queue = EngineQueue(Recording(), "tiny", SimpleNamespace(max_batch_tokens=512), 30.0)  # type: ignore[arg-type]
    spec = EmbeddingSpec(layer=2, pooling="mean", normalize=True)
    task = Task("embed", tiny_model.card.tokenizer.encode(["a text"]), spec)
    now = asyncio.get_running_loop().time()
    for timing in (Timing(deadline=now + 2.0), Timing(deadline=now - 1.0), Timing(), None):
        assert await queue.run(task, timing) == ["done"]
    left = [message[-1] for message in sent]
    assert 1.5 < left[0] <= 2.0 and left[1:] == [0.0, 30.0, 30.0], left
    assert [message[:2] for message in sent] == [("task", "tiny")] * 4
    # ``submit`` (the Runner's way to answer from a callback) queues the same task at once, its future run's value
    submitted = queue.submit(task, Timing(deadline=now + 2.0))
    assert isinstance(submitted, asyncio.Future) and await submitted == ["done"]
    assert sent[-1][:2] == ("task", "tiny") and 1.5 < sent[-1][-1] <= 2.0
    request = Timing(deadline=now + 3.0)
    current = REQUEST_TIMING.set(request)
    try:
        assert await queue.run(task) == ["done"] and await queue.run_in_turn([task]) == ["done"]
    finally:
        REQUEST_TIMING.reset(current)
    assert all(2.5 < message[-1] <= 3.0 for message in sent[-2:]), sent[-2:]
    assert (request.queue_s, request.inference_s) == (0.5, 1.0)


async def test_the_engine_admits_every_front_ends_tasks_against_one_bound(
    tmp_path: Path, tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two front ends' connections to one engine, a bound of 4 texts: 3 texts computing through one connection,
    2 more through the other are refused (429 overloaded), 1 more is admitted; each front end alone would have
    admitted them."""
    blocking = Blocking()
    standing_in(blocking, monkeypatch)
    queue = WorkQueue()
    worker = Worker(queue, tiny_model)
    metrics = Metrics()
    admission = Admission(4, lambda: None, metrics)
    server = await Engine(OneModel(queue), admission, Metrics()).serve(str(tmp_path / "engine.sock"))
    first, second = EngineClient(str(tmp_path / "engine.sock")), EngineClient(str(tmp_path / "engine.sock"))
    try:
        await first.start()
        await second.start()
        spec = EmbeddingSpec(layer=2, pooling="mean", normalize=True)

        def task(n: int) -> Task:
            return Task("embed", tiny_model.card.tokenizer.encode(["a text"] * n), spec)

        held = asyncio.ensure_future(first.request("task", "tiny", wire_task(task(3)), 30.0))
        assert await asyncio.to_thread(blocking.computing.wait, 30)  # admitted, and computing
        with pytest.raises(QueueFull):
            await second.request("task", "tiny", wire_task(task(2)), 30.0)
        admitted = asyncio.ensure_future(second.request("task", "tiny", wire_task(task(1)), 30.0))
        # the one text admitted beside the three, as /metrics says
        await wait_until(lambda: metrics.registry.get_sample_value("encoder_admitted_texts") == 4)
        blocking.release.set()
        (three, _), (one, _) = await held, await admitted
        assert (len(unpacked(three)), len(unpacked(one))) == (3, 1)
    finally:
        blocking.release.set()
        await first.close()
        await second.close()
        server.close()
        worker.stop()


async def test_the_engine_answers_a_task_out_of_time_and_drops_cancelled_and_orphaned_ones_uncomputed(
    tmp_path: Path, tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a pass that holds the lane: a task whose request's time runs out in the engine is answered
    DeadlinePassed; one its front end cancels, and those of a front end whose connection closes, are dropped. None of
    their texts is computed, each is counted out of the admission bound at once, and the connections serve on."""
    blocking = Blocking()
    standing_in(blocking, monkeypatch)
    queue = WorkQueue()
    worker = Worker(queue, tiny_model)
    admission = Admission(100, lambda: None, Metrics())
    path = str(tmp_path / "engine.sock")
    engine = Engine(OneModel(queue), admission, Metrics())
    server = await engine.serve(path)
    first, second, third = EngineClient(path), EngineClient(path), EngineClient(path)
    spec = EmbeddingSpec(layer=2, pooling="mean", normalize=True)

    def task(n: int) -> Task:
        return wire_task(Task("embed", tiny_model.card.tokenizer.encode([f"text {i}" for i in range(n)]), spec))

    waiting: list[asyncio.Future] = []
    try:
        for client in (first, second, third):
            await client.start()
        held = asyncio.ensure_future(first.request("task", "tiny", task(3), 30.0))
        assert await asyncio.to_thread(blocking.computing.wait, 30)
        with pytest.raises(DeadlinePassed):
            async with asyncio.timeout(10):  # (not answered at all: a TimeoutError fails the test)
                await second.request("task", "tiny", task(2), 0.2)  # its request's time runs out in the queue
        assert admission.admitted == 3
        cancelled = asyncio.ensure_future(second.request("task", "tiny", task(5), 30.0))
        orphaned = asyncio.ensure_future(third.request("task", "tiny", task(7), 30.0))
        waiting += [cancelled, orphaned]
        await wait_until(lambda: admission.admitted == 15)
        cancelled.cancel()  # the front end tells the engine
        await wait_until(lambda: admission.admitted == 10)
        await third.close()  # its front end gone with a task queued
        await wait_until(lambda: admission.admitted == 3)
        blocking.release.set()
        (three, _) = await held
        (one, _) = await second.request("task", "tiny", task(1), 30.0)
        assert (len(unpacked(three)), len(unpacked(one))) == (3, 1)
        assert (worker.stats.texts, queue.dropped, admission.admitted) == (4, 2 + 5 + 7, 0)
        assert not any(connection.running for connection in engine.connections)  # none kept once answered or gone
    finally:
        blocking.release.set()
        for future in waiting:
            future.cancel()
        for client in (first, second, third):
            await client.close()
        server.close()
        worker.stop()


async def test_metrics_are_one_view_whichever_front_end_answers(service: tuple[subprocess.Popen, str]) -> None:
    """Requests spread over both front ends are counted once each, in the /metrics of either; the passes, from
    the engine, are there too."""
    _, url = service
    clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(6)]  # the kernel spreads the connections
    try:
        for _ in range(5):
            responses = await asyncio.gather(
                *(client.post("/encode", json={"texts": ["a text"], "model": "tiny"}) for client in clients)
            )
            assert all(response.status_code == 200 for response in responses)
        views = [(await client.get("/metrics")).text for client in clients]
    finally:
        for client in clients:
            await client.aclose()
    for view in views:
        counted = re.search(r'^encoder_requests_total\{method="POST",route="/encode",status="200"\} (\S+)$', view, re.M)
        assert counted and float(counted.group(1)) == 30, view[:2000]
        passes = re.search(r"^encoder_batch_texts_sum (\S+)$", view, re.M)
        assert passes and float(passes.group(1)) >= 30  # and the warm-up's
        assert "encoder_model_info{" in view and 'name="tiny"' in view
        families = re.findall(r"^# TYPE (\S+) ", view, re.M)  # one family a name, as Prometheus' format requires
        assert len(families) == len(set(families)) and "encoder_requests_total" in families, families


async def test_bad_input_through_one_front_end_harms_no_request_through_another(
    service: tuple[subprocess.Popen, str],
) -> None:
    """Good requests and bad ones (a lone surrogate, a text too long with truncate false, a token id outside the
    vocabulary) sent at once over connections that the two front ends share: each bad one gets its own 422, every
    good one its own answer, equal to what it gets alone."""
    _, url = service
    good = [f"good request number {i}" for i in range(24)]
    bad = [
        ("/encode", json.dumps({"texts": ["fine", "broken \ud800 text"], "model": "tiny"}), "texts[1]"),
        ("/encode", json.dumps({"texts": ["word " * 300], "truncate": False, "model": "tiny"}), "texts[0]"),
        ("/v1/embeddings", json.dumps({"input": [[1, 2, 10**6]], "model": "tiny"}), "input[0][2]"),
    ]
    clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(8)]
    try:
        expected = [(await clients[0].post("/encode", json={"texts": text, "model": "tiny"})).json() for text in good]
        for _ in range(3):
            sends = [
                clients[i % len(clients)].post("/encode", json={"texts": text, "model": "tiny"})
                for i, text in enumerate(good)
            ]
            for k, (path, body, _) in enumerate(bad):
                headers = {"content-type": "application/json"}
                sends.insert(6 * k + 3, clients[(6 * k + 3) % len(clients)].post(path, content=body, headers=headers))
            responses = await asyncio.gather(*sends)
            for k, (_, _, param) in enumerate(bad):
                refused = responses.pop(6 * k + 3 - k)
                assert refused.status_code == 422 and refused.json()["error"]["param"] == param, refused.text
            for response, want in zip(responses, expected, strict=True):
                assert response.status_code == 200, response.text
                assert response.json()["data"][0]["embedding"] == pytest.approx(want["data"][0]["embedding"], abs=1e-5)
    finally:
        for client in clients:
            await client.aclose()


@dataclass
class Faults:
    """tests/hooks/sitecustomize.py's controls: a pass holding "!" is held until ``release``."""

    held: Path  # created by the held pass once it computes
    release: Path  # created by the test to end it

    def env(self, models: str, **env: str) -> dict[str, str]:
        """The service's settings with the hook on its path: in the engine, a pass holding the token "?" raises and
        one holding "!" is held. One compute lane, so that what queues behind the held pass is one pass; long
        keep-alives, so that a pinned client keeps its connection (pinned_clients)."""
        tokenizer = tiny_tokenizer()
        path = [str(ROOT / "tests" / "hooks"), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {
            "ENCODER_MODELS": models,
            "ENCODER_WORKERS": "2",
            "ENCODER_COMPUTE_LANES": "1",
            "UVICORN_TIMEOUT_KEEP_ALIVE": "300",
            "PYTHONPATH": os.pathsep.join(path),
            "TEST_POISON_ID": str(tokenizer.token_to_id("?")),
            "TEST_SLOW_ID": str(tokenizer.token_to_id("!")),
            "TEST_HELD": str(self.held),
            "TEST_RELEASE": str(self.release),
            **env,
        }


@pytest.fixture
def faults(tmp_path: Path) -> Iterator[Faults]:
    controls = Faults(tmp_path / "held", tmp_path / "release")
    try:
        yield controls
    finally:
        controls.release.touch()  # whatever happened, nothing stays held


def connections(pids: list[int], port: int) -> dict[int, set[int]]:
    """The established TCP connections to ``port`` that each process holds, as socket inodes (Linux /proc)."""
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established.add(int(fields[9]))
    held: dict[int, set[int]] = {}
    for pid in pids:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[len("socket:[") : -1]))
        held[pid] = inodes & established
    return held


@dataclass
class Pinned:
    """A client of one keep-alive connection, and the front end (pid) and socket (inode) that hold it."""

    client: httpx.AsyncClient
    pid: int
    inode: int


async def pinned_clients(
    process: subprocess.Popen, url: str, each: int, opened: list[httpx.AsyncClient]
) -> list[list[Pinned]]:
    """For each front end, ``each`` clients whose one connection it holds: opened one at a time, each placed by the
    connection that appeared (``opened`` collects every client, for closing)."""
    port, pids = int(url.rsplit(":", 1)[1]), front_ends(process)
    pinned: dict[int, list[Pinned]] = {pid: [] for pid in pids}
    while any(len(clients) < each for clients in pinned.values()):
        assert len(opened) < 200, {pid: len(clients) for pid, clients in pinned.items()}
        before = connections(pids, port)
        client = httpx.AsyncClient(  # idle connections kept as long as the service keeps them (httpx: 5 s)
            base_url=url, timeout=30, limits=httpx.Limits(max_connections=1, keepalive_expiry=300)
        )
        opened.append(client)
        assert (await client.get("/health")).status_code == 200
        after = connections(pids, port)
        ((pid, inode),) = [(pid, inode) for pid in pids for inode in after[pid] - before[pid]]
        if len(pinned[pid]) < each:
            pinned[pid].append(Pinned(client, pid, inode))
    return list(pinned.values())


def assert_still_pinned(process: subprocess.Popen, url: str, pinned: list[Pinned]) -> None:
    """Every one of these clients still talks to its front end over the connection it was pinned by."""
    held = connections(front_ends(process), int(url.rsplit(":", 1)[1]))
    assert all(p.inode in held[p.pid] for p in pinned), "a pinned client reconnected"


async def test_a_pass_that_fails_in_the_engine_fails_only_the_requests_that_broke_it(
    models: str, faults: Faults
) -> None:
    """Requests through both front ends, each on a connection of its own, queue behind a held pass, then share one
    pass with two (one through each front end) whose text breaks it: the engine retries each request alone; those
    two get the 503 envelope, every other its own answer. While they wait, /metrics counts them as queued."""
    with supervised(faults.env(models)) as (process, url):
        opened: list[httpx.AsyncClient] = []
        try:
            first, second = await pinned_clients(process, url, 8, opened)
            good = [f"good request number {i}" for i in range(12)]
            expected = []
            for text in good:
                response = await first[0].client.post("/encode", json={"texts": [text], "model": "tiny"})
                expected.append(response.json()["data"][0]["embedding"])
            held = asyncio.ensure_future(
                first[0].client.post("/encode", json={"texts": ["hold on !"], "model": "tiny"})
            )
            await wait_until(faults.held.exists)
            senders = [*first[1:6], *second[:7]]  # one request each: a client of one connection sends one at a time
            bad = {"texts": ["is this poisoned ?"], "model": "tiny"}
            sent = asyncio.gather(
                *(p.client.post("/encode", json={"texts": [text], "model": "tiny"}) for p, text in zip(senders, good)),
                first[6].client.post("/encode", json=bad),
                second[7].client.post("/encode", json=bad),
            )
            watcher = httpx.AsyncClient(base_url=url, timeout=30)  # through either front end: one view
            opened.append(watcher)
            queued, deadline = 0.0, time.monotonic() + 20
            while queued < len(good) + 2:
                assert not sent.done() and time.monotonic() < deadline, f"{queued} texts queued"
                queued = metric((await watcher.get("/metrics")).text, "encoder_queue_texts", 0.0)
                await asyncio.sleep(0.02)
            faults.release.touch()
            responses = await sent
            assert (await held).status_code == 200
            assert_still_pinned(process, url, [*senders, first[6], second[7]])
            log = server_log(process)
            assert "a pass of 14 texts from 14 requests failed" in log, log  # all of them queued behind the held one
            for response, want in zip(responses, expected):
                assert response.status_code == 200, response.text
                assert response.json()["data"][0]["embedding"] == pytest.approx(want, abs=1e-5)
            for response in responses[len(good) :]:
                assert_error(response, 503, "inference_failed")
            assert (
                await second[1].client.post("/encode", json={"texts": [good[0]], "model": "tiny"})
            ).status_code == 200
        finally:
            for client in opened:
                await client.aclose()


async def test_the_overload_bound_holds_for_the_whole_service_not_for_each_front_end(
    models: str, faults: Faults
) -> None:
    """A bound of 4 texts, 3 of them in a held pass sent through one front end: of 6 one-text requests sent at
    once, 3 through each front end, 5 get 429 and one is admitted. A bound for each front end would admit 4."""
    with supervised(faults.env(models, ENCODER_MAX_QUEUE_TEXTS="4")) as (process, url):
        opened: list[httpx.AsyncClient] = []
        try:
            first, second = await pinned_clients(process, url, 4, opened)
            three = {"texts": ["hold on !", "hold on !", "hold on !"], "model": "tiny"}
            held = asyncio.ensure_future(first[0].client.post("/encode", json=three))
            await wait_until(faults.held.exists)  # admitted, and computing
            one = {"texts": ["one more text"], "model": "tiny"}
            senders = [*first[1:], *second[:3]]
            sent = [asyncio.ensure_future(p.client.post("/encode", json=one)) for p in senders]
            await wait_until(lambda: sum(send.done() for send in sent) >= 5)
            faults.release.touch()
            responses = await asyncio.gather(*sent)
            assert (await held).status_code == 200
            assert_still_pinned(process, url, senders)
            admitted = [response for response in responses if response.status_code == 200]
            assert len(admitted) == 1, [response.status_code for response in responses]
            for response in responses:
                if response.status_code != 200:
                    assert_error(response, 429, "overloaded")
        finally:
            for client in opened:
                await client.aclose()


def test_front_ends_never_load_torch(service: tuple[subprocess.Popen, str]) -> None:
    """A front end reads cards and sends the work on: after a request to every endpoint through each, none has
    torch's library in its memory (a front end that imported it held about 180 MiB more)."""
    process, url = service
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(4):  # over fresh connections: the kernel spreads them over both front ends
            for path, body in REQUESTS:
                client.post(path, json=body, headers={"Connection": "close"})
            client.get("/positional-encoding?kind=learned&length=4", headers={"Connection": "close"})
    fronts = [pid for pid in started(process.pid) if Path(f"/proc/{pid}/comm").read_text().strip() == "encoder-front"]
    assert len(fronts) == 2
    engine = [pid for pid in started(process.pid) if pid not in fronts]
    assert "libtorch" in Path(f"/proc/{engine[0]}/maps").read_text()  # where it is, the check sees it
    for pid in fronts:
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), f"front end {pid} loaded torch"


def test_ps_tells_the_engine_from_the_front_ends(service: tuple[subprocess.Popen, str]) -> None:
    process, _ = service

    def names() -> list[str]:
        return sorted(Path(f"/proc/{pid}/comm").read_text().strip() for pid in started(process.pid))

    deadline = time.monotonic() + 60  # each names itself first thing, the second front end maybe still starting
    while names() != ["encoder-engine", "encoder-front", "encoder-front"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert names() == ["encoder-engine", "encoder-front", "encoder-front"]


def test_no_process_outlives_a_supervisor_that_is_killed(service: tuple[subprocess.Popen, str]) -> None:
    process, url = service
    spawned = {pid: start_time(pid) for pid in started(process.pid)}
    assert len(spawned) == 3  # the engine and two front ends
    process.kill()
    process.wait(30)
    deadline = time.monotonic() + 40
    while any(alive(pid, at) for pid, at in spawned.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid, at in spawned.items() if alive(pid, at)]
    assert not left, f"an engine or front end outlived the supervisor: {left}\n{server_log(process)[-3000:]}"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.mark.parametrize("delay", [0.4, 0.9, 1.4])
def test_no_process_outlives_a_supervisor_killed_while_they_start(models: str, delay: float) -> None:
    """Killed as its front ends start, before they have imported what they need, the supervisor leaves nothing
    behind either: a child that asked for its parent's pid only then would find its new parent already. (Here a
    front end took about a second to reach that point; the delays span it.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu", "ENCODER_MODELS": models}
    env |= {"ENCODER_WORKERS": "2"}
    command = [sys.executable, "-m", "app.serve", "--port", str(free_port())]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(spawned := started(process.pid)) < 3 and time.monotonic() < deadline:  # the engine is ready
        time.sleep(0.001)
    born = {pid: start_time(pid) for pid in spawned}
    time.sleep(delay)
    process.kill()
    process.wait(30)
    assert len(spawned) == 3, "the supervisor started no front ends"
    deadline = time.monotonic() + 45
    while any(alive(pid, at) for pid, at in born.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid, at in born.items() if alive(pid, at)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "an engine or front end outlived a supervisor killed while they started"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_image_command_listens_and_keeps_alive_as_the_uvicorn_variables_say(models: str, workers: str) -> None:
    """``python -m app.serve`` with no arguments, as the image runs it: UVICORN_HOST, UVICORN_PORT and
    UVICORN_TIMEOUT_KEEP_ALIVE as uvicorn's command line reads them, one process or front ends around an engine."""
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ENCODER_DEVICE": "cpu",
        "ENCODER_MODELS": models,
        "ENCODER_WORKERS": workers,
        "UVICORN_HOST": "127.0.0.1",
        "UVICORN_PORT": str(port),
        "UVICORN_TIMEOUT_KEEP_ALIVE": "1",
    }
    process = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the service did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b" 200 " in connection.recv(4096)
            time.sleep(0.3)  # idle, within the keep-alive: the connection still serves
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b" 200 " in connection.recv(4096)
            connection.settimeout(3)  # uvicorn's default of 5 s would end in socket.timeout here
            assert connection.recv(4096) == b""  # the server closed the idle connection after its keep-alive of 1 s
    finally:
        process.terminate()
        assert process.wait(60) == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_stops_the_start_in_one_line_before_anything_loads(models: str, workers: str) -> None:
    """Another process listens on the port: one line on stderr saying so, exit status 3, and no model loaded
    nor "ready" logged (it had said ready after uvicorn's bind error)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu", "ENCODER_MODELS": models}
        env |= {"ENCODER_WORKERS": workers, "ENCODER_RUNTIME": "torch"}
        command = [sys.executable, "-m", "app.serve", "--port", str(port)]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use; another process listens there: stop it, or "
        "choose another --port"
    ), result.stderr
    said = result.stderr + result.stdout
    assert "ready:" not in said and "loaded " not in said and len(lines) == 1, said
