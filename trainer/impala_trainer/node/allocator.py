"""glibc malloc settings for the learner's process: keep freed memory instead of returning it.

Every learner update allocates and frees the same large CPU tensors (a CNN batch as float is
~90 MB; its activations and gradients tens of MB more). glibc serves each of them with a fresh
mmap and returns it with munmap on free, so every update pays a page fault per 4 KiB page of
them again: measured on the Atari CNN, a 92 MB allocation plus its first fill cost 23-25 ms
that way and ~6 ms from a retained heap, about a fifth of a whole update. PyTorch's CPU tuning
guide gets the same effect by preloading jemalloc or tcmalloc; mallopt needs nothing installed.

One arena (M_ARENA_MAX=1) matters as much as no mmap: the learner runs in threads, and a
thread's own arena lives in mmap'd heaps that glibc shrinks (and re-faults) as well.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)

# mallopt parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

_applied = False


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (call early, before the learner's threads start).

    Returns False, changing nothing, where the C library is not glibc (musl, macOS).
    """
    global _applied
    if _applied:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = all(
        mallopt(param, value)
        for param, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_MAX, 0),  # large blocks come from the heap too ...
            (_M_TRIM_THRESHOLD, 2**31 - 1),  # ... and the heap's top is never given back
        )
    )
    if not ok:
        _log.warning("mallopt refused a setting; the learner keeps glibc's defaults")
    _applied = ok
    return ok
