"""The heap a burst of work freed goes back to the operating system (web.memory), as after long prompts."""

from __future__ import annotations

import threading

import pytest

from web import memory

pytestmark = pytest.mark.skipif(memory._TRIM is None or not memory.rss_bytes(), reason="needs glibc and /proc")

MB = 2**20


def _churn(keep: list, together: threading.Barrier | None = None) -> None:
    """In a thread's own arena: 64 MB in 64 KB blocks (below mmap's threshold), all freed but the last,
    which pins the arena's top so that free() alone returns nothing. With `together`, every thread holds its
    64 MB before any frees: on a loaded machine the threads otherwise ran one after another and each reused
    the memory the one before had freed (one arena's worth resident instead of four)."""
    blocks = [bytearray(64 * 1024) for _ in range(1024)]
    if together is not None:
        together.wait(timeout=60)
    keep.append(blocks.pop())
    del blocks


def test_the_trimmer_returns_what_threads_freed():
    memory.trim()
    trimmer = memory.Trimmer(period_s=3600, grow_bytes=32 * MB)
    before = memory.rss_bytes()
    keep: list = []
    together = threading.Barrier(4)
    threads = [threading.Thread(target=_churn, args=(keep, together)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = memory.rss_bytes()
    assert held - before > 128 * MB, f"the churn should stay resident untrimmed: {before / MB:.0f} -> {held / MB:.0f} MB"
    assert trimmer.check() and trimmer.trims == 1
    after = memory.rss_bytes()
    assert after - before < 0.2 * (held - before), f"RSS {before / MB:.0f} -> {held / MB:.0f} -> {after / MB:.0f} MB"
    assert not trimmer.check()  # nothing grew since: no second trim


def test_the_trimmer_thread_trims_on_its_own():
    memory.trim()  # whatever an earlier test left
    trimmer = memory.Trimmer(period_s=0.05, grow_bytes=32 * MB)
    keep: list = []
    t = threading.Thread(target=_churn, args=(keep,))
    t.start()
    t.join()
    trimmer.start()
    try:
        for _ in range(100):
            if trimmer.trims:
                break
            threading.Event().wait(0.05)
    finally:
        trimmer.stop()
    assert trimmer.trims >= 1


def test_memory_in_use_at_a_trim_does_not_raise_the_floor_for_later_frees():
    memory.trim()
    trimmer = memory.Trimmer(period_s=3600, grow_bytes=96 * MB)
    before = memory.rss_bytes()
    held = [bytearray(64 * 1024) for _ in range(2048)]  # 128 MB in use, not freeable
    for b in held:
        b[::4096] = b"\x01" * len(b[::4096])  # touched: resident
    assert trimmer.check()  # grown past the floor; the trim frees nothing of what is in use
    keep: list = []
    t = threading.Thread(target=_churn, args=(keep,))
    t.start()
    t.join()
    churned = memory.rss_bytes()
    # 64 MB freed but resident: under the 96 MB growth from the RSS at the first trim, over it from the start
    assert trimmer.check(), f"{before / MB:.0f} -> {churned / MB:.0f} MB"
    after = memory.rss_bytes()
    assert after - before < 128 * MB + 0.3 * (churned - before - 128 * MB), (
        f"{before / MB:.0f} -> {churned / MB:.0f} -> {after / MB:.0f} MB"
    )
    del held
