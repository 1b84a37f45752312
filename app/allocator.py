"""The C allocator (glibc's malloc) bounded, so that what a burst of requests takes goes back to the system.

Measured with bench/soak.py (docs/benchmarks/memory.md, "The allocator bounded (CPU)"): under 16 clients sending
every endpoint, the service held 400-500 MiB more than when idle, and about 100 MiB of it after the load. Three of
glibc's habits are bounded here:

- each thread that allocates may get an arena of its own, up to eight a core (the service runs a dozen threads:
  compute lanes, inference and tokenisation threads, the event loop's pool, OpenVINO's), each keeping its freed
  blocks: two arenas are shared by all of them, so that a trim reaches what they free;
- its threshold for serving an allocation from a mapping of its own (returned on free) rises to the largest block
  freed so far, up to 32 MiB: fixed at 16 MiB, the large answers and inspection tensors are always returned, while
  a pass's activations (a few MiB for all-MiniLM-L6-v2) stay in the heap, reused pass after pass. At glibc's
  initial 128 KiB the service held half as much under load, but make bench's passes of 32 texts ran 0.68-0.79 times
  as fast (every activation mapped and faulted in afresh); MALLOC_MMAP_THRESHOLD_=131072 chooses that instead;
- a fixed mapping threshold also fixes the threshold above which free() hands the heap's top back to the system at
  its initial 128 KiB (glibc raises it to twice the mapping threshold only while that one rises by itself): each
  pass's activations, freed at the top of the heap, were handed back and faulted in again by the next pass (a pass
  of 32 texts on torch, all-MiniLM-L6-v2: 12,500-19,600 page faults, 1.09-1.17 times the time). It is bounded at
  32 MiB, twice the mapping threshold as glibc's own rule has it; what the heap holds beyond its size when ready
  the watch below hands back.

The environment's own MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ win, and other C
libraries are left alone.

Under a steady load the heap still grows: blocks freed between live ones cannot be reused for larger requests, and
glibc hands nothing back in the middle of its heap unless asked (a process computing passes of 1 to 64 texts one
after another, torch's pass: 431 MiB warmed up, 1,185 MiB after 200 passes, 441 MiB with malloc_trim after each).
So each process of the service watches its resident memory (``watch_heap``): once it has grown past its size when
ready by ENCODER_MEMORY_HEADROOM_MIB, the heap's free pages go back to the system (a trim: about 6 ms for
all-MiniLM-L6-v2's heap on 2 cores, faulted in again only as far as the next passes use them).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt's parameters (malloc.h)
BOUNDS = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 16 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, 32 * 2**20),
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, 2),
}


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc's own symbol: musl has a libc.so.6 too in some images)
    except (OSError, AttributeError):
        return None
    return libc


def bound_allocator() -> bool:
    """Apply BOUNDS to this process (from now on) and, through the environment, to the processes it starts (from
    their first allocation); whether glibc took them."""
    libc = _glibc()
    if libc is None:
        return False
    for variable, (parameter, value) in BOUNDS.items():
        if variable not in os.environ:
            os.environ[variable] = str(value)
            libc.mallopt(parameter, value)
    return True


def malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), which hands freed heap memory back to the system; None elsewhere."""
    libc = _glibc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def resident_bytes() -> int:
    """This process's resident memory (Linux's /proc/self/statm: pages, second field)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


# Where Debian, Ubuntu and Fedora put jemalloc's library (libjemalloc2; jemalloc)
JEMALLOC = tuple(
    f"{root}/libjemalloc.so.2"
    for root in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
)


def front_end_allocator(setting: str, candidates: tuple[str, ...] = JEMALLOC) -> str | None:
    """The shared library the front ends are started with preloaded (``ENCODER_FRONT_END_ALLOCATOR``), or None
    for the C library's own malloc: ``auto``, jemalloc's where it is installed; ``glibc``, none; else the path
    given, which must be a file (ValueError naming it otherwise).

    A front end's CPU goes to tokenising, parsing and writing answers, each a flurry of small allocations (a BERT
    tokenizer allocates a dozen blocks a word: its alignments, splits and pieces) that glibc's malloc serves from
    bins it keeps consolidating; jemalloc serves them from per-size slabs: a MiniLM text's tokenising 14.6-14.8
    against 22.4 µs, and under 16 clients × 32 texts the front ends' CPU a text 0.84 times
    (docs/benchmarks/host-path.md). The engine keeps glibc's, bounded and trimmed as this module's top says: its
    memory is the model's passes, measured under load with it."""
    if setting == "glibc":
        return None
    if setting == "auto":
        return next((path for path in candidates if os.path.isfile(path)), None)
    if not os.path.isfile(setting):
        raise ValueError(f"ENCODER_FRONT_END_ALLOCATOR: no shared library at {setting!r} (auto, glibc, or a path)")
    return setting


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
WATCH_INTERVAL_S = 0.2  # how often the watch reads the process's resident memory
TRIM_INTERVAL_S = 1.0  # and trims at most this often


class HeapWatch:
    """Hands the heap's free pages back whenever the process's resident memory is more than ``headroom`` bytes
    above its size when ready (``ready``), at most every ``every`` seconds: where what is alive is itself above that,
    a trim hands back little, and the pages it does hand back are faulted in again by the next passes."""

    def __init__(
        self,
        headroom: int,
        trim: Callable[[], None],
        resident: Callable[[], int] = resident_bytes,
        every: float = TRIM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.headroom = headroom
        self.trim = trim
        self.resident = resident
        self.every = every
        self.clock = clock
        self.floor: int | None = None  # resident bytes when ready; None before: nothing trimmed while models load
        self.last = -math.inf  # when it last trimmed
        self.trims = 0

    def ready(self) -> None:
        """The process is loaded and warm: trim, and measure from what is left."""
        self.trim()
        self.floor = self.resident()

    def look(self) -> bool:
        """Trim if above the headroom and not trimmed in the last ``every`` seconds; whether it did."""
        if self.floor is None or self.resident() <= self.floor + self.headroom or self.clock() < self.last + self.every:
            return False
        self.trim()
        self.trims += 1
        self.last = self.clock()
        return True


_WATCH: HeapWatch | None = None
_WATCH_LOCK = threading.Lock()


def watch_heap(headroom_mib: int) -> HeapWatch | None:
    """Start (once a process) the thread that keeps this process within ``headroom_mib`` of its size now, or
    measure again from now where it runs; None where glibc is not the C library, /proc cannot be read, or
    ``headroom_mib`` is 0 (which also stops a watch started before from trimming)."""
    global _WATCH
    trim = malloc_trim()
    with _WATCH_LOCK:
        if trim is None or headroom_mib <= 0:
            if _WATCH is not None:
                _WATCH.floor = None
            return None
        watch = _WATCH or HeapWatch(headroom_mib * 2**20, trim)
        watch.headroom = headroom_mib * 2**20
        try:
            watch.ready()
        except OSError as error:
            logger.warning(
                "the heap watch cannot read /proc/self/statm (%s); the heap is trimmed when idle only", error
            )
            return None
        if _WATCH is None:
            _WATCH = watch
            threading.Thread(target=_watch, args=(watch,), name="heap-watch", daemon=True).start()
        return watch


def _watch(watch: HeapWatch) -> None:
    while True:
        time.sleep(WATCH_INTERVAL_S)
        try:
            watch.look()
        except OSError:  # /proc unreadable: nothing to watch by
            logger.warning("the heap watch cannot read /proc/self/statm; it stops")
            return
