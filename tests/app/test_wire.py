"""The frames between a front end and the engine (app/engine/wire.py): messages with arrays arrive whole and equal,
however the stream is cut, large ones into memory of their own."""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine.remote import EmbeddedRows, ScoredRows, packed, unpacked
from app.engine.wire import COUNTS, LARGE_FRAME_BYTES, LENGTH, FrameReader, frame
from model import EmbeddedTexts, ScoredTexts, Scores, TextEmbedding, score_rows, sentence_rows, token_rows
from tests.helpers import wait_until


def messages() -> list[Any]:
    rng = np.random.default_rng(0)
    return [
        ("task", 0, "tiny", {"ids": [[101, 7592, 102]]}, 30.0),
        (1, "ok", [rng.standard_normal(384).astype(np.float32) for _ in range(3)], (0.001, 0.002)),
        (2, "ok", {"attention": rng.standard_normal((6, 12, 128, 128)).astype(np.float32)}, (0.0, 0.1)),  # 4.7 MB
        (3, "error", ("Overloaded", "too many texts", None, {"Retry-After": "1"})),
        (4, "ok", [np.zeros(0, dtype=np.float32), np.arange(7, dtype=np.int64)[::2]], (0.0, 0.0)),  # empty, strided
        (5, "ok", [rng.standard_normal((70, 128)).astype(np.float16)], (0.0, 0.0)),
    ]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("seed", range(8))
def test_messages_arrive_whole_and_equal_however_the_stream_is_cut(seed: int) -> None:
    sent = messages() * 3
    random.Random(seed).shuffle(sent)
    stream = b"".join(b"".join(frame(message)) for message in sent)
    received: list[Any] = []
    reader = FrameReader(received.append, lambda _: None)
    cuts = random.Random(seed)
    position = 0
    while position < len(stream):  # as a socket fills the buffers it is given: any amount up to their size
        buffer = reader.get_buffer(-1)
        n = min(len(buffer), len(stream) - position, cuts.choice([1, 7, 100, 4096, 65536, 1 << 22]))
        buffer[:n] = stream[position : position + n]
        reader.buffer_updated(n)
        position += n
    assert len(received) == len(sent)
    assert all(same(a, b) for a, b in zip(sent, received, strict=True))


def test_a_large_answers_arrays_use_the_memory_it_was_read_into_aligned() -> None:
    (_, _, result, _) = messages()[2]
    received: list[Any] = []
    reader = FrameReader(received.append, lambda _: None)
    stream = b"".join(frame((2, "ok", result, (0.0, 0.0))))
    assert len(stream) > LARGE_FRAME_BYTES
    position = 0
    while position < len(stream):
        buffer = reader.get_buffer(-1)
        n = min(len(buffer), len(stream) - position)
        buffer[:n] = stream[position : position + n]
        reader.buffer_updated(n)
        position += n
    array = received[0][2]["attention"]
    assert np.array_equal(array, result["attention"])
    assert array.flags.aligned and array.flags.c_contiguous and array.flags.writeable
    assert not np.shares_memory(array, np.frombuffer(reader.scratch, dtype=np.uint8))


