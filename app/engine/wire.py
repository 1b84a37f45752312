"""Messages between a front end and the engine: framed pickles whose arrays travel beside them, read into their
own memory.

A frame is an 8-byte little-endian length, then the frame: the pickle's length and the number of its arrays
(4 bytes each), each array's length (8 bytes each), the pickle (protocol 5, the arrays left out of it), then
the arrays' bytes. Written, an array's bytes are handed to the socket as they are (no copy into the pickle);
read, a frame larger than ``SCRATCH_BYTES`` / 4 is received straight into a buffer of its own size, which its
arrays then use as their memory: a large answer (an /attention of every layer, a multi-vector document) is
copied once, by the kernel. Smaller frames are read many at a time through one scratch buffer, their arrays
copied out of it. Measured against asyncio's streams with in-band pickles (``python -m bench.transport``,
docs/benchmarks/host-path.md, "How a task crosses between processes: four transports (CPU)", and the section before
it, "Large answers between the processes: frames read into their own memory (CPU)").
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

LENGTH = struct.Struct("<Q")
COUNTS = struct.Struct("<II")
ALIGN = 64  # each array starts this many bytes' multiple into its frame; a frame's own buffer starts where malloc
# aligns it (16 bytes), so its arrays are at least that aligned, as numpy wants them
SCRATCH_BYTES = 1 << 20
LARGE_FRAME_BYTES = SCRATCH_BYTES // 4
ONE_WRITE_BYTES = 1 << 16  # below this a frame's parts are joined into one write


def padding(offset: int) -> int:
    return -offset % ALIGN


def frame(message: Any) -> list[bytes | memoryview]:
    """The message as the parts of one frame, to be written in order."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    arrays = [buffer.raw() for buffer in buffers]
    counts = COUNTS.pack(len(body), len(arrays)) + struct.pack(f"<{len(arrays)}Q", *(a.nbytes for a in arrays))
    parts: list[bytes | memoryview] = [b"", counts, body]
    offset = len(counts) + len(body)
    for array in arrays:
        if pad := padding(offset):
            parts.append(bytes(pad))
            offset += pad
        parts.append(array)
        offset += array.nbytes
    parts[0] = LENGTH.pack(offset)
    return parts


def write_parts(transport: asyncio.WriteTransport, parts: list[bytes | memoryview]) -> None:
    """A frame's parts written: joined where small, else each as it is. Its arrays must not change afterwards: a
    transport may send from their memory later (from Python 3.12 it keeps what the socket did not take at once
    without copying it)."""
    if len(parts) == 3 or sum(len(part) for part in parts) < ONE_WRITE_BYTES:
        transport.write(b"".join(parts))
    else:
        for part in parts:  # a large array goes to the socket without being joined to the rest first
            transport.write(part)


def unframe(view: memoryview, own: bool) -> Any:
    """The message of one frame (without its length). ``own``: the memory is the frame's alone, so its arrays may
    keep it; otherwise they are copied out of it."""
    size, count = COUNTS.unpack_from(view)
    lengths = struct.unpack_from(f"<{count}Q", view, COUNTS.size)
    start = COUNTS.size + 8 * count
    body = view[start : start + size]
    start += size
    arrays: list[Any] = []
    for length in lengths:
        start += padding(start)
        array = view[start : start + length]
        arrays.append(array if own else bytearray(array))
        start += length
    return pickle.loads(body, buffers=arrays)


class FrameReader(asyncio.BufferedProtocol):
    """A connection's protocol: each message read is handed to ``received``; ``lost`` is called once the
    connection ends (with its error, or None). Writing goes through ``send``. A frame that cannot be read, or
    whose handling raises, is logged and dropped: the connection serves on (its request meets its deadline).

    Small frames sent in one turn of the event loop go out together at its end, in one system call: under many
    small requests a front end sends several tasks a turn, and the engine answers a pass's requests in one
    (docs/benchmarks/host-path.md, "Per request: metrics, the watch, the log line, frames a turn (CPU)").
    """

    def __init__(self, received: Callable[[Any], None], lost: Callable[[Exception | None], None]) -> None:
        self.received = received
        self.lost = lost
        self.transport: asyncio.WriteTransport | None = None
        self.scratch = bytearray(SCRATCH_BYTES)
        self.view = memoryview(self.scratch)
        self.start = 0  # the scratch's unread bytes are [start, end)
        self.end = 0
        self.large: bytearray | None = None  # a large frame being read into its own memory
        self.filled = 0
        self.held: list[bytes] = []  # small frames sent this turn of the loop, written at its end
        self.loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()

    def connection_lost(self, error: Exception | None) -> None:
        self.transport = None
        self.lost(error)

    def send(self, message: Any) -> None:
        """Send a message: a small one at the end of this turn of the loop, with the others sent in it; a large one
        at once, after those."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection has closed")
        parts = frame(message)
        if len(parts) > 3 and sum(len(part) for part in parts) >= ONE_WRITE_BYTES:
            self.flush()
            write_parts(self.transport, parts)
            return
        if not self.held and self.loop is not None:
            self.loop.call_soon(self.flush)
        self.held.append(b"".join(parts))

    def flush(self) -> None:
        """Write the frames held, in one system call."""
        held, self.held = self.held, []
        if held and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(held)

    def close(self) -> None:
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.large is not None:
            return memoryview(self.large)[self.filled :]
        if len(self.scratch) - self.end < LARGE_FRAME_BYTES and self.start > 0:  # the unread tail to the front
            tail = self.end - self.start
            self.view[:tail] = self.view[self.start : self.end]
            self.start, self.end = 0, tail
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.large is not None:
            self.filled += nbytes
            if self.filled == len(self.large):
                large, self.large = self.large, None
                self.deliver(memoryview(large), own=True)
            return
        self.end += nbytes
        while self.end - self.start >= LENGTH.size:
            (total,) = LENGTH.unpack_from(self.view, self.start)
            begin = self.start + LENGTH.size
            have = self.end - begin
            if total >= LARGE_FRAME_BYTES:  # into memory of its own
                if have >= total:  # all of it here already
                    self.start = begin + total
                    self.deliver(memoryview(bytearray(self.view[begin : self.start])), own=True)
                    continue
                self.large = bytearray(total)  # what has arrived of it, then the rest straight from the socket
                self.large[:have] = self.view[begin : self.end]
                self.filled = have
                self.start = self.end = 0
                return
            if have < total:
                break  # the rest of this frame is still to come
            self.start = begin + total
            self.deliver(self.view[begin : self.start], own=False)
        if self.start == self.end:
            self.start = self.end = 0

    def deliver(self, frame: memoryview, own: bool) -> None:
        try:
            self.received(unframe(frame, own))
        except Exception:
            logger.exception("a message of %d bytes could not be read or handled: it is dropped", len(frame))
