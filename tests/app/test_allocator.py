"""The heap watch (app/allocator.py): a process hands its heap's free pages back once it has grown past its size when
ready by the headroom."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.allocator import HeapWatch

MIB = 2**20


class Process:
    """A stand-in process: resident memory set by the test, a trim that leaves only what is alive."""

    def __init__(self, resident: int, alive: int) -> None:
        self.now, self.alive, self.trims = resident, alive, 0

    def resident(self) -> int:
        return self.now

    def trim(self) -> None:
        self.trims += 1
        self.now = self.alive


def test_nothing_is_trimmed_before_the_process_is_ready() -> None:
    process = Process(900 * MIB, 500 * MIB)
    watch = HeapWatch(100 * MIB, process.trim, process.resident)
    assert watch.look() is False
    assert process.trims == 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_trim_once_above_the_headroom_and_none_within_it() -> None:
    process = Process(500 * MIB, 500 * MIB)
    watch = HeapWatch(100 * MIB, process.trim, process.resident, every=1.0, clock=Clock())
    watch.ready()
    assert (process.trims, watch.floor) == (1, 500 * MIB)
    process.now = 600 * MIB  # at the headroom: within it
    assert watch.look() is False
    process.now = 601 * MIB
    assert watch.look() is True
    assert (process.trims, watch.trims, process.now) == (2, 1, 500 * MIB)


def test_what_is_alive_above_the_headroom_is_trimmed_at_most_once_a_second() -> None:
    process, clock = Process(500 * MIB, 500 * MIB), Clock()
    watch = HeapWatch(100 * MIB, process.trim, process.resident, every=1.0, clock=clock)
    watch.ready()
    process.now, process.alive = 800 * MIB, 700 * MIB  # 700 alive: a trim gets back 100
    assert watch.look() is True
    process.now = 790 * MIB
    clock.now += 0.9
    assert watch.look() is False
    clock.now += 0.1
    assert watch.look() is True
    assert (process.trims, process.now) == (3, 700 * MIB)
    process.now, process.alive = 900 * MIB, 500 * MIB  # the load is over: all of it goes back
    clock.now += 1.0
    assert watch.look() is True
    assert process.now == 500 * MIB


def test_the_watch_hands_a_fragmented_heap_back_to_the_system() -> None:
    """In a process of its own, with the service's allocator bounds: 256 MiB of 1 MiB blocks freed but for every
    32nd (so that glibc's own trim of the heap's top cannot return them) stays resident until the watch trims."""
    script = textwrap.dedent(
        """
        import threading, time
        from app.allocator import HeapWatch, _watch, bound_allocator, malloc_trim, resident_bytes
        assert bound_allocator()
        floor = resident_bytes()
        blocks = [bytearray(2**20) for _ in range(256)]
        kept = blocks[31::32]
        del blocks
        print(resident_bytes() - floor >> 20, flush=True)
        watch = HeapWatch(64 * 2**20, malloc_trim())
        watch.floor = floor  # as if ready before the blocks came and went
        threading.Thread(target=_watch, args=(watch,), daemon=True).start()
        deadline = time.monotonic() + 10
        while resident_bytes() - floor >= 64 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(resident_bytes() - floor >> 20, watch.trims, len(kept))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split("\n")[:2]
    assert int(before) > 200  # freed, but still resident
    grown, _, kept = map(int, after.split())
    assert kept == 8
    assert grown < 64  # the 8 kept blocks and little else (glibc handed it back by itself in a few runs of many)


def test_a_block_freed_at_the_heaps_top_stays_for_the_next_one() -> None:
    """In a process of its own, with the service's allocator bounds: an 8 MiB block (below the mapping threshold, so
    from the heap) allocated and freed twenty times, as a pass's activations are, is faulted in once, not each time
    (glibc's initial trim threshold of 128 KiB, which a fixed mapping threshold keeps, handed the heap's top back on
    every free: 2,048 page faults a block)."""
    script = textwrap.dedent(
        """
        import resource
        from app.allocator import bound_allocator
        assert bound_allocator()
        block = bytearray(8 * 2**20)
        del block  # the heap has grown to it once
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            block = bytearray(8 * 2**20)
            del block
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 2048  # 20 blocks of 2,048 pages each faulted in afresh would be 40,960


def test_loading_the_models_starts_the_watch_with_the_setting(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry starts the watch once its models are loaded and warm, with ENCODER_MEMORY_HEADROOM_MIB."""
    from app.metrics import Metrics
    from app.serving import registry as registries
    from app.settings import Settings

    asked: list[tuple[int, int]] = []  # (headroom, models loaded when asked)
    monkeypatch.setattr(registries, "watch_heap", lambda headroom: asked.append((headroom, 1)))
    registry = registries.load_registry(Settings(model_dir=tiny_model_dir, memory_headroom_mib=77), Metrics())
    try:
        assert asked == [(77, 1)]
    finally:
        registry.close()


def test_a_headroom_of_zero_stops_a_running_watch() -> None:
    from app import allocator

    watch = allocator.watch_heap(64)
    assert watch is not None and watch.floor is not None
    try:
        assert allocator.watch_heap(0) is None
        assert watch.floor is None and watch.look() is False
    finally:
        allocator.watch_heap(192)  # as the session's service runs it


def test_the_front_ends_allocator_auto_is_jemalloc_where_installed_and_a_path_must_be_a_file(tmp_path: Path) -> None:
    from app.allocator import front_end_allocator

    installed = tmp_path / "lib" / "libjemalloc.so.2"
    absent = str(tmp_path / "nowhere" / "libjemalloc.so.2")
    assert front_end_allocator("auto", (absent,)) is None  # not installed: the C library's own
    installed.parent.mkdir()
    installed.write_bytes(b"")
    assert front_end_allocator("auto", (absent, str(installed))) == str(installed)
    assert front_end_allocator("glibc", (str(installed),)) is None
    assert front_end_allocator(str(installed)) == str(installed)
    with pytest.raises(ValueError, match=r"ENCODER_FRONT_END_ALLOCATOR: no shared library at '.*nowhere.*'"):
        front_end_allocator(absent)


def test_a_preloaded_library_goes_first_for_the_processes_started_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from app.serve import preloaded

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with preloaded("/lib/a.so"):
        assert os.environ["LD_PRELOAD"] == "/lib/a.so"
        started = subprocess.run([sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"], text=True,
                                 capture_output=True, check=True)  # fmt: skip
    assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "/lib/b.so")
    with preloaded("/lib/a.so"):
        assert os.environ["LD_PRELOAD"] == "/lib/a.so:/lib/b.so"
    assert os.environ["LD_PRELOAD"] == "/lib/b.so"
    with preloaded(None):
        assert os.environ["LD_PRELOAD"] == "/lib/b.so"
    assert started.stderr.count("cannot be preloaded") == 1  # the child ran with it (the loader says it is absent)