async def test_over_a_unix_socket_each_side_gets_what_the_other_sent(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    path = str(tmp_path / "socket")
    at_server: list[Any] = []
    replies: list[Any] = []
    closed = asyncio.Event()

    def server_side() -> FrameReader:
        def received(message: Any) -> None:
            at_server.append(message)
            wire.send(message)  # echoed

        wire = FrameReader(received, lambda _: None)
        return wire

    server = await loop.create_unix_server(server_side, path)
    client = FrameReader(replies.append, lambda _: closed.set())
    await loop.create_unix_connection(lambda: client, path)
    for message in messages():
        client.send(message)
    await wait_until(lambda: len(replies) >= len(messages()))
    assert all(same(a, b) for a, b in zip(messages(), at_server, strict=True))
    assert all(same(a, b) for a, b in zip(messages(), replies, strict=True))
    server.close()
    client.close()
    await asyncio.wait_for(closed.wait(), 5)
    with pytest.raises(ConnectionError):
        client.send(messages()[0])


class RecordingTransport(asyncio.WriteTransport):
    """A transport that keeps each write call's bytes, one entry a system call's worth."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []

    def write(self, data: Any) -> None:
        self.calls.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(b"".join(bytes(data) for data in list_of_data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.calls.append(b"<closed>")


def read_back(written: bytes) -> list[Any]:
    reader = FrameReader(lambda _: None, lambda _: None)
    got: list[Any] = []
    reader.received = got.append
    while written:  # fed in the reader's own buffers, as a socket would
        view = reader.get_buffer(len(written))
        n = min(len(view), len(written))
        view[:n] = written[:n]
        reader.buffer_updated(n)
        written = written[n:]
    return got


async def test_small_frames_of_one_turn_go_out_in_one_write_and_a_large_one_after_them_in_order() -> None:
    transport = RecordingTransport()
    wire = FrameReader(lambda _: None, lambda _: None)
    wire.connection_made(transport)
    small = [messages()[0], messages()[1], messages()[3]]
    for message in small:
        wire.send(message)
    assert transport.calls == []  # held until the turn ends
    await asyncio.sleep(0)
    assert len(transport.calls) == 1
    assert all(same(a, b) for a, b in zip(small, read_back(transport.calls[0]), strict=True))
    transport.calls.clear()
    wire.send(messages()[0])
    wire.send(messages()[2])  # 4.7 MB: at once, what was held written before it
    assert len(transport.calls) > 1
    assert all(
        same(a, b) for a, b in zip([messages()[0], messages()[2]], read_back(b"".join(transport.calls)), strict=True)
    )
    await asyncio.sleep(0)  # nothing left to write at the turn's end
    wire.send(messages()[5])
    wire.close()  # what is held goes out before the connection closes
    assert transport.calls[-1] == b"<closed>" and same(read_back(transport.calls[-2]), [messages()[5]])


def test_a_frame_that_cannot_be_read_is_dropped_and_the_next_one_arrives(caplog: pytest.LogCaptureFixture) -> None:
    """A pickle naming a module this process lacks (as a result type of a module a front end never imports would):
    that message is lost, logged, and the connection reads on."""
    bad = frame((7, "ok", Decimal("1.5"), (0.0, 0.0)))
    body = bytes(bad[2]).replace(b"decimal", b"nowhere")  # a pickle naming a module that does not exist
    assert body != bytes(bad[2])
    bad[0] = LENGTH.pack(COUNTS.size + len(body))
    bad[2] = body
    received: list[Any] = []
    reader = FrameReader(received.append, lambda _: None)
    stream = b"".join(bad) + b"".join(frame(messages()[1]))
    buffer = reader.get_buffer(-1)
    buffer[: len(stream)] = stream
    reader.buffer_updated(len(stream))
    assert len(received) == 1 and same(received[0], messages()[1])
    assert "could not be read" in caplog.text


def test_a_batched_kinds_answer_crosses_in_arrays_and_arrives_equal() -> None:
    """Embed and classify answers cross the wire as one array (two for classify) rather than an object and an array
    a text, and come back as the services take them; token vectors and the other kinds cross as they are."""
    rng = np.random.default_rng(1)
    sentences = rng.standard_normal((5, 8)).astype(np.float32)
    embedded = [TextEmbedding(row.copy()) for row in sentences]
    scored = [Scores(rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32)) for _ in range(4)]
    with_tokens = [TextEmbedding(sentences[0], rng.standard_normal((4, 8)).astype(np.float32))]
    logits, probabilities = rng.standard_normal((6, 3)).astype(np.float32), rng.random((6, 3)).astype(np.float32)
    tokens = rng.standard_normal((3, 8)).astype(np.float32)
    for kind, results, crossing in (
        ("embed", embedded, EmbeddedRows),
        ("classify", scored, ScoredRows),
        ("embed", with_tokens, list),
        ("embed", [], list),
        # a pass's own answers, as a request gets its slice of them
        ("embed", EmbeddedTexts(sentences)[1:5], EmbeddedRows),
        ("classify", ScoredTexts(logits, probabilities)[2:], ScoredRows),
        ("embed", EmbeddedTexts(sentences)[3:4], EmbeddedRows),  # however few: a lone text's row too
        ("classify", ScoredTexts(logits, probabilities)[5:], ScoredRows),
        ("embed", EmbeddedTexts(sentences, [None, tokens, None, None, None])[:4], EmbeddedTexts),
    ):
        sent = packed(kind, results)  # type: ignore[arg-type]
        assert isinstance(sent, crossing)
        received: list[Any] = []
        reader = FrameReader(received.append, lambda _: None)
        stream = b"".join(frame((0, "ok", sent, (0.0, 0.0))))
        buffer = reader.get_buffer(-1)
        buffer[: len(stream)] = stream
        reader.buffer_updated(len(stream))
        back = unpacked(received[0][2])
        assert len(back) == len(results)
        for a, b in zip(results, back, strict=True):
            assert type(a) is type(b)
            assert all(same(x, y) for x, y in zip(vars(a).values(), vars(b).values(), strict=True))
        if results and kind == "embed":  # the services read them as arrays
            assert same(sentence_rows(back), sentence_rows(list(results)))  # type: ignore[arg-type]
            assert all(same(x, y) for x, y in zip(token_rows(back), token_rows(list(results)), strict=True))  # type: ignore[arg-type]
        if kind == "classify":
            assert same(score_rows(back).probabilities, score_rows(list(results)).probabilities)  # type: ignore[arg-type]
