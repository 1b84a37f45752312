"""Prometheus metrics, one registry per application (so that tests can build as many apps as they like).

As processes (app/serve.py) one view is put together: the HTTP metrics every front end counts (``HTTP_METRICS``)
go through prometheus-client's multiprocess mode (files in ``PROMETHEUS_MULTIPROC_DIR``, summed over the front
ends, those that have died included), and everything about the models, their queue and passes comes from the
engine, the one process that has them; any front end's /metrics answers with both."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

# What a front end counts itself (the rest is the engine's): families as prometheus-client names them.
if TYPE_CHECKING:
    import torch


HTTP_METRICS = frozenset(
    {"encoder_requests", "encoder_request_seconds", "encoder_timeouts", "encoder_short_way_requests"}
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PHASES = ("tokenization", "queue", "inference", "serialization")  # a request's, as encoder_request_seconds has them
BATCH_TEXT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "encoder_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=r
        )
        self.short_way = Counter(
            "encoder_short_way_requests",
            "Requests to the hot routes answered the short way in, without the framework's layers",
            ["route"],
            registry=r,
        )
        self.latency = Histogram(
            "encoder_request_seconds",
            "Request time by route and phase: queue (waiting for the model), inference, serialisation, total",
            ["route", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_texts = Histogram(
            "encoder_batch_texts", "Texts in each forward pass", buckets=BATCH_TEXT_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "encoder_batch_tokens",
            "Tokens in each forward pass, real (not padding)",
            buckets=BATCH_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "encoder_batch_seconds", "Time of each forward pass", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_texts = Gauge("encoder_queue_texts", "Texts waiting for the inference thread", registry=r)
        self.admitted_texts = Gauge("encoder_admitted_texts", "Texts admitted and not yet answered", registry=r)
        self.dropped_texts = Counter(
            "encoder_dropped_texts", "Texts dropped before computing: client gone or deadline passed", registry=r
        )
        self.timeouts = Counter("encoder_timeouts", "Requests answered 503 timeout", registry=r)
        self.memory_returned = Counter(
            "encoder_memory_returned",
            "Times the heap that passes took was handed back to the system, the queue having emptied",
            registry=r,
        )
        self.model = Info("encoder_model", "Each model being served", ["name"], registry=r)
        self.model_memory = Gauge(
            "encoder_model_memory_bytes",
            "Resident memory the process grew by while loading and warming up each model",
            ["model"],
            registry=r,
        )
        self.model_gpu_memory = Gauge(
            "encoder_model_gpu_memory_bytes",
            "GPU memory torch's tensors grew by while loading and warming up each model: its weights (float32, and a "
            "copy in the pass's dtype, float16 or bfloat16), its CUDA graphs' memory, and cuBLAS's workspace for the "
            "first model on a device; GPU only",
            ["model"],
            registry=r,
        )
        # Each route's labelled series, kept (app/web: every request observes six of them)
        self._answered: dict[tuple[str, str, int | str], tuple[Counter, Histogram]] = {}
        self._phases: dict[str, tuple[Histogram, ...]] = {}

    def observe_request(self, route: str, method: str, status: int | str, seconds: float) -> None:
        """A request answered: counted by route, method and status, its whole time in the latency histogram."""
        children = self._answered.get((route, method, status))
        if children is None:  # labels() is looked up once a route, method and status: it costs as much as the count
            children = self.requests.labels(route, method, str(status)), self.latency.labels(route, "total")
            self._answered[route, method, status] = children
        count, total = children
        count.inc()
        total.observe(seconds)

    def observe_phases(self, route: str, *seconds: float) -> None:
        """A request's time by phase (``PHASES``, in order) in the latency histogram."""
        children = self._phases.get(route)
        if children is None:
            children = self._phases[route] = tuple(self.latency.labels(route, phase) for phase in PHASES)
        for child, value in zip(children, seconds, strict=True):
            child.observe(value)

    def observe_batch(self, texts: int, tokens: int, seconds: float) -> None:
        """Called on the inference thread after each forward pass (prometheus_client is thread-safe)."""
        self.batch_texts.observe(texts)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)

    def watch_gpu(self, devices: list[torch.device]) -> None:
        """Expose the GPU memory torch holds on each device: allocated now, at peak, and reserved by its cache."""
        import torch  # here: the front ends, which compute nothing, never load it

        for name, what, read in (
            ("allocated", "held by live tensors now", torch.cuda.memory_allocated),
            ("peak", "held by live tensors at the most, since start", torch.cuda.max_memory_allocated),
            ("reserved", "reserved by torch's caching allocator now", torch.cuda.memory_reserved),
        ):
            gauge = Gauge(
                f"encoder_gpu_memory_{name}_bytes", f"GPU memory {what} (torch)", ["device"], registry=self.registry
            )
            for device in devices:
                gauge.labels(str(device)).set_function(partial(read, device))

    def exposition(self, http: bool = True) -> bytes:
        """The metrics in Prometheus' text format; without ``http``, those of HTTP_METRICS left out: the engine
        answers no HTTP, and a front end writes every front end's counts of those beside the engine's (one family
        a name, as the format requires)."""
        if http:
            return generate_latest(self.registry)
        return exposition_of(self.registry, lambda name: name not in HTTP_METRICS)


