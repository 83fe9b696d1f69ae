"""Atomic file writes, the one writer every layer uses (blobs, bundles, the vector index), and what a write
that the disk refused means to the caller.

Dependency-free: a temporary file in the target's folder, fsynced, `os.replace`d into place, then the
folder fsynced so the rename itself survives a crash. `write_faults` turns a disk's refusal (no space,
an I/O error, a read-only file system) into one `StorageError` line naming the folder and what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from errors import WRITE_FAULTS, StorageError, storage_error


@contextlib.contextmanager
def atomic_file(target: Path, prefix: str = ".tmp-") -> Iterator:
    """Write `target` through a temporary file in its folder: fsynced, then `os.replace`d into place.

    A reader sees the old file or the whole new one, never a partial one; on error the temporary
    file is removed and the error propagates. When the folder's fsync fails after the rename (an I/O
    error), the renamed file is removed again: the caller was told the write failed, so no file it
    did not get may stay behind."""
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
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise


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


@contextlib.contextmanager
def write_faults(
    folder: object,
    action: str,
    needed_bytes: int = 0,
    outcome: str = "nothing was stored",
    elsewhere: str = "or move KVGRAFT_HOME to a larger disk",
) -> Iterator[None]:
    """Run a block of writes into `folder`; a write the disk refuses (ENOSPC, EDQUOT, EIO, EROFS) leaves it
    as one `StorageError` saying what to free or check, then `action`, and `outcome` (what the caller
    guarantees it left). A `StorageError` from a layer below (the catalog) keeps its folder and gets the
    caller's words. Any other error propagates unchanged."""
    try:
        yield
    except StorageError as exc:
        raise storage_error(exc.code, exc.folder or folder, action, needed_bytes, outcome, elsewhere) from exc
    except OSError as exc:
        if exc.errno not in WRITE_FAULTS:
            raise
        raise storage_error(exc.errno, folder, action, needed_bytes, outcome, elsewhere) from exc
