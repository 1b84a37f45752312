"""The service as several processes: one engine that computes, front ends that answer HTTP, and a supervisor.

    python -m app.serve [--host 127.0.0.1] [--port 8000]

With ``ENCODER_WORKERS`` = N > 1 (``auto``: chosen from the cores and the device, ``front_ends``) the supervisor
(this process, which imports neither torch nor the models) binds the listening socket, starts the engine process
(app/engine/remote.py: the models, their queues, batching and passes) and, once it is ready, N front-end processes that
share the socket, each an event loop with the whole HTTP API (validation, tokenisation, serialisation) and no
weights; they send the models' work to the engine. One socket shared, not one each with SO_REUSEPORT: the
connections waiting in a socket's queue are lost when its process dies, and a shared queue outlives any one front
end (measured: a front end killed under load cost connections with SO_REUSEPORT, none with the shared socket).
The front ends share the connections by a rule, not by who wakes first (``Sharing``): each accepts only
while it holds no more connections than any other (their counts in shared memory). Left to the kernel and the
event loops, a pool of keep-alive connections opened at once went to one or two front ends (32 connections over
4 of them: 32, 0, 0, 0, then 15, 12, 5, 0), the others idle whatever the load.
With N = 1 it serves as ``uvicorn --factory app.main:create_app`` does, in one process.

Faults: a front end that dies is replaced, the others serve meanwhile. When the engine dies, the requests waiting
for it are answered 503 ``not_ready`` at once (their front ends see the engine's socket close), and the
supervisor stops the front ends and exits with status 1, so that an orchestrator (Kubernetes, compose's
``restart``) starts the service again with its models loaded anew. SIGTERM or SIGINT: the front ends stop
accepting and answer what they hold, then the engine finishes what is queued; all exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import functools
import logging
import math
import multiprocessing
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from app.allocator import bound_allocator, front_end_allocator
from app.logs import configure_logging
from app.settings import Settings, UnknownSettings, get_settings

logger = logging.getLogger("app.serve")

EXIT_ENGINE_FAILED = 1
EXIT_CANNOT_LISTEN = 3  # the address is in use, or not this host's: said in one line, before any model loads
EXIT_CANNOT_FETCH = 4  # a model named by Hub id could not be had: said in one line, naming it
STOP_TIMEOUT_S = 30.0
START_GRACE_S = 10.0  # at start, how long front ends that serve wait for the others before they accept
CGROUPS = Path("/sys/fs/cgroup")
NVIDIA_CONTROL = Path("/dev/nvidiactl")


def cpu_quota(cgroups: Path = CGROUPS, membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (a container's CPU limit), None if it has none: the lowest
    of cgroup v2's ``cpu.max`` on the process's own cgroup and each one above it (a limit may sit on a parent), and
    of v1's CFS quota on its ``cpu`` controller's group."""
    try:
        entries = [line.split(":", 2) for line in membership.read_text().splitlines()]
    except OSError:
        entries = []
    quotas = []
    for _, controllers, path in (entry for entry in entries if len(entry) == 3):
        if controllers == "":  # v2: one hierarchy, its limits on the group and its ancestors
            directory = cgroups / path.lstrip("/")
            while cgroups == directory or cgroups in directory.parents:
                with contextlib.suppress(OSError, ValueError):
                    quota, period = (directory / "cpu.max").read_text().split()[:2]
                    if quota != "max":
                        quotas.append(int(quota) / int(period))
                directory = directory.parent
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            for mount in {cgroups / controllers, cgroups / "cpu", cgroups / "cpu,cpuacct"}:
                with contextlib.suppress(OSError, ValueError):
                    quota_us = int((mount / path.lstrip("/") / "cpu.cfs_quota_us").read_text())
                    period_us = int((mount / path.lstrip("/") / "cpu.cfs_period_us").read_text())
                    if quota_us > 0 and period_us > 0:
                        quotas.append(quota_us / period_us)
    return min(quotas) if quotas else None


