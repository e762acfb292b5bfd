"""Processes that read one trace after another keep the memory they free, instead of handing it back to the
kernel and page-faulting it in again for the next trace.

glibc's malloc returns large freed blocks (the ~1 MB chunks of JSON text, numpy columns, long lists) to the kernel
at once (munmap, heap trim), so the next trace touches fresh pages, one page fault each: about 15,000 for a 29 MB
trace, a tenth of its time spent in the kernel. Raising the trim and mmap thresholds keeps those pages for reuse;
a process then holds at most the peak of its largest trace, the peak it reached anyway. ``mallopt`` is reached
through :mod:`ctypes` because no kept library exposes it.

Only for processes lightning-perf owns (the ``report`` command and its pool workers), never a training process.
Where the C library has no ``mallopt`` (macOS, musl...), nothing changes.
"""

from __future__ import annotations

import ctypes

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 256 << 20  # free memory at the top of the heap kept up to this
MMAP_THRESHOLD_BYTES = 32 << 20  # blocks below this come from the heap (glibc's largest on 64-bit)


def keep_freed_memory() -> bool:
    """Make this process's allocator keep freed memory for reuse; False where it cannot be told (no mallopt)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no such symbol; Windows has no CDLL(None)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 when it took the value
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) & bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    )
