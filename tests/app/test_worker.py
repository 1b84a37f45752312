"""The queue, the worker and the tokenisation stage on the tiny model: limits, isolation of failures, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Encoding

from app.engine.errors import ComputeFailed
from app.engine.messages import KeyMarks, Task
from app.engine.work_queue import LargePasses, QueueClosed, WorkQueue
from app.engine.worker import Worker
from app.errors import InvalidRequest
from app.serving.tokenization import Tokenization
from app.settings import Settings
from model import AttentionSelection, EmbeddingSpec, PackedTokens, TextEncoder, tasks
from tests.helpers import local_worker, serving, standing_in, wait_until

SPEC = EmbeddingSpec(layer=2, pooling="mean", normalize=True)
POISON = "need"  # a word of the tiny vocabulary that the failing stand-ins below refuse
# the passes themselves, which the stand-ins below call once they have done their part
EMBED, ATTEND, HEAD_STATISTICS = tasks.embed_texts, tasks.attention_maps, tasks.head_statistics


class FailingPasses:
    """The tiny model's passes, except that any pass holding the token POISON raises, as a broken kernel would
    (``standing_in``)."""

    def __init__(self, model: TextEncoder) -> None:
        self.poison_id = model.card.tokenizer.encode([POISON])[0].ids[1]
        self.passes: list[int] = []  # texts in each pass tried

    def _check(self, encodings: list[Encoding]) -> None:
        self.passes.append(len(encodings))
        if any(self.poison_id in e.ids for e in encodings):
            raise RuntimeError("the kernel failed")

    def embed_texts(self, model, encodings, specs):
        self._check(list(encodings))
        return EMBED(model, encodings, specs)

    def attention_maps(self, model, encoding, selection):
        self._check([encoding])
        return ATTEND(model, encoding, selection)


@pytest.fixture
def tokenize_executor() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=1)
    yield executor
    executor.shutdown()


def encode(model: TextEncoder, texts: list[str]) -> list[Encoding]:
    return model.card.tokenizer.encode(texts)


def embed(queue: WorkQueue, encodings: list[Encoding]) -> Coroutine[Any, Any, Sequence[Any]]:
    """A request's texts to embed (SPEC), as the services queue them."""
    return queue.run(Task("embed", encodings, SPEC))


async def attention(queue: WorkQueue, encoding: Encoding, selection: AttentionSelection) -> np.ndarray:
    (maps,) = await queue.run(Task("attention", [encoding], selection))
    return maps


TEXTS = [" ".join(["the quick brown fox"] * n) for n in (1, 5, 2, 8, 1, 3, 3, 1, 6, 2, 4, 1)]
REQUESTS = {  # the texts as requests: their indices into TEXTS
    "one-text-a-request": [(i, 1) for i in range(len(TEXTS))],
    "several-a-request": [(0, 5), (5, 1), (6, 4), (10, 2)],
    "several-packed": [(0, 5), (5, 1), (6, 4), (10, 2)],  # as they come from a front end (PackedTokens)
}