def available_cores(cgroups: Path = CGROUPS, membership: Path = Path("/proc/self/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, within its cgroup's CPU quota (a container's CPU limit,
    which the affinity does not show: a pod limited to 2 cores of a 64-core node sees 64)."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(cgroups, membership)
    return cores if quota is None else min(cores, max(1, math.ceil(quota)))


def computes_on_gpu(device: str, control: Path = NVIDIA_CONTROL) -> bool:
    """Whether the engine will compute on a GPU, told without importing torch here: ``cuda…`` says so, ``cpu``
    says not, and ``auto`` finds CUDA where the NVIDIA driver's control device is and CUDA_VISIBLE_DEVICES does
    not hide every GPU (an image with a CPU-only torch on such a host should say ``ENCODER_DEVICE=cpu``)."""
    if device != "auto":
        return device.startswith("cuda")
    return os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1") and control.exists()


def front_ends(workers: int | str, cores: int, gpu: bool) -> int:
    """ENCODER_WORKERS, ``auto`` resolved. A front end spends about 0.5 ms of one core on a one-text request
    (docs/benchmarks/host-path.md, "The hot routes' short way in, request lines in batches, one task a request (CPU)"),
    one event loop's worth of about 2,000 requests a second. On a CPU the model's pass costs far more
    (all-MiniLM-L6-v2: about 10 core-ms a text), so one front end keeps up with the passes of about 16 cores: one
    more for every 16. On a GPU the pass costs the host next to nothing and the front
    ends are what limits: one for every 4 cores, the rest left to the engine's loop, lanes and tokenisation. At
    most 8; on 2 cores a second process costs more CPU a request than one process saves (measured), so 1."""
    if workers != "auto":
        return int(workers)
    return max(1, min(8, cores // 4 if gpu else 1 + cores // 16))


def exit_with_parent(parent: int) -> None:
    """Stop this process (as SIGTERM does: what it holds is answered) once the supervisor ``parent`` that started
    it is gone, killed or crashed: no engine or front end outlives it, holding the port and the models' memory.

    The supervisor's pid comes from the supervisor, not from ``os.getppid()`` here: a supervisor killed while this
    process was still starting has already handed it to another parent. Should stopping take longer than
    ``STOP_TIMEOUT_S``, this thread writes out the logs and ends the process; and should the interpreter no longer
    run it by then (stuck in its finalisation), SIGALRM's default action does a second later."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        signal.alarm(int(STOP_TIMEOUT_S) + 1)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_TIMEOUT_S)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def name_process(name: str) -> None:
    """The name ps, top and /proc/PID/comm show for this process (at most 15 bytes), where Linux lets it be set."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME, on the main thread
    except (OSError, AttributeError):
        pass


def engine_main(path: str, ready: Connection, parent: int) -> None:
    """The engine process: load every model, then serve the front ends on the Unix socket ``path``."""
    exit_with_parent(parent)
    name_process("encoder-engine")
    from app.engine.admission import Admission
    from app.engine.compute import bound_kernel_caches
    from app.engine.remote import Engine
    from app.metrics import Metrics
    from app.serving.registry import ModelLoadError, load_registry
    from app.tracing import start, stop

    bound_kernel_caches()
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    start("engine")  # its spans in the front ends' traces (app/tracing.py), where traces are on
    metrics = Metrics()
    try:
        registry = load_registry(settings, metrics)
    except ModelLoadError as error:
        logger.error("%s", error)
        sys.exit(EXIT_ENGINE_FAILED)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        admission = Admission(settings.max_queue_texts, registry.seconds_per_text, metrics)
        engine = Engine(registry, admission, metrics)
        server = await engine.serve(path)
        ready.send(os.getpid())
        await stop.wait()
        server.close()
        # Told to stop with the front ends (a signal to the whole process group: Ctrl-C in a terminal), the engine
        # answers what they still send until each has drained and gone.
        await engine.front_ends_gone(STOP_TIMEOUT_S)

    asyncio.run(serve())
    registry.close()  # finishes what is queued
    stop()
    logger.info("engine stopped")


def front_end_main(listener: socket.socket, path: str, parent: int, keep_alive_s: int, held: Any, index: int) -> None:
    """Front end ``index``: the HTTP API on the shared socket (its connections shared with the others by
    ``Sharing``, counted in ``held``), the models' work sent to the engine."""
    exit_with_parent(parent)
    name_process("encoder-front")
    tokenize_serially()
    import uvicorn

    from app.main import create_app, exit_process
    from app.metrics import defer_writes

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    defer_writes()  # its counts written once a loop turn, before its metrics are made
    app = create_app(settings, on_load_failure=exit_process, engine=path)  # once it serves, its count is in held
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=keep_alive_s)
    sharing_server(config, listener, held, index).run(sockets=[])


def tokenize_serially() -> None:
    """A front end's tokenizer calls each run on the thread that makes them, not spread over the tokenizers library's
    pool of a thread a core: the front ends are as many as the cores already, and spread, a batch of 32 sentences
    costs 1.4-1.9 times the CPU a text for a tenth less time a call (docs/benchmarks/host-path.md, "A front end
    tokenises on one thread (CPU)"). ``TOKENIZERS_PARALLELISM`` set by the operator stands."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


NOT_SERVING = -1  # a front end's count in ``held`` while it starts, after it stopped, once it is gone
LOOK_AGAIN_S = 0.001  # a front end that left a waiting connection to the others looks again after this
PATIENCE_S = 0.02  # and takes it itself once it has waited this long (the others busy, or not given a core)


def counted(protocol: type) -> type:
    """uvicorn's HTTP protocol, counted out of its server's connections (``sharing.count``) once the connection is
    lost (``server`` is taken: uvicorn's protocol holds the server's address there)."""

    class Counted(protocol):
        sharing: Any = None
        connected = False

        def connection_made(self, transport: Any) -> None:
            self.connected = True
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self.sharing.count(-1)
            super().connection_lost(exc)

    return Counted


class Sharing:
    """How a front end accepts on the shared ``listener``, by the front ends' rule: a connection waiting to be
    accepted is taken by a front end that holds no more connections than any other serving one (``held``: each
    front end's count, in shared memory); one that holds more leaves it to them and looks again after
    ``LOOK_AGAIN_S``, taking it itself after ``PATIENCE_S``. At start none accepts until every front end serves
    (or ``START_GRACE_S`` has passed): a pool opened as the service becomes ready is shared by all. Each accepted
    connection is served by ``serve`` (uvicorn's protocol, counted out of ``live`` once lost)."""

    def __init__(self, listener: socket.socket, held: Any, index: int, serve: Callable[[], Any]) -> None:
        self.listener, self.held, self.index, self.serve = listener, held, index, serve
        self.loop = asyncio.get_running_loop()
        self.live = 0  # connections accepted and not yet closed
        self.serving_since = time.monotonic()
        self.opened = False  # every front end served once (or START_GRACE_S passed)
        self.waiting_since: float | None = None  # since when this one leaves a waiting connection to others
        self.closing = False
        listener.setblocking(False)
        held[index] = 0
        self.loop.add_reader(listener.fileno(), self.take)

    def count(self, change: int) -> None:
        self.live += change
        if not self.closing:
            self.held[self.index] = self.live

    def its_turn(self) -> bool:
        """Whether this front end takes the connection waiting: it holds no more than any other serving one, or
        has left it to them for PATIENCE_S."""
        if all(self.live <= n for i, n in enumerate(self.held) if i != self.index and n != NOT_SERVING):
            return True
        now = time.monotonic()
        self.waiting_since = self.waiting_since or now
        return now - self.waiting_since >= PATIENCE_S

    def take(self) -> None:
        if not self.opened:
            self.opened = NOT_SERVING not in self.held[:] or time.monotonic() - self.serving_since > START_GRACE_S
        again = LOOK_AGAIN_S if self.opened else 0.05
        while self.opened and self.its_turn():
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):  # another front end took it
                return
            except ConnectionAbortedError:  # reset as it waited: the next one
                continue
            except OSError as error:  # out of descriptors, say: not again at once
                logger.warning("accepting a connection failed: %s; trying again in a second", error)
                again = 1.0
                break
            self.waiting_since = None
            self.count(+1)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            made: list[Any] = []
            opening = asyncio.ensure_future(self.loop.connect_accepted_socket(self.protocol(made), connection))
            opening.add_done_callback(functools.partial(self.opened_one, made))
        self.loop.remove_reader(self.listener.fileno())  # left to the others: a look again soon
        self.loop.call_later(again, self.look_again)

    def protocol(self, made: list[Any]) -> Callable[[], Any]:
        """The protocol for one connection, put in ``made`` as it is made."""

        def make() -> Any:
            made.append(self.serve())
            made[0].sharing = self
            return made[0]

        return make

    def opened_one(self, made: list[Any], opening: asyncio.Future[Any]) -> None:
        if opening.cancelled() or opening.exception() is None:
            return
        if not (made and made[0].connected):
            self.count(-1)  # reset before it was served: never connected, so never lost either

    def look_again(self) -> None:
        if self.closing:
            return
        if self.waiting_since is not None and not select.select([self.listener], [], [], 0)[0]:
            self.waiting_since = None  # the connection it left went to another front end
        self.loop.add_reader(self.listener.fileno(), self.take)

    def close(self) -> None:
        """Accept no more (SIGTERM): the others no longer leave connections to this one."""
        self.closing = True
        self.loop.remove_reader(self.listener.fileno())
        self.held[self.index] = NOT_SERVING


def sharing_server(config: Any, listener: socket.socket, held: Any, index: int) -> Any:
    """uvicorn's server that accepts on the shared ``listener`` as ``Sharing`` says, serving each connection as
    uvicorn serves its own (its protocol, the server's state: a SIGTERM drains it)."""
    import uvicorn

    class SharingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=[])  # uvicorn accepts on no socket: Sharing does
            protocol = counted(config.http_protocol_class)
            serve = functools.partial(
                protocol, config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            self.sharing = Sharing(listener, held, index, serve)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            self.sharing.close()
            await super().shutdown(sockets)

    return SharingServer(config)


@contextlib.contextmanager
def preloaded(library: str | None) -> Iterator[None]:
    """LD_PRELOAD naming ``library`` first for the processes started meanwhile (``multiprocessing``'s spawn starts
    a new interpreter with this process's environment); nothing where None."""
    before = os.environ.get("LD_PRELOAD")
    if library is not None:
        os.environ["LD_PRELOAD"] = f"{library}:{before}" if before else library
    try:
        yield
    finally:
        if library is not None:
            if before is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = before


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        workers: int,
        listener: socket.socket,
        keep_alive_s: int = 5,
        allocator: str | None = None,
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.allocator = allocator  # the front ends' preloaded allocator (front_end_allocator); None: glibc's
        self.keep_alive_s = keep_alive_s
        self.context = multiprocessing.get_context("spawn")
        self.listener = listener  # bound and listening (listen_or_exit)
        self.path = str(Path(tempfile.mkdtemp(prefix="encoder-engine-")) / "engine.sock")
        self.made = [Path(self.path).parent]  # temporary directories, removed when the service stops
        self.front_ends: dict[int, BaseProcess] = {}
        # each front end's count of connections, NOT_SERVING while it starts and once it is gone (Sharing)
        self.held = self.context.Array("i", [NOT_SERVING] * workers, lock=False)
        self.stopping = False

    def start_engine(self) -> BaseProcess | None:
        """The engine, once it serves; None if it exits first (its log says why)."""
        ready, ready_child = self.context.Pipe(duplex=False)
        engine = self.context.Process(target=engine_main, args=(self.path, ready_child, os.getpid()), name="engine")
        engine.start()
        ready_child.close()
        while not self.stopping:
            if ready.poll(0.2):
                try:
                    ready.recv()
                except EOFError:
                    break
                return engine
            if not engine.is_alive():
                break
        engine.join(5)
        return None

    def start_front_end(self, index: int) -> None:
        process = self.context.Process(
            target=front_end_main,
            args=(self.listener, self.path, os.getpid(), self.keep_alive_s, self.held, index),
            name=f"front-end-{index}",
        )
        with preloaded(self.allocator):
            process.start()
        self.front_ends[index] = process

    def stop_front_ends(self) -> None:
        for process in self.front_ends.values():
            if process.is_alive():
                os.kill(process.pid or 0, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.front_ends.values():
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()

    def run(self) -> int:
        """Serve until stopped (SIGTERM, SIGINT) or the engine exits; the exit status. The temporary directories
        made for the engine's socket and the front ends' metrics go with the service."""
        try:
            return self.serve()
        finally:
            for directory in self.made:
                shutil.rmtree(directory, ignore_errors=True)

    def serve(self) -> int:
        def stop(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        engine = self.start_engine()
        if engine is None:
            if self.stopping:
                return 0
            logger.error("the engine could not start; the service exits")
            return EXIT_ENGINE_FAILED
        # the front ends' HTTP metrics, summed over them (app/metrics.py); set after the engine started: it
        # counts its own
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="encoder-metrics-")
        self.made.append(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
        for index in range(self.workers):
            self.start_front_end(index)
        logger.info(
            "one engine (pid %d) computes the models; %d front ends starting (allocating with %s)",
            engine.pid,
            self.workers,
            self.allocator or "the C library's malloc",
        )
        announced, first_served = False, math.inf
        status = 0
        while not self.stopping:
            if not announced:  # as the front ends open: once every one serves, or the first has for START_GRACE_S
                serving = sum(count != NOT_SERVING for count in self.held)
                first_served = min(first_served, time.monotonic() if serving else math.inf)
                if serving == self.workers or time.monotonic() - first_served > START_GRACE_S:
                    announced = True
                    logger.info("%s (%d front ends)", ready_line(self.listener, self.settings), serving)
            sentinels = [engine.sentinel, *(process.sentinel for process in self.front_ends.values())]
            wait(sentinels, timeout=0.5 if announced else 0.05)
            if self.stopping:
                break
            if not engine.is_alive():
                logger.error(
                    "the engine exited (status %s): stopping the front ends; the service exits", engine.exitcode
                )
                status = EXIT_ENGINE_FAILED
                break
            for index, process in list(self.front_ends.items()):
                if not process.is_alive():
                    logger.error("front end %d exited (status %s): starting another", index, process.exitcode)
                    self.held[index] = NOT_SERVING  # the others no longer leave connections to it
                    process.join()
                    self.start_front_end(index)
        self.stop_front_ends()
        if engine.is_alive():
            os.kill(engine.pid or 0, signal.SIGTERM)
            engine.join(STOP_TIMEOUT_S)
            if engine.is_alive():
                engine.kill()
        self.listener.close()
        logger.info("stopped")
        return status


def listen_or_exit(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything loads; where it cannot be (the port in use, an address that is
    not this host's), one line saying so and exit status EXIT_CANNOT_LISTEN, and nothing logged as ready."""
    listener = bound_or_exit(host, port, "--port")
    logger.info(
        "bound to %s; loading the models (requests are answered 503 not_ready until a line says the service serves)",
        address(listener),
    )
    return listener


def grpc_port_or_exit(settings: Settings) -> None:
    """ENCODER_GRPC_PORT free, checked before anything loads (every process that serves gRPC binds it itself as it
    starts, app/api/tei/grpc/server.py): else one line and EXIT_CANNOT_LISTEN, as for HTTP's port, rather than
    front ends that fail to start again and again."""
    if settings.grpc_port is not None:
        bound_or_exit(settings.grpc_host, settings.grpc_port, "ENCODER_GRPC_PORT").close()


def bound_or_exit(host: str, port: int, setting: str) -> socket.socket:
    """A socket listening on host:port, or one line saying why not and exit status EXIT_CANNOT_LISTEN."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(2048)
    except OSError as error:
        listener.close()
        taken = error.errno == errno.EADDRINUSE
        hint = f"; another process listens there: stop it, or choose another {setting}" if taken else ""
        print(f"cannot listen on {host}:{port}: {error.strerror or error}{hint}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_LISTEN)
    return listener


def address(listener: socket.socket) -> str:
    """The URL of the listening socket, as a client would write it."""
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ready_line(listener: socket.socket, settings: Settings, names: list[str] | None = None) -> str:
    """What the service logs once it answers requests: where, and which models (the first the default)."""
    if names is None:
        from app.serving.registry import model_specs

        names = [name for name, _ in model_specs(settings)]
    grpc = f" (gRPC on {settings.grpc_host}:{settings.grpc_port})" if settings.grpc_port is not None else ""
    return f"ready on {address(listener)}{grpc}: {', '.join(names)}"


def fetch_or_exit(settings: Settings) -> Settings:
    """Every model named by Hub id in the Hugging Face cache, fetched where it is not (app/download.py), once,
    before any process loads one; or one line naming the model and exit status 4. The settings come back with
    every model as the directory it resolved to (ENCODER_MODELS rewritten for the processes started after), so
    that the engine and every front end read the very files fetched here, whatever the branch does meanwhile."""
    from app.download import DownloadError, hub_model, resolve
    from app.serving.registry import model_specs

    try:
        specs = model_specs(settings)
    except Exception:  # the bundled model's package is missing: the engine says so as it loads
        return settings
    if all(hub_model(source) is None for _, source in specs):
        return settings
    resolved = []
    for name, source in specs:
        try:
            resolved.append((name, resolve(source)))
        except DownloadError as error:
            logger.error("cannot serve model %r: %s", name, error)
            sys.exit(EXIT_CANNOT_FETCH)
    os.environ["ENCODER_MODELS"] = ",".join(f"{name}={directory}" for name, directory in resolved)
    for variable in ("ENCODER_MODEL", "ENCODER_MODEL_DIR", "ENCODER_MODEL_NAME"):
        os.environ.pop(variable, None)
    get_settings.cache_clear()
    return get_settings()


def settings_or_exit() -> Settings:
    """The ENCODER_* settings, or a line for each variable that is wrong or names no setting and exit status 2 (not
    a traceback); the same for OpenTelemetry's variables where they ask for traces that cannot be sent."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from app.tracing import TracingUnavailable, check

    try:
        check()  # OpenTelemetry's own variables, where they ask for traces (app/tracing.py)
        return get_settings()
    except TracingUnavailable as error:
        print(error, file=sys.stderr)
        sys.exit(2)
    except UnknownSettings as error:
        print("\n".join(error.lines), file=sys.stderr)
        sys.exit(2)
    except SettingsError as error:  # a value pydantic-settings could not even read (a list that is no JSON)
        print(f"{error} ({error.__cause__})" if error.__cause__ else str(error), file=sys.stderr)
        sys.exit(2)
    except ValidationError as error:
        wrong: dict[str, tuple[object, list[str]]] = {}
        for problem in error.errors():
            name = f"ENCODER_{str(problem['loc'][0]).upper()}" if problem["loc"] else "ENCODER_*"
            wrong.setdefault(name, (problem["input"], []))[1].append(problem["msg"])
        for name, (value, messages) in wrong.items():
            print(f"{name}: {'; or '.join(messages)} (got {value!r})", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """``python -m app.serve``: where to listen as uvicorn's command line takes it (``--host``, ``--port``,
    ``--timeout-keep-alive``, or the UVICORN_HOST, UVICORN_PORT, UVICORN_TIMEOUT_KEEP_ALIVE variables that it
    reads), the service's own settings from ENCODER_* variables."""
    parser = argparse.ArgumentParser(description="The encoder service: an engine and ENCODER_WORKERS front ends.")
    parser.add_argument("--host", default=os.environ.get("UVICORN_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("UVICORN_PORT", "8000")))
    parser.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=int(os.environ.get("UVICORN_TIMEOUT_KEEP_ALIVE", "5")),
        help="seconds an idle connection is kept open",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        help="uvicorn's own log level (the service's: ENCODER_LOG_LEVEL); at info it says it runs before the models "
        "are ready",
    )
    parser.add_argument(
        "--no-access-log", action="store_true", help="accepted as uvicorn takes it (the service logs each request)"
    )
    args = parser.parse_args()
    os.environ.setdefault("ENCODER_GRPC_HOST", args.host)  # gRPC where HTTP listens, unless told otherwise
    bound_allocator()  # before anything large is allocated, here and in every process started from here
    settings = settings_or_exit()
    configure_logging(settings.log_level, settings.log_format)
    try:
        allocator = front_end_allocator(settings.front_end_allocator)
    except ValueError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
    listener = listen_or_exit(args.host, args.port)
    grpc_port_or_exit(settings)
    settings = fetch_or_exit(settings)
    cores, gpu = available_cores(), computes_on_gpu(settings.device)
    workers = front_ends(settings.workers, cores, gpu)
    if settings.workers == "auto":
        logger.info(
            "ENCODER_WORKERS=auto: %d front end%s (%d cores, %s)",
            workers,
            "" if workers == 1 else "s",
            cores,
            "a GPU computes" if gpu else "the CPU computes",
        )
    if workers == 1:
        import uvicorn

        # uvicorn raises the SIGTERM it handled again once it has shut down, as the handler it found would take it:
        # this one lets the process end as the supervisor's does, with status 0 after a clean drain.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        from app.main import create_app

        app = create_app(on_ready=lambda registry: logger.info("%s", ready_line(listener, settings, registry.names)))
        uvicorn.run(
            app,
            fd=listener.fileno(),
            log_level=args.log_level,
            access_log=False,
            timeout_keep_alive=args.timeout_keep_alive,
        )
        return
    sys.exit(Supervisor(settings, workers, listener, args.timeout_keep_alive, allocator).run())


if __name__ == "__main__":
    main()
