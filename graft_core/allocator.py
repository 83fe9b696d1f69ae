"""Where a process's large buffers live: glibc's allocation thresholds raised so that a freed artifact-sized
buffer is reused instead of mapped afresh. Decides where bytes live, never what is computed; knows nothing about
models. `graft_core.model.load` calls it (and re-exports both names).
"""

from __future__ import annotations

# glibc's malloc: allocations of at least this many bytes come from mmap, and free heap above the trim
# threshold goes back to the OS. See keep_large_buffers.
LARGE_BUFFER_BYTES = 128 << 20


def keep_large_buffers() -> bool:
    """Let this process reuse freed buffers up to LARGE_BUFFER_BYTES instead of getting fresh pages each time.

    By default glibc serves an allocation above 32 MiB with fresh mmap'd pages and unmaps them on free,
    so an artifact read over 32 MB faults and zeroes all its pages again unless the heap happens to hold
    a free block that large: reading a 40.9 MB artifact (4,096 tokens) took 7-62 ms across runs against
    8 ms for a 28.3 MB one, and 6-10 ms with this (bench.kernels `read_check`, `--no-large-buffers` for
    the before side). Raising the mmap and trim thresholds keeps such
    buffers in the heap for the next read. Cost: up to that much freed memory per malloc arena stays
    with the process instead of going back to the OS. Process-wide, like the pinned thread count;
    True when set, False where the C library has no mallopt (not glibc): nothing changes there. Bits
    are untouched: this decides where bytes live, not what is computed."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc <malloc.h>
    return bool(mallopt(m_mmap_threshold, LARGE_BUFFER_BYTES)) and bool(mallopt(m_trim_threshold, LARGE_BUFFER_BYTES))
