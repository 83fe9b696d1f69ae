"""Gives the heap that long prompts freed back to the operating system. glibc keeps what a thread's
arena freed for that arena's next use; a long prompt's activations (several threads' arenas when
answers run together) stayed resident after the answer: 20 long questions, 8 at a time, left the
real model's process at +20% RSS, and a long-running app kept climbing. `Trimmer` watches the RSS and
calls `malloc_trim(0)` when it has grown; it knows nothing of the model or the app (where there is no
glibc it does nothing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger("kvgraft.memory")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def rss_bytes() -> int:
    """This process's resident set now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def trim() -> bool:
    """Return the heap's free pages to the operating system; False where that is not possible."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class Trimmer(threading.Thread):
    """Every `period_s`, trims the heap when the RSS is `grow_bytes` past the lowest it has been (at start or
    after a trim): a trim walks every arena, a few milliseconds, so not after every request. The floor never
    ratchets up with what a trim could not free: a floor taken after each trim had let a run's freed heap
    (the abuse load test's, 545 MB) stay resident under a floor raised by memory in use at that trim."""

    def __init__(self, period_s: float = 10.0, grow_bytes: int = 64 * 2**20):
        super().__init__(name="kvgraft-trimmer", daemon=True)
        self.period_s, self.grow_bytes = period_s, grow_bytes
        self.trims = 0
        self._stop = threading.Event()
        self._floor = rss_bytes()

    def check(self) -> bool:
        """One look: trims when the RSS has grown past the floor; True when it trimmed."""
        if rss_bytes() < self._floor + self.grow_bytes or not trim():
            return False
        before = self._floor
        self._floor = min(before, rss_bytes())
        self.trims += 1
        log.debug("heap trimmed: RSS %d MB (floor was %d MB)", self._floor >> 20, before >> 20)
        return True

    def run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()


def start_trimmer(period_s: float = 10.0) -> Trimmer | None:
    """The process's trimmer, started; None where the heap cannot be trimmed."""
    if _TRIM is None or not rss_bytes():
        return None
    t = Trimmer(period_s)
    t.start()
    return t