class TurnWrites:
    """A front end's counts written into its multiprocess file once an event loop's turn, not at each increment.

    prometheus-client writes a multiprocess value into the process's file at every increment, under a lock and
    after asking the system for the process id (a fork makes the files anew): a one-text request's twelve (its
    count, four phases' and the total's latency, each a bucket and a sum, the short way's count) cost about 12.5 µs
    against 4.4 held and written together once a turn of eight requests (docs/benchmarks/host-path.md). Here each
    value is counted in the process's memory, and the values changed during a turn of the event loop are written
    when it ends (a callback the loop runs next): by then the turn's answers have been written, and a scrape,
    which reads the files, writes this process's own first (``front_ends_exposition``). What a front end killed
    outright had not yet written is lost: at most one turn's counts. An increment made on a thread where no event
    loop runs (no front end counts there) is written at once. The front ends do not fork once they count."""

    def __init__(self, base: Any) -> None:
        self.changed: set[Any] = set()
        writes = self

        class Value:
            _multiprocess = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.file = base(*args, **kwargs)  # prometheus-client's own: its key in this process's file
                self.value = self.file.get()

            def inc(self, amount: float) -> None:
                self.value += amount
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # no event loop on this thread (none of a front end's counts is made there)
                    self.file.set(self.value)
                    return
                if not writes.changed:
                    loop.call_soon(writes.write)
                writes.changed.add(self)

            def set(self, value: float, timestamp: float | None = None) -> None:
                self.value = value
                self.file.set(value, timestamp)

            def get(self) -> float:
                return self.value

            def set_exemplar(self, exemplar: Any) -> None:  # none in multiprocess mode, as prometheus-client has it
                pass

            def get_exemplar(self) -> None:
                return None

        self.value_class = Value

    def write(self) -> None:
        changed, self.changed = self.changed, set()
        for value in changed:
            value.file.set(value.value)


WRITES: TurnWrites | None = None  # a front end's (defer_writes)


def defer_writes() -> None:
    """From now on, this process's multiprocess metrics are written once a loop turn (``TurnWrites``): called by a
    front end before its metrics are made; nothing where prometheus-client is not in multiprocess mode."""
    global WRITES
    if WRITES is None and getattr(values.ValueClass, "_multiprocess", False):
        WRITES = TurnWrites(values.ValueClass)
        values.ValueClass = WRITES.value_class


def front_ends_exposition(directory: str) -> bytes:
    """The HTTP metrics of every front end, summed, from prometheus-client's multiprocess files."""
    if WRITES is not None:
        WRITES.write()  # this process's own, up to this moment
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=directory)
    return exposition_of(merged, lambda name: name in HTTP_METRICS)


def exposition_of(registry: CollectorRegistry, keep: Callable[[str], bool]) -> bytes:
    """The families of ``registry`` whose names ``keep`` keeps, in Prometheus' text format."""

    class Kept(Collector):
        def collect(self) -> Iterable[Metric]:
            return [family for family in registry.collect() if keep(family.name)]

    view = CollectorRegistry()
    view.register(Kept())
    return generate_latest(view)
