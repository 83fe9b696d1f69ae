"""The kernels' build reads one translation unit (kernels/c/kernels.c and what it includes); the kernel
cache's key covers every file of it, so a change to any of them is a new build, never a stale library."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from kernels import build


def _included(path: Path, seen: set[Path]) -> set[Path]:
    """`path` and every file its quoted #include lines name, transitively (relative to the including file)."""
    seen.add(path)
    for name in re.findall(r'^#include "([^"]+)"', path.read_text(encoding="utf-8"), flags=re.M):
        child = (path.parent / name).resolve()
        assert child.is_file(), f"{path.name} includes {name}, which is not there"
        if child not in seen:
            _included(child, seen)
    return seen


def test_the_cache_key_covers_every_file_the_build_reads():
    read = _included(build.SOURCE.resolve(), set())
    assert {p.resolve() for p in build.sources()} == read, "kernels/c/ holds a file the build does not read, or the reverse"
    assert {p.name for p in read} >= {"kernels.c", "reference.c", "simd.h", "avx512.h", "avx2.h", "portable.h", "linear.c"}


def test_a_change_to_any_source_file_changes_the_key(tmp_path, monkeypatch):
    copy = tmp_path / "c"
    shutil.copytree(build.SOURCE_DIR, copy)
    monkeypatch.setattr(build, "SOURCE_DIR", copy)
    before = build.source_bytes()
    assert before == build.source_bytes()
    for p in build.sources():
        data = p.read_bytes()
        p.write_bytes(data + b"\n")
        assert build.source_bytes() != before, f"{p.relative_to(copy)} is not in the kernel cache's key"
        p.write_bytes(data)
    assert build.source_bytes() == before
    (copy / "arch" / "avx2.h").rename(copy / "arch" / "avx2x.h")  # a renamed file is another source
    assert build.source_bytes() != before