@pytest.mark.parametrize("requests_of", list(REQUESTS))
@pytest.mark.parametrize(
    ("max_batch_size", "max_batch_tokens"),
    [
        (4, 10_000),  # the size limit cuts
        (64, 60),  # the token budget cuts
        (3, 40),  # both
        (64, 8),  # texts longer than the budget: each alone in its pass
    ],
)
async def test_passes_keep_to_their_size_and_token_limits_and_each_request_gets_its_own_rows(
    tiny_model: TextEncoder,
    max_batch_size: int,
    max_batch_tokens: int,
    requests_of: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request is one entry of the queue: a pass takes the texts of as many as fit, the last one cut where the pass
    is full and its rest left for the next pass; every request gets exactly its own rows, in its order."""
    queue = WorkQueue(max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size)
    shapes: list[tuple[int, int]] = []  # (texts, longest) of each pass the model is given

    def recorded(model: TextEncoder, encodings: list[Encoding], specs: list[EmbeddingSpec]) -> Sequence[Any]:
        shapes.append((len(encodings), max(len(e.ids) for e in encodings)))
        return EMBED(model, encodings, specs)

    requests_texts = [TEXTS[i : i + k] for i, k in REQUESTS[requests_of]]

    def texts_of(texts: list[str]) -> Any:
        encodings = encode(tiny_model, texts)
        return PackedTokens.of(encodings) if requests_of == "several-packed" else encodings

    requests = [asyncio.ensure_future(queue.run(Task("embed", texts_of(t), SPEC))) for t in requests_texts]
    await wait_until(lambda: queue.pending() == len(TEXTS))
    monkeypatch.setattr(tasks, "embed_texts", recorded)
    worker = Worker(queue, tiny_model)  # to a full queue
    try:
        results = await asyncio.gather(*requests)
        lengths = [len(e.ids) for e in encode(tiny_model, TEXTS)]
        assert sum(rows for rows, _ in shapes) == len(TEXTS)
        assert max(rows for rows, _ in shapes) <= max_batch_size
        assert max(rows * longest for rows, longest in shapes) <= max(max_batch_tokens, max(lengths))
        assert len(shapes) > 1  # the limits did cut the queue into several passes
        assert worker.stats.texts == len(TEXTS) and queue.pending() == 0
        await wait_until(lambda: queue.computing() == 0)  # (the last pass ends just after its answers go)
        for texts, result in zip(requests_texts, results, strict=True):
            expected = tiny_model.embed(texts).numpy()  # the reference: the request's texts in one pass of their own
            assert len(result) == len(texts)
            np.testing.assert_allclose(np.stack([r.sentence for r in result]), expected, atol=1e-5)
    finally:
        worker.stop()


async def test_a_request_cancelled_while_a_slice_of_it_computes_leaves_the_rest_uncomputed(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first texts are computing when its client goes: the rest of its texts are dropped unseen (counted), and
    the request queued behind it gets exactly its own rows."""
    computing, release = threading.Event(), threading.Event()
    passes: list[int] = []

    def held(model: TextEncoder, encodings: list[Encoding], specs: list[EmbeddingSpec]) -> Sequence[Any]:
        passes.append(len(encodings))
        if len(passes) == 1:
            computing.set()
            release.wait(30)
        return EMBED(model, encodings, specs)

    dropped: list[int] = []
    queue = WorkQueue(max_batch_size=3, on_drop=dropped.append)
    monkeypatch.setattr(tasks, "embed_texts", held)
    worker = Worker(queue, tiny_model)
    try:
        first = asyncio.ensure_future(embed(queue, encode(tiny_model, [f"text {i}" for i in range(8)])))
        assert await asyncio.to_thread(computing.wait, 30)  # its first 3 texts computing, 5 queued
        second = asyncio.ensure_future(embed(queue, encode(tiny_model, ["the cat", "a dog"])))
        await wait_until(lambda: queue.pending() == 7)
        first.cancel()
        release.set()
        result = await second
        np.testing.assert_allclose(
            np.stack([r.sentence for r in result]), tiny_model.embed(["the cat", "a dog"]).numpy(), atol=1e-5
        )
        assert passes == [3, 2] and dropped == [5]  # nothing of the cancelled request's rest was computed
    finally:
        release.set()
        worker.stop()


class CountedWaits(threading.Condition):
    """A queue's condition that counts the waits begun on it. A lane that begins another wait after a put has
    looked at the queue again and chosen to wait: the test knows it without sleeping and seeing nothing happen."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1  # the lock is held
        return super().wait(timeout)


class Queued:
    """Requests of one text each put on a queue from the test's event loop (never answered: no worker)."""

    def __init__(self, queue: WorkQueue, model: TextEncoder) -> None:
        self.queue, self.model = queue, model
        self.requests: list[asyncio.Future] = []
        self.condition = queue._condition = CountedWaits()

    async def waiting(self, waits: int) -> None:
        """Until ``waits`` waits have begun on the queue's condition."""
        await wait_until(lambda: self.condition.waits >= waits)

    async def put(self, n: int, taken: bool = False) -> None:
        """Queue ``n`` requests; wait until they are queued, or with ``taken`` until a waiting lane took them."""
        before = self.queue.pending()
        self.requests += [asyncio.ensure_future(embed(self.queue, encode(self.model, ["a text"]))) for _ in range(n)]
        await wait_until(lambda: self.queue.pending() == (0 if taken else before + n))

    async def one_pass_of_four_computing(self) -> None:
        """8 texts, taken as two passes of 4 (two lanes), the first of them finished."""
        await self.put(8)
        assert (await taken(self.queue), await taken(self.queue)) == (4, 4)
        self.queue.finished(4)


@contextmanager
def queueing(model: TextEncoder, **options: Any) -> Iterator[Queued]:
    """A ``WorkQueue(**options)`` to put requests on; they are cancelled at the end."""
    queued = Queued(WorkQueue(**options), model)
    try:
        yield queued
    finally:
        for request in queued.requests:
            request.cancel()


async def taken(queue: WorkQueue) -> int:
    """How many entries the next pass takes (0 if none within 5 s), taken off the event loop as a worker does."""
    batch = await asyncio.to_thread(queue.take, 5)
    return len(batch or [])


async def test_with_two_lanes_each_pass_takes_its_fair_share(tiny_model: TextEncoder) -> None:
    with queueing(tiny_model, lanes=2, balance_wait=5.0) as queued:
        queue = queued.queue
        await queued.put(12)
        first = await taken(queue)
        second = await taken(queue)  # 6 computing, 6 queued: its share is there, no wait
        assert (first, second, queue.computing()) == (6, 6, 12)
        queue.finished(6)
        queue.finished(6)
        await queued.put(3)
        assert await taken(queue) == 2  # nothing computing: half, rounded up
        assert await asyncio.wait_for(taken(queue), 2) == 1  # the rest at once: no wait for a text to pair it
        queue.finished(2)
        queue.finished(1)
    with queueing(tiny_model) as alone:
        await alone.put(12)
        assert await taken(alone.queue) == 12  # one lane takes all it may


async def test_a_model_that_computes_fewer_passes_at_once_than_the_lanes_shares_by_those(
    tiny_model: TextEncoder,
) -> None:
    """Three lanes, a model whose passes compute two side by side (OpenVINO's streams): a lone request's texts go in
    two passes, not three, the last of which would compute alone on one stream while the other idled."""
    with queueing(tiny_model, lanes=3, passes=2, balance_wait=5.0) as queued:
        queue = queued.queue
        await queued.put(12)
        first = await taken(queue)
        second = await taken(queue)  # 6 computing, 6 queued: its share, half of 12, is there
        assert (first, second, queue.computing(), queue.pending()) == (6, 6, 12, 0)
        queue.finished(6)
        queue.finished(6)
    with queueing(tiny_model, lanes=3, balance_wait=5.0) as queued:
        await queued.put(12)
        assert await taken(queued.queue) == 4  # three lanes, three passes computing side by side: a third
    with queueing(tiny_model, lanes=2, passes=5) as queued:
        assert queued.queue.passes == 2  # never more than the lanes


async def test_a_free_lane_waits_for_about_as_many_texts_as_the_pass_computing(tiny_model: TextEncoder) -> None:
    with queueing(tiny_model, lanes=2, balance_wait=5.0) as queued:
        queue = queued.queue
        await queued.one_pass_of_four_computing()
        await queued.put(1)
        waits = queued.condition.waits
        taking = asyncio.ensure_future(taken(queue))
        await queued.waiting(waits + 1)
        assert not taking.done()  # one text queued beside a pass of 4: the lane waits
        await queued.put(1)
        await queued.waiting(waits + 2)  # it looked again
        assert not taking.done()  # two: still short of half of the 6 queued and computing
        await queued.put(1, taken=True)
        assert await asyncio.wait_for(taking, 5) == 3  # 3 of 7: the share, rounded down, has come
        queue.finished(4)
        await queued.put(1)
        waits = queued.condition.waits
        taking = asyncio.ensure_future(taken(queue))
        await queued.waiting(waits + 1)
        assert not taking.done()  # 1 queued beside a pass of 3
        queue.finished(3)  # the other pass ends: nothing left to balance with, the lane takes what there is
        assert await asyncio.wait_for(taking, 5) == 1
        queue.finished(1)


async def test_a_pass_is_alone_only_with_nothing_queued_and_no_other_pass_taken(tiny_model: TextEncoder) -> None:
    """What the worker tells the compute lanes: only a pass that is alone may take every thread."""
    with queueing(tiny_model, lanes=2, balance_wait=5.0) as queued:
        queue = queued.queue
        await queued.put(2)
        first = await asyncio.to_thread(queue.take, 5) or []
        assert len(first) == 1 and not queue.alone(first)  # one more is queued
        second = await asyncio.to_thread(queue.take, 5) or []
        assert len(second) == 1 and not queue.alone(second)  # the first is taken, its pass not finished
        queue.finished(len(first))
        assert queue.alone(second)


async def test_a_lingering_lane_whose_entries_another_lane_took_waits_again(tiny_model: TextEncoder) -> None:
    with queueing(tiny_model, lanes=2, max_wait=0.3) as queued:
        queue = queued.queue
        await queued.put(1)
        first = asyncio.ensure_future(asyncio.to_thread(queue.take, 5))  # lingers 0.3 s, then takes the text
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(asyncio.to_thread(queue.take, 1.0))  # lingers until 0.4 s
        assert len(await first or []) == 1
        queue.finished(1)  # wakes the second while it lingers, with nothing queued
        assert await second == []  # nothing came within its timeout


async def test_a_free_lane_waits_for_its_share_no_longer_than_the_balance_wait(tiny_model: TextEncoder) -> None:
    with queueing(tiny_model, lanes=2, balance_wait=0.2) as queued:
        await queued.one_pass_of_four_computing()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await queued.put(1)
        assert await taken(queued.queue) == 1 and loop.time() - started >= 0.15


async def test_a_failing_pass_fails_only_the_request_that_breaks_it(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = FailingPasses(tiny_model)
    standing_in(failing, monkeypatch)
    queue = WorkQueue()
    good = [["the quick brown fox"], ["a lazy dog", "the cat sat"], ["hello world"]]
    bad = ["the mat", f"a {POISON} text"]
    requests = [asyncio.ensure_future(embed(queue, encode(tiny_model, t))) for t in good]
    poisoned = asyncio.ensure_future(embed(queue, encode(tiny_model, bad)))
    await wait_until(lambda: queue.pending() == 6)
    worker = Worker(queue, tiny_model)  # to a queue that holds them all
    try:
        for texts, request in zip(good, requests, strict=True):
            result = await request
            np.testing.assert_allclose(
                np.stack([r.sentence for r in result]), tiny_model.embed(texts).numpy(), atol=1e-5
            )
        with pytest.raises(ComputeFailed):
            await poisoned
        assert failing.passes == [6, 1, 2, 1, 2]  # the merged pass, then each request alone
        # The thread survived: later work is answered.
        after = await embed(queue, encode(tiny_model, ["the quick brown fox"]))
        np.testing.assert_allclose(after[0].sentence, tiny_model.embed(["the quick brown fox"]).numpy()[0], atol=1e-5)
        assert worker.alive()
    finally:
        worker.stop()


async def test_a_failing_attention_pass_fails_its_request_and_the_thread_goes_on(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    standing_in(FailingPasses(tiny_model), monkeypatch)
    queue = WorkQueue()
    worker = Worker(queue, tiny_model)
    try:
        selection = AttentionSelection(layers=(0, 1), heads=(0,))
        with pytest.raises(ComputeFailed):
            await attention(queue, encode(tiny_model, [POISON])[0], selection)
        maps = await attention(queue, encode(tiny_model, ["the cat"])[0], selection)
        assert maps.shape == (2, 1, 4, 4)
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
        assert worker.alive()
    finally:
        worker.stop()


class SlicedPasses:
    """The tiny model's passes (``standing_in``), whose head statistics record the name of each slice they are asked
    for (``slices``), raise for the slice "bad 0", and wait for ``release`` on the slice "first"."""

    def __init__(self, model: TextEncoder) -> None:
        self.model = model
        self.calls: list[str] = []
        self.names: dict[int, str] = {}  # id of a slice's texts → its name
        self.release = threading.Event()
        self.release.set()

    def slices(self, *names: str) -> list[Task]:
        """One head-statistics task a name, each of one short text."""
        tasks = []
        for name in names:
            encodings = self.model.card.tokenizer.encode(["the cat"])
            self.names[id(encodings)] = name
            marks = np.zeros((1, len(encodings[0].ids)), dtype=bool)
            tasks.append(Task("head_statistics", encodings, KeyMarks(marks, marks)))
        return tasks

    def embed_texts(self, model, encodings, specs):
        self.calls.append("embed")
        return EMBED(model, encodings, specs)

    def head_statistics(self, model, encodings, separators, punctuation):
        name = self.names[id(encodings)]
        self.calls.append(name)
        if name == "bad 0":
            raise RuntimeError("the kernel failed")
        if name == "first":
            assert self.release.wait(30)
        return HEAD_STATISTICS(model, encodings, separators, punctuation)


async def test_inspection_slices_run_between_other_passes_and_a_failing_slice_fails_only_its_request(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inspection requests of several slices each (queued in turn), an embedding request queued between them:
    the passes take turns, and when one slice raises, that request gets a 503 and its remaining slices are never
    computed, while the others are answered."""
    queue = WorkQueue()
    sliced = SlicedPasses(tiny_model)
    standing_in(sliced, monkeypatch)
    good = asyncio.ensure_future(queue.run_in_turn(sliced.slices("good 0", "good 1")))
    embedded = asyncio.ensure_future(embed(queue, encode(tiny_model, ["a", "b"])))
    bad = asyncio.ensure_future(queue.run_in_turn(sliced.slices("bad 0", "bad 1")))
    await wait_until(lambda: queue.pending() == 4)
    worker = Worker(queue, tiny_model)  # to a queue that holds them all
    try:
        parts = await good
        assert [part.shape[1] for part in parts] == [1, 1]  # each slice's statistics, one text each
        assert len(await embedded) == 2
        with pytest.raises(ComputeFailed):
            await bad
        # in arrival order; the good request's second slice queued once its first was done; the failed request's
        # second slice never queued
        assert sliced.calls == ["good 0", "embed", "bad 0", "good 1"]
        assert len(await queue.run_in_turn(sliced.slices("after"))) == 1
        assert worker.alive()
    finally:
        worker.stop()


async def test_slices_inspected_in_turn_let_requests_that_arrive_meanwhile_go_first(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large inspection request (its slices queued one after the other) does not hold the model for its
    whole length: a request arriving while its first slice computes is computed before its second."""
    queue = WorkQueue()
    sliced = SlicedPasses(tiny_model)
    standing_in(sliced, monkeypatch)
    sliced.release.clear()
    worker = Worker(queue, tiny_model)
    try:
        inspection = asyncio.ensure_future(queue.run_in_turn(sliced.slices("first", "second")))
        await wait_until(lambda: sliced.calls == ["first"])  # the first slice is computing
        arriving = asyncio.ensure_future(embed(queue, encode(tiny_model, ["a late request"])))
        await wait_until(lambda: queue.pending() == 1)
        sliced.release.set()
        assert len(await inspection) == 2
        assert len(await arriving) == 1
        assert sliced.calls == ["first", "embed", "second"], "the request that came meanwhile ran before the second"
    finally:
        sliced.release.set()
        worker.stop()


async def test_an_attention_entry_runs_alone_between_embedding_passes(tiny_model: TextEncoder) -> None:
    queue = WorkQueue()
    passes: list[int] = []  # texts of each embedding pass, as the metrics are told
    selection = AttentionSelection(layers=(1,), heads=(0, 1))
    before = asyncio.ensure_future(embed(queue, encode(tiny_model, ["a", "b"])))
    maps = asyncio.ensure_future(attention(queue, encode(tiny_model, ["the dog"])[0], selection))
    after = asyncio.ensure_future(embed(queue, encode(tiny_model, ["c"])))
    await wait_until(lambda: queue.pending() == 4)
    worker = Worker(queue, tiny_model, on_pass=lambda texts, tokens, seconds: passes.append(texts))
    try:
        await asyncio.gather(before, maps, after)
        assert passes == [2, 1]  # the attention entry cut the embedding entries in two
        assert (await maps).shape == (1, 2, 4, 4)
    finally:
        worker.stop()


async def test_entries_of_a_request_that_is_gone_are_never_computed(tiny_model: TextEncoder) -> None:
    dropped: list[int] = []
    queue = WorkQueue(on_drop=dropped.append)
    passes: list[int] = []
    kept = asyncio.ensure_future(embed(queue, encode(tiny_model, ["kept"])))
    gone = asyncio.ensure_future(embed(queue, encode(tiny_model, ["x", "y", "z"])))
    await wait_until(lambda: queue.pending() == 4)
    gone.cancel()
    await asyncio.sleep(0)
    worker = Worker(queue, tiny_model, on_pass=lambda texts, tokens, seconds: passes.append(texts))
    try:
        await kept
        assert passes == [1] and dropped == [3]
    finally:
        worker.stop()


async def test_the_worker_finishes_queued_work_when_stopped_then_refuses_more(tiny_model: TextEncoder) -> None:
    queue = WorkQueue()
    requests = [asyncio.ensure_future(embed(queue, encode(tiny_model, ["the quick brown fox"] * 3))) for _ in range(5)]
    await wait_until(lambda: queue.pending() == 15)
    worker = Worker(queue, tiny_model)
    stopping = asyncio.ensure_future(asyncio.to_thread(worker.stop))  # at once: what is queued is still computed
    results = await asyncio.gather(*requests)
    await stopping
    assert [len(r) for r in results] == [3] * 5 and not worker.alive()
    with pytest.raises(QueueClosed):
        await embed(queue, encode(tiny_model, ["late"]))


async def test_the_idle_hook_runs_once_the_queue_has_emptied_after_work(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.engine.worker.IDLE_INTERVAL_S", 0.05)
    idle = threading.Event()
    queue = WorkQueue()
    worker = Worker(queue, tiny_model, on_idle=idle.set)
    try:
        assert not await asyncio.to_thread(idle.wait, 0.3)  # no work yet: nothing to hand back
        await embed(queue, encode(tiny_model, ["work"]))
        assert await asyncio.to_thread(idle.wait, 5)
    finally:
        worker.stop()


async def test_the_settled_hook_runs_once_a_quiet_spell_follows_a_burst(
    tiny_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the idle hook, once SETTLE_AFTER_S pass without work: the settled hook (the model's compiled passes
    hand back their buffers), then the idle hook again; once a burst, and never while there is work."""
    monkeypatch.setattr("app.engine.worker.IDLE_INTERVAL_S", 0.05)
    monkeypatch.setattr("app.engine.worker.SETTLE_AFTER_S", 0.3)
    events: list[tuple[str, float]] = []
    settled = threading.Semaphore(0)

    def on_settled() -> None:
        events.append(("settled", time.monotonic()))
        settled.release()

    queue = WorkQueue()
    worker = Worker(queue, tiny_model, on_idle=lambda: events.append(("idle", time.monotonic())), on_settled=on_settled)
    try:
        for burst in range(2):
            await embed(queue, encode(tiny_model, [f"burst {burst}"]))
            done = time.monotonic()
            assert await asyncio.to_thread(settled.acquire, True, 10)
            kinds = [kind for kind, _ in events]
            last = len(kinds) - 1 - kinds[::-1].index("settled")
            assert kinds[last - 1] == "idle" and kinds.count("settled") == burst + 1, kinds
            assert events[last][1] - done >= 0.3 - 0.01  # quiet for SETTLE_AFTER_S first
            await wait_until(lambda: [kind for kind, _ in events][-1] == "idle")  # and trimmed after it
    finally:
        worker.stop()


class Panic(BaseException):
    """What a panic inside the Rust tokenizer arrives as (pyo3's PanicException is a BaseException)."""


@pytest.mark.parametrize("inline", [True, False], ids=["on-the-loop", "on-the-thread"])
@pytest.mark.parametrize("failure", [TypeError, Panic])
async def test_tokenization_merges_requests_of_one_turn_and_confines_failures(
    tiny_model: TextEncoder,
    tokenize_executor: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
    inline: bool,
    failure: type[BaseException],
) -> None:
    monkeypatch.setattr("app.serving.tokenization.INLINE_CHARACTERS", 4096 if inline else 0)
    calls: list[int] = []
    threads: set[str] = set()
    real = tiny_model.card.tokenizer

    class Tokenizer:
        """The tiny tokenizer, refusing any batch that holds the word POISON."""

        max_tokens = real.max_tokens

        def encode_unchecked(self, texts, pairs=None, truncate=True, special_tokens=True, left=False, token_text=True):
            calls.append(len(texts))
            threads.add(threading.current_thread().name)
            if any(POISON in text for text in texts):
                raise failure("cannot take this text")
            return real.encode_unchecked(texts, pairs, truncate, special_tokens, left, token_text)

        def check_lengths(self, encodings):
            return real.check_lengths(encodings)

    stage = Tokenization(Tokenizer(), tokenize_executor)  # type: ignore[arg-type]
    results = await asyncio.gather(
        stage.encode(["the cat"]),
        stage.encode(["a dog", f"the {POISON}"]),
        stage.encode(["hello world", "the mat"], ["a", None]),
        stage.encode(["the " * 100], truncate=False, param="text", indexed=False),
        return_exceptions=True,
    )
    assert isinstance(results[0], list) and isinstance(results[2], list)
    assert [e.ids for e in results[0]] == [e.ids for e in real.encode(["the cat"])]
    assert isinstance(results[1], InvalidRequest) and results[1].param == "texts[1]"
    assert [e.type_ids for e in results[2]] == [
        e.type_ids for e in real.encode(["hello world", "the mat"], ["a", None])
    ]
    assert isinstance(results[3], InvalidRequest) and results[3].param == "text"
    assert "102 tokens, more than the maximum of 64" in results[3].message
    # One merged call for the truncating requests (5 texts), which failed: then each request alone, then
    # the poisoned one's texts one by one to name the culprit; the non-truncating request had its own call.
    assert calls == [5, 1, 2, 1, 1, 2, 1]
    assert (threads == {threading.main_thread().name}) is inline  # small turns stay on the event loop


def test_spec_changes_are_reflected_in_results(tiny_model: TextEncoder) -> None:
    encodings = encode(tiny_model, ["the quick brown fox", "a lazy dog"])
    plain = EMBED(tiny_model, encodings, [SPEC, SPEC])
    mixed = EMBED(
        tiny_model,
        encodings,
        [replace(SPEC, layer=0, pooling="cls", normalize=False), replace(SPEC, token_vectors=True)],
    )
    np.testing.assert_allclose(mixed[1].sentence, plain[1].sentence, atol=1e-6)
    assert mixed[1].tokens is not None and mixed[1].tokens.shape == (len(encodings[1].ids), 16)
    expected_cls = tiny_model.embed(["the quick brown fox"], pooling="cls", normalize_embeddings=False, layer=0)
    np.testing.assert_allclose(mixed[0].sentence, expected_cls.numpy()[0], atol=1e-6)


async def test_a_model_that_fails_its_warm_up_is_reported_with_its_name_and_directory(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: TextEncoder) -> None:
        raise IndexError("index out of range in self")

    monkeypatch.setattr(TextEncoder, "warm_up", broken)
    failures: list[str] = []
    async with serving(Settings(model_dir=tiny_model_dir), ready=False, on_load_failure=failures.append):
        await wait_until(lambda: bool(failures))
    assert failures == [f"cannot serve model '{tiny_model_dir.name}' from {tiny_model_dir}: index out of range in self"]


async def test_health_fails_if_an_inference_thread_has_stopped(tiny_model: TextEncoder) -> None:
    async with serving(Settings(), tiny_model) as service:
        assert (await service.client.get("/health")).status_code == 200
        await asyncio.to_thread(local_worker(service.model).stop)
        response = await service.client.get("/health")
        assert response.status_code == 503 and response.json()["error"]["type"] == "not_ready"
        assert "inference thread" in response.json()["error"]["message"]
        encode = await service.client.post("/encode", json={"texts": "after"})
        assert encode.status_code == 503


def test_every_kind_of_task_is_declared_once_and_its_options_checked() -> None:
    """Each task kind has one declaration (app/engine/messages.py, ``KINDS``): whether it is batched, its options'
    type, its pass; a task given the wrong options is refused where it is made, not in the engine."""
    from typing import get_args

    from app.engine.messages import KINDS, TaskKind

    assert set(KINDS) == set(get_args(TaskKind))
    assert {kind for kind, declared in KINDS.items() if declared.batched} == {
        "embed",
        "classify",
        "sparse",
        "multi_vector",
    }
    assert Task("embed", [], SPEC).batched and not Task("attention", [], AttentionSelection((0,), (0,))).batched
    assert Task("classify").options is None
    with pytest.raises(TypeError, match="a task of kind 'classify' takes no options, not EmbeddingSpec"):
        Task("classify", [], SPEC)
    with pytest.raises(TypeError, match="a task of kind 'neuron' takes HeadChoice, not AttentionSelection"):
        Task("neuron", [], AttentionSelection((0,), (0,)))
    with pytest.raises(TypeError, match="a task of kind 'embed' takes EmbeddingSpec, not NoneType"):
        Task("embed", [])


class LargeAndSmall:
    """Stand-in passes (``standing_in``): attention takes 0.3 s and embedding is quick; it counts the attention
    passes computing at once and when each pass ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.computing = self.most = 0
        self.ended: list[tuple[str, float]] = []

    def attention_maps(self, model: TextEncoder, encoding: Encoding, selection: AttentionSelection) -> np.ndarray:
        with self.lock:
            self.computing += 1
            self.most = max(self.most, self.computing)
        time.sleep(0.3)
        with self.lock:
            self.computing -= 1
            self.ended.append(("attention", time.monotonic()))
        return np.zeros(1)

    def embed_texts(self, model: TextEncoder, encodings: list[Encoding], specs: list[EmbeddingSpec]) -> Sequence[Any]:
        results = EMBED(model, encodings, specs)
        with self.lock:
            self.ended.append(("embed", time.monotonic()))
        return results


@pytest.fixture
def three_lanes() -> Iterator[None]:
    from app.engine.compute import COMPUTE

    before = COMPUTE.lanes
    COMPUTE.configure(3)
    yield
    COMPUTE.configure(before)


@pytest.mark.parametrize("places", [1, 2])
async def test_large_passes_compute_at_most_so_many_at_once_and_embeddings_go_on_beside_them(
    tiny_model: TextEncoder, three_lanes: None, places: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = LargeAndSmall()
    standing_in(model, monkeypatch)
    queue = WorkQueue(lanes=3, large_passes=LargePasses(places))
    worker = Worker(queue, tiny_model, threads=3)
    selection = AttentionSelection(layers=(0,), heads=(0,))
    try:
        (text,) = encode(tiny_model, ["the cat sat"])
        inspections = [asyncio.ensure_future(attention(queue, text, selection)) for _ in range(4)]
        await wait_until(lambda: model.computing == places)
        embeddings = [asyncio.ensure_future(embed(queue, [text])) for _ in range(3)]
        await asyncio.gather(*inspections, *embeddings)
    finally:
        worker.stop()
    assert model.most == places  # three lanes and four waiting: the gate alone held them to ``places``
    last_embedding = max(at for kind, at in model.ended if kind == "embed")
    assert sorted(at for kind, at in model.ended if kind == "attention")[-1] > last_embedding  # not held up
    assert queue.large_passes.running == 0


async def test_a_large_pass_waits_at_the_gate_that_every_queue_shares(tiny_model: TextEncoder) -> None:
    gate = LargePasses(1)
    first, second = WorkQueue(large_passes=gate), WorkQueue(large_passes=gate)  # two models' queues
    (text,) = encode(tiny_model, ["the cat sat"])
    selection = AttentionSelection(layers=(0,), heads=(0,))
    requests: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(attention(queue, text, selection)) for queue in (first, second)
    ]
    requests.append(asyncio.ensure_future(embed(second, [text])))
    await wait_until(lambda: first.pending() == 1 and second.pending() == 2)
    try:
        taken_first = await asyncio.to_thread(first.take, 5) or []
        assert [entry.kind for entry in taken_first] == ["attention"] and gate.running == 1
        behind = await asyncio.to_thread(second.take, 5) or []
        assert [entry.kind for entry in behind] == ["embed"]  # the attention ahead of it waits; the embedding need not
        assert second.alone(behind)  # what waits at the gate cannot start: the pass may take every thread
        assert await asyncio.to_thread(second.take, 0.3) == []  # nothing for it until the place is free
        waiting = asyncio.ensure_future(asyncio.to_thread(second.take, 5))
        first.finished(1, large=True)  # the place comes free: the waiting queue is woken and takes its attention
        assert [entry.kind for entry in await asyncio.wait_for(waiting, 5) or []] == ["attention"]
        assert gate.running == 1
    finally:
        for request in requests:
            request.cancel()


def test_loading_the_models_sets_the_large_passes_at_once_from_the_setting(tiny_model_dir: Path) -> None:
    from app.engine.work_queue import LARGE_PASSES
    from app.metrics import Metrics
    from app.serving.registry import load_registry

    try:
        registry = load_registry(Settings(model_dir=tiny_model_dir, inspection_passes=3), Metrics())
        registry.close()
        assert LARGE_PASSES.passes == 3
    finally:
        LARGE_PASSES.configure(1)  # as every other service of the session has it


async def test_a_closed_queue_whose_last_entry_waits_at_the_gate_waits_rather_than_spins(
    tiny_model: TextEncoder,
) -> None:
    gate = LargePasses(1)
    queue = WorkQueue(large_passes=gate)
    (text,) = encode(tiny_model, ["the cat sat"])
    request = asyncio.ensure_future(attention(queue, text, AttentionSelection(layers=(0,), heads=(0,))))
    await wait_until(lambda: queue.pending() == 1)
    assert gate.enter()  # another queue's large pass holds the place
    queue.close()  # shutting down: what is queued is still computed
    try:
        assert await asyncio.wait_for(asyncio.to_thread(queue.take, 0.3), 5) == []  # its timeout, not a spin
        waiting = asyncio.ensure_future(asyncio.to_thread(queue.take, 5))
        gate.leave()  # the place comes free: the closed queue is woken and hands its last entry out
        assert [entry.kind for entry in await asyncio.wait_for(waiting, 5) or []] == ["attention"]
    finally:
        request.cancel()


def test_a_request_answered_by_several_passes_gets_its_rows_in_order_whichever_pass_ends_first() -> None:
    """A request cut across passes gets each pass's slice (a view of the pass's arrays); once all are in, they are
    one answer in its texts' order, arrays joined, even when a later slice's pass ended first."""
    from app.engine.work_queue import Ticket
    from model import EmbeddedTexts, ScoredTexts

    loop = asyncio.new_event_loop()
    try:
        rng = np.random.default_rng(0)
        rows, tokens = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
        embedded = Ticket(loop, 5)
        assert not embedded.set(3, EmbeddedTexts(rows, [None, None, None, tokens, None])[3:])  # a later pass first
        assert embedded.set(0, EmbeddedTexts(rows)[:3])
        assert isinstance(embedded.results, EmbeddedTexts)
        np.testing.assert_array_equal(embedded.results.sentences, rows)
        assert [vectors is tokens for vectors in embedded.results.token_vectors or []] == [0, 0, 0, 1, 0]

        logits, probabilities = rng.standard_normal((4, 3)), rng.random((4, 3))
        scored = Ticket(loop, 4)
        assert not scored.set(1, ScoredTexts(logits, probabilities)[1:])
        assert scored.set(0, ScoredTexts(logits, probabilities)[:1])
        assert isinstance(scored.results, ScoredTexts)
        np.testing.assert_array_equal(scored.results.probabilities, probabilities)

        alone = Ticket(loop, 2)  # one pass's whole answer is the request's as it is
        answer = EmbeddedTexts(rows[:2])
        assert alone.set(0, answer) and alone.results is answer
        listed = Ticket(loop, 3)  # results that are not arrays are joined as a list
        assert not listed.set(2, ["c"]) and listed.set(0, ["a", "b"]) and listed.results == ["a", "b", "c"]
    finally:
        loop.close()
