"""Failover through a real load balancer: two service processes behind Debian's nginx, configured from
deploy/nginx/, under a steady load of POST /encode (127.0.0.1 only, bounded in time).

One replica is killed with SIGKILL mid-load; then, on a fresh pair, each replica in turn is stopped with
SIGTERM and started again. Every request must still get its right answer: the failures are counted and
must be zero. The figures (requests, failures, retries, p99 during the fault) are printed; run

    .venv/bin/python -m pytest tests/deploy/test_failover.py -s

to see them (docs/operations.md's "Deploying" section quotes them).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.settings import Settings
from model import TextEncoder
from tests.helpers import ROOT, TINY_WORDS, assert_error, free_port, server_log, start_server

pytestmark = pytest.mark.slow  # starts server processes and nginx

NGINX_DIR = ROOT / "deploy" / "nginx"
API_KEY = "failover-test-key"
CLIENTS = 8  # concurrent connections to nginx, each sending its next request as soon as one is answered
FAULT_WINDOW_S = 5.0  # after a SIGKILL, the seconds whose requests count as "during the fault"
TEXTS = [" ".join(TINY_WORDS[i % 7 :: 1 + i % 5][: 3 + i % 11]) + f" {chr(97 + i % 26)}" for i in range(64)]


def nginx_binary() -> str:
    found = os.environ.get("NGINX") or shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    assert found, "nginx is missing: make test installs it with apt (Debian's nginx package)"
    return found


# ---- the replicas and the load balancer ----


@dataclass
class Replica:
    """One service process on a fixed port, which it keeps when started again."""

    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process, _ = start_server(self.env, timeout=60, port=self.port)

    def stop(self) -> None:
        """Teardown: whatever state it is in, it is gone afterwards."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def served(self) -> int:
        """POST /encode requests this replica has answered 200, from its own /metrics."""
        total = 0.0
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            labels, _, value = line.partition("} ")
            if labels.startswith("encoder_requests_total{") and all(
                pair in labels for pair in ('route="/encode"', 'method="POST"', 'status="200"')
            ):
                total += float(value)
        return int(total)


