"""The C allocator (glibc's malloc) bounded, so that what a burst of requests takes goes back to the system.

Measured with bench/soak.py (docs/benchmarks/memory.md, "The allocator bounded (CPU)"): under 16 clients sending
every endpoint, the service held 400-500 MiB more than when idle, and about 100 MiB of it after the load. Two of
glibc's habits are bounded here:

- each thread that allocates may get an arena of its own, up to eight a core (the service runs a dozen threads:
  compute lanes, inference and tokenisation threads, the event loop's pool, OpenVINO's), each keeping its freed
  blocks: two arenas are shared by all of them, so that a trim reaches what they free;
- its threshold for serving an allocation from a mapping of its own (returned on free) rises to the largest block
  freed so far, up to 32 MiB: fixed at 16 MiB, the large answers and inspection tensors are always returned, while
  a pass's activations (a few MiB for all-MiniLM-L6-v2) stay in the heap, reused pass after pass. At glibc's
  initial 128 KiB the service held half as much under load, but make bench's passes of 32 texts ran 0.68-0.79 times
  as fast (every activation mapped and faulted in afresh); MALLOC_MMAP_THRESHOLD_=131072 chooses that instead.

The environment's own MALLOC_ARENA_MAX and MALLOC_MMAP_THRESHOLD_ win, and other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt's parameters (malloc.h)
BOUNDS = {"MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 16 * 2**20), "MALLOC_ARENA_MAX": (M_ARENA_MAX, 2)}


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
