"""How a task should cross from a front-end process to the engine process and its answer come back: measured.

    .venv/bin/python -m bench.transport [--seconds 5] [--rounds 3]

A client process (an asyncio event loop, as a front end is) keeps 32 requests in flight to a server process (as
the engine), which answers each with a fixed result; each request is a task of one text (12 token ids and its
options), each answer one sentence vector (384 float32). Then one client sends 20 requests whose answers hold
4.7 MB of float32 (6 layers × 12 heads × 128² attention weights, /attention's size) one at a time. Transports:

- zmq + pickle: pyzmq DEALER/ROUTER over an ipc socket, the message pickled (protocol 5) with its numpy arrays as
  out-of-band frames (sent without a copy);
- zmq + msgspec: the same sockets, the message a msgspec Struct encoded as msgpack, arrays as raw frames;
- unix stream + pickle: asyncio streams over a Unix socket, length-prefixed pickle (protocol 5);
- unix stream + wire frames: what the engine uses (app/engine/wire.py): a buffered protocol on both sides, the pickle's
  arrays beside it, a large answer received straight into memory of its own;
- multiprocessing pipe: ``multiprocessing.Pipe`` with pickle, read by a thread on the client's side.

Prints round trips a second, the CPU both processes spent a round trip (user + system, from /proc), and the
large answers' MB/s, for each round and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from app.engine.wire import FrameReader
from bench.run import cpu_seconds

IN_FLIGHT = 32
SMALL = np.full(384, 0.05, dtype=np.float32)  # one sentence vector
LARGE = np.full((6, 12, 128, 128), 0.01, dtype=np.float32)  # one text's attention, every layer and head


@dataclass
class Request:  # what the pickled transports carry
    id: int
    model: str
    kind: str
    ids: list[list[int]]
    options: dict[str, Any]
    large: bool = False


class WireRequest(msgspec.Struct, array_like=True):  # what msgspec carries
    id: int
    model: str
    kind: str
    ids: list[list[int]]
    options: dict[str, Any]
    large: bool = False


class WireReply(msgspec.Struct, array_like=True):
    id: int
    dtype: str
    shape: list[int]


def request(id_: int, large: bool = False) -> Request:
    return Request(id_, "minilm", "embed", [list(range(101, 113))], {"layer": 6, "pooling": "mean"}, large)


# ---- the servers (each in its own process) ----


def zmq_pickle_server(address: str) -> None:
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(address)
    while True:
        client, head, *buffers = socket.recv_multipart(copy=False)
        task = pickle.loads(head.buffer, buffers=[b.buffer for b in buffers])
        result = LARGE if task.large else SMALL
        frames: list[Any] = []
        body = pickle.dumps((task.id, result), protocol=5, buffer_callback=frames.append)
        socket.send_multipart([client, body, *[frame.raw() for frame in frames]], copy=False)


def zmq_msgspec_server(address: str) -> None:
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(address)
    decode, encode = msgspec.msgpack.Decoder(WireRequest).decode, msgspec.msgpack.Encoder().encode
    while True:
        client, head = socket.recv_multipart(copy=False)
        task = decode(head.buffer)
        result = LARGE if task.large else SMALL
        reply = encode(WireReply(task.id, str(result.dtype), list(result.shape)))
        socket.send_multipart([client, reply, result.data], copy=False)


def unix_pickle_server(path: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            (n,) = struct.unpack("<I", await reader.readexactly(4))
            task = pickle.loads(await reader.readexactly(n))
            body = pickle.dumps((task.id, LARGE if task.large else SMALL), protocol=5)
            writer.write(struct.pack("<I", len(body)) + body)

    async def main() -> None:
        server = await asyncio.start_unix_server(serve, path)
        await server.serve_forever()

    asyncio.run(main())


def unix_wire_server(path: str) -> None:
    def connection() -> FrameReader:
        def received(task: Request) -> None:
            wire.send((task.id, LARGE if task.large else SMALL))

        wire = FrameReader(received, lambda _: None)
        return wire

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(connection, path)
        await server.serve_forever()

    asyncio.run(main())


def pipe_server(connection: Connection) -> None:
    while True:
        task = connection.recv()
        connection.send((task.id, LARGE if task.large else SMALL))


# ---- the clients (in this process, an asyncio loop as a front end has) ----


class Client:
    """Sends a request and awaits its answer: ``call(request)`` returns the result array."""

    async def call(self, task: Request) -> np.ndarray:
        raise NotImplementedError

    async def start(self) -> None:
        pass


class ZmqPickle(Client):
    def __init__(self, address: str) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.socket.connect(address)
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}

    async def start(self) -> None:
        asyncio.ensure_future(self.receive())

    async def receive(self) -> None:
        while True:
            head, *buffers = await self.socket.recv_multipart(copy=False)
            id_, result = pickle.loads(head.buffer, buffers=[b.buffer for b in buffers])
            self.waiting.pop(id_).set_result(result)

    async def call(self, task: Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting[task.id] = future
        await self.socket.send(pickle.dumps(task, protocol=5))
        return await future


class ZmqMsgspec(ZmqPickle):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.encode, self.decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(WireReply).decode

    async def receive(self) -> None:
        while True:
            head, data = await self.socket.recv_multipart(copy=False)
            reply = self.decode(head.buffer)
            result = np.frombuffer(data.buffer, dtype=reply.dtype).reshape(reply.shape)
            self.waiting.pop(reply.id).set_result(result)

    async def call(self, task: Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting[task.id] = future
        wire = WireRequest(task.id, task.model, task.kind, task.ids, task.options, task.large)
        await self.socket.send(self.encode(wire))
        return await future


class UnixPickle(Client):
    def __init__(self, path: str) -> None:
        self.path = path
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(self.path)
        asyncio.ensure_future(self.receive())

    async def receive(self) -> None:
        while True:
            (n,) = struct.unpack("<I", await self.reader.readexactly(4))
            id_, result = pickle.loads(await self.reader.readexactly(n))
            self.waiting.pop(id_).set_result(result)

    async def call(self, task: Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting[task.id] = future
        body = pickle.dumps(task, protocol=5)
        self.writer.write(struct.pack("<I", len(body)) + body)
        return await future


class UnixWire(Client):
    def __init__(self, path: str) -> None:
        self.path = path
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}
        self.wire = FrameReader(self.received, lambda _: None)

    def received(self, message: tuple[int, np.ndarray]) -> None:
        id_, result = message
        self.waiting.pop(id_).set_result(result)

    async def start(self) -> None:
        await asyncio.get_running_loop().create_unix_connection(lambda: self.wire, self.path)

    async def call(self, task: Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting[task.id] = future
        self.wire.send(task)
        return await future


class Pipe(Client):
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}
        self.lock = threading.Lock()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def resolve(id_: int, result: np.ndarray) -> None:
            self.waiting.pop(id_).set_result(result)

        def receive() -> None:
            while True:
                id_, result = self.connection.recv()
                loop.call_soon_threadsafe(resolve, id_, result)

        threading.Thread(target=receive, daemon=True).start()

    async def call(self, task: Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting[task.id] = future
        with self.lock:
            self.connection.send(task)
        return await future


async def measure(client: Client, server_pid: int, seconds: float) -> tuple[float, float, float]:
    """Round trips a second and CPU µs a round trip at IN_FLIGHT, then MB/s of large answers one at a time."""
    counter = iter(range(10**9))
    for _ in range(200):  # warm up
        await client.call(request(next(counter)))
    done = 0
    deadline = time.perf_counter() + seconds
    cpu_before = cpu_seconds(server_pid) + cpu_seconds(os.getpid())
    started = time.perf_counter()

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            result = await client.call(request(next(counter)))
            assert result.shape == SMALL.shape
            done += 1

    await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(server_pid) + cpu_seconds(os.getpid()) - cpu_before
    started = time.perf_counter()
    for _ in range(20):
        result = await client.call(request(next(counter), large=True))
        assert result.shape == LARGE.shape and float(result[0, 0, 0, 0]) == float(LARGE[0, 0, 0, 0])
    megabytes = 20 * LARGE.nbytes / 1e6 / (time.perf_counter() - started)
    return done / elapsed, 1e6 * cpu / done, megabytes


def run_one(name: str, seconds: float) -> tuple[float, float, float]:
    directory = tempfile.mkdtemp(prefix="transport-")
    context = multiprocessing.get_context("spawn")
    process: Any
    client: Client
    if name == "multiprocessing pipe":
        ours, theirs = context.Pipe()
        process = context.Process(target=pipe_server, args=(theirs,), daemon=True)
        process.start()
        client = Pipe(ours)
    elif name.startswith("unix stream"):
        path = f"{directory}/socket"
        wire = name == "unix stream + wire frames"
        process = context.Process(target=unix_wire_server if wire else unix_pickle_server, args=(path,), daemon=True)
        process.start()
        while not Path(path).exists():
            time.sleep(0.01)
        client = UnixWire(path) if wire else UnixPickle(path)
    else:
        address = f"ipc://{directory}/socket"
        target: Callable[[str], None] = zmq_pickle_server if name == "zmq + pickle" else zmq_msgspec_server
        process = context.Process(target=target, args=(address,), daemon=True)
        process.start()
        client = ZmqPickle(address) if name == "zmq + pickle" else ZmqMsgspec(address)

    async def go() -> tuple[float, float, float]:
        await client.start()
        return await measure(client, process.pid, seconds)

    try:
        return asyncio.run(go())
    finally:
        process.kill()
        process.join()


TRANSPORTS = (
    "zmq + pickle",
    "zmq + msgspec",
    "unix stream + pickle",
    "unix stream + wire frames",
    "multiprocessing pipe",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in TRANSPORTS}
    for round_ in range(args.rounds):
        order = TRANSPORTS if round_ % 2 == 0 else tuple(reversed(TRANSPORTS))
        for name in order:
            results[name].append(run_one(name, args.seconds))
    print(f"\n{IN_FLIGHT} requests in flight, {args.rounds} rounds of {args.seconds:g} s; then 20 answers of 4.7 MB\n")
    print("| transport | round trips/s (rounds) | median | CPU µs a round trip (rounds) | median | large MB/s |")
    print("|---|---|---:|---|---:|---:|")
    for name, values in results.items():
        rates, cpus, mbs = ([v[i] for v in values] for i in range(3))
        print(
            f"| {name} | {', '.join(f'{r:,.0f}' for r in rates)} | {statistics.median(rates):,.0f} | "
            f"{', '.join(f'{c:.0f}' for c in cpus)} | {statistics.median(cpus):.0f} | {statistics.median(mbs):,.0f} |"
        )


if __name__ == "__main__":
    main()