class LoadBalancer:
    """nginx as a process of its own with deploy/nginx/'s configuration, in front of the given replicas.

    The configuration files are copied unchanged into a temporary prefix, except for two substitutions:
    the listening address (a free 127.0.0.1 port) and the replicas' addresses in encoder-upstreams.conf
    (the compose services' names become 127.0.0.1 ports; max_fails and fail_timeout stay as shipped).
    """

    def __init__(self, replicas: list[Replica], ready: bool = True) -> None:
        """Started, and with ``ready`` answering GET /health 200 through a replica (else any answer)."""
        self.prefix = Path(tempfile.mkdtemp(prefix="encoder-lb-"))
        self.prefix.chmod(0o755)  # nginx's workers run as nobody when the tests run as root
        (self.prefix / "temp").mkdir()
        shutil.copy(NGINX_DIR / "nginx.conf", self.prefix / "nginx.conf")
        self.port = free_port()
        server = (NGINX_DIR / "encoder.conf").read_text()
        assert server.count("listen 8080;") == 1
        (self.prefix / "encoder.conf").write_text(server.replace("listen 8080;", f"listen 127.0.0.1:{self.port};"))
        upstreams = (NGINX_DIR / "encoder-upstreams.conf").read_text()
        for name, replica in zip(("encoder-a", "encoder-b"), replicas, strict=True):
            assert upstreams.count(f"server {name}:8000 ") == 1
            upstreams = upstreams.replace(f"server {name}:8000 ", f"server 127.0.0.1:{replica.port} ")
        (self.prefix / "encoder-upstreams.conf").write_text(upstreams)
        self.access_log = self.prefix / "access.log"
        self.error_log = self.prefix / "error.log"
        with open(self.access_log, "wb") as out, open(self.error_log, "wb") as err:
            self.process = subprocess.Popen(
                [nginx_binary(), "-p", f"{self.prefix}/", "-c", str(self.prefix / "nginx.conf"), "-g", "daemon off;"],
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: the workers go with it in teardown
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while True:
            assert self.process.poll() is None, f"nginx exited: {self.error_log.read_text()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200 or not ready:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"nginx did not answer: {self.error_log.read_text()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # nginx's fast shutdown: the master stops its workers, then exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        shutil.rmtree(self.prefix, ignore_errors=True)

    def retried(self) -> list[str]:
        """Access-log lines of requests that nginx sent to more than one replica."""
        return [line for line in self.access_log.read_text().splitlines() if re.search(r"upstream=\S+, ", line)]


@pytest.fixture
def cluster(tiny_model_dir: Path) -> Iterator[tuple[list[Replica], LoadBalancer]]:
    """Two replicas of the service on the tiny model (one torch thread each: two share this machine's
    cores) and nginx in front; every process is gone after the test, however it ended."""
    env = {
        "ENCODER_MODEL_DIR": str(tiny_model_dir),
        "ENCODER_DEVICE": "cpu",
        "ENCODER_API_KEYS": API_KEY,
        "OMP_NUM_THREADS": "1",
    }
    replicas = [Replica(env), Replica(env)]
    balancer: LoadBalancer | None = None
    try:
        for replica in replicas:
            replica.start()
        balancer = LoadBalancer(replicas)
        yield replicas, balancer
    finally:
        if balancer is not None:
            balancer.stop()
        for replica in replicas:
            replica.stop()


# ---- the load ----


@dataclass
class Outcome:
    start: float
    end: float
    failure: str  # empty when the request got its right answer


async def steady_load(
    url: str, expected: np.ndarray, scenario: Callable[[], Awaitable[tuple[float, float]]]
) -> tuple[list[Outcome], tuple[float, float]]:
    """``CLIENTS`` connections send POST /encode (one to three texts) while ``scenario`` runs; returns every
    request's outcome and the scenario's fault window (monotonic start and end)."""
    outcomes: list[Outcome] = []
    stop = asyncio.Event()

    async def client(http: httpx.AsyncClient, first: int) -> None:
        n = first
        while not stop.is_set():
            texts = [TEXTS[(n + k) % len(TEXTS)] for k in range(1 + n % 3)]
            start = time.monotonic()
            failure = ""
            try:
                response = await http.post("/encode", json={"texts": texts})
                if response.status_code != 200:
                    failure = f"{response.status_code} {response.text[:200]}"
                else:
                    got = np.array([item["embedding"] for item in response.json()["data"]])
                    want = expected[[(n + k) % len(TEXTS) for k in range(len(texts))]]
                    if got.shape != want.shape or not np.allclose(got, want, atol=1e-5):
                        failure = "wrong embedding"
            except httpx.HTTPError as error:
                failure = repr(error)
            outcomes.append(Outcome(start, time.monotonic(), failure))
            n += CLIENTS

    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers, limits=limits) as http:
        clients = [asyncio.create_task(client(http, i)) for i in range(CLIENTS)]
        try:
            window = await scenario()
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*clients, return_exceptions=True), timeout=40)
    return outcomes, window


def report(name: str, outcomes: list[Outcome], window: tuple[float, float], retried: int) -> dict[str, float]:
    """The figures, printed on one line and returned: requests, failures, and latency in ms."""
    during = [o for o in outcomes if o.end >= window[0] and o.start <= window[1]]
    latency = np.array([o.end - o.start for o in outcomes]) * 1000
    latency_during = np.array([o.end - o.start for o in during]) * 1000
    figures = {
        "requests": len(outcomes),
        "failures": sum(bool(o.failure) for o in outcomes),
        "retried": retried,
        "during_fault": len(during),
        "fault_s": window[1] - window[0],
        "p50_ms": float(np.percentile(latency, 50)),
        "p99_ms": float(np.percentile(latency, 99)),
        "p99_during_fault_ms": float(np.percentile(latency_during, 99)),
        "max_during_fault_ms": float(latency_during.max()),
    }
    print(
        f"\n{name}: {figures['requests']} requests, {figures['failures']} failed; {retried} retried on the other "
        f"replica by nginx; during the fault ({figures['fault_s']:.1f} s, {figures['during_fault']} requests) "
        f"p99 {figures['p99_during_fault_ms']:.0f} ms, max {figures['max_during_fault_ms']:.0f} ms; "
        f"whole run p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms"
    )
    return figures


def failures_of(outcomes: list[Outcome]) -> list[str]:
    return [o.failure for o in outcomes if o.failure]


