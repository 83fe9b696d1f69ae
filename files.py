"""Atomic file writes, the one writer every layer uses (blobs, bundles, the vector index).

Dependency-free: a temporary file in the target's folder, fsynced, `os.replace`d into place, then the
folder fsynced so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_file(target: Path, prefix: str = ".tmp-") -> Iterator:
    """Write `target` through a temporary file in its folder: fsynced, then `os.replace`d into place.

    A reader sees the old file or the whole new one, never a partial one; on error the temporary
    file is removed and the error propagates."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(target: Path, data: bytes) -> None:
    """`atomic_file` for bytes already in memory."""
    with atomic_file(target) as f:
        f.write(data)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