async def wait_until_serving(replica: Replica, timeout: float = 20.0) -> None:
    """Until nginx sends a freshly started replica requests (it skips one that failed for fail_timeout, 10 s)."""
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(replica.served) == 0:
        assert time.monotonic() < deadline, "nginx did not send requests to the restarted replica"
        await asyncio.sleep(0.2)


# ---- the tests ----


@pytest.mark.timeout(120)
def test_sigkill_of_one_replica_under_load_fails_no_request(
    cluster: tuple[list[Replica], LoadBalancer], tiny_model: TextEncoder
) -> None:
    replicas, balancer = cluster
    expected = tiny_model.embed(TEXTS).numpy()
    victim = replicas[0]

    async def scenario() -> tuple[float, float]:
        await asyncio.sleep(3)  # steady load on both replicas
        assert all(await asyncio.gather(*(asyncio.to_thread(r.served) for r in replicas))), "a replica got no load"
        assert victim.process is not None
        killed = time.monotonic()
        victim.process.kill()
        victim.process.wait(timeout=10)
        await asyncio.sleep(8)  # past the fault window: the survivor alone, nginx skipping the dead one
        return killed, killed + FAULT_WINDOW_S

    outcomes, window = asyncio.run(steady_load(balancer.url, expected, scenario))
    figures = report("SIGKILL of one replica", outcomes, window, len(balancer.retried()))

    assert victim.process is not None and victim.process.returncode == -signal.SIGKILL
    assert failures_of(outcomes) == [], failures_of(outcomes)[:5]
    assert figures["during_fault"] > 100, "too little load during the fault to show anything"
    # The fault reached nginx: requests meant for the dead replica were sent on to the other one.
    assert figures["retried"] > 0, balancer.error_log.read_text()[-2000:]
    assert replicas[1].process is not None and replicas[1].process.poll() is None


@pytest.mark.timeout(120)
def test_rolling_restart_under_load_fails_no_request(
    cluster: tuple[list[Replica], LoadBalancer], tiny_model: TextEncoder
) -> None:
    replicas, balancer = cluster
    expected = tiny_model.embed(TEXTS).numpy()
    exits: list[int | None] = []

    async def scenario() -> tuple[float, float]:
        await asyncio.sleep(2)
        began = time.monotonic()
        for replica in replicas:  # one at a time, as a rolling update does
            assert replica.process is not None
            replica.process.send_signal(signal.SIGTERM)  # stop accepting, answer what was admitted, exit
            exits.append(await asyncio.to_thread(replica.process.wait, 30))
            await asyncio.to_thread(replica.start)  # same port; returns once /health is 200
            # Before the next replica goes, this one must be taking requests from nginx again: restarting the
            # other while nginx still skips this one would leave no replica to send requests to.
            await wait_until_serving(replica)
        ended = time.monotonic()
        await asyncio.sleep(2)
        return began, ended

    try:
        outcomes, window = asyncio.run(steady_load(balancer.url, expected, scenario))
    except BaseException:
        for replica in replicas:
            if replica.process is not None:
                print(server_log(replica.process)[-3000:])
        raise
    figures = report(
        "Rolling restart (SIGTERM, start again; one replica, then the other)", outcomes, window, len(balancer.retried())
    )

    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert all(code in (0, -signal.SIGTERM) for code in exits), exits
    assert failures_of(outcomes) == [], failures_of(outcomes)[:5]
    assert figures["during_fault"] > 100, "too little load during the restarts to show anything"
    assert all(replica.process is not None and replica.process.poll() is None for replica in replicas)


@pytest.mark.timeout(60)
def test_the_load_balancers_own_errors_keep_the_services_envelope() -> None:
    """With no replica to answer, or a body over the service's limit, nginx answers in API.md's JSON
    envelope, with the statuses a replica would give: 503 not_ready (and Retry-After), 413."""
    balancer = LoadBalancer([Replica({}), Replica({})], ready=False)  # nothing listens on their ports
    try:
        with httpx.Client(base_url=balancer.url, timeout=10) as http:
            for response in (http.post("/encode", json={"texts": "hello"}), http.get("/health")):
                assert_error(response, 503, "not_ready")
                assert response.headers["retry-after"] == "1"
            too_large = http.post("/encode", content=b"x" * (Settings().max_body_bytes + 1))
            assert_error(too_large, 413, "payload_too_large")
    finally:
        balancer.stop()
