"""The content-addressed blob store: the only code that reads or writes artifact files.

Blobs live at `<root>/<aa>/<bb>/<sha256>.safetensors`. Writes go to a temporary file in the same
folder, are fsynced, then `os.replace`d into place, so a reader never sees a partial blob. Every read
re-hashes the bytes; a mismatch raises `IntegrityError` and nothing is recomputed silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from graft_core.errors import ArtifactNotFound, IntegrityError

SUFFIX = ".safetensors"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


_CHUNK = 4 << 20


def _read_hashed(f) -> tuple[bytearray, str]:
    """Read a whole file into one bytearray and SHA-256 it, hashing chunk i while reading chunk i+1.

    hashlib and readinto both release the GIL, so on a cold page cache the hash hides behind the
    disk read instead of following it."""
    size = os.fstat(f.fileno()).st_size
    data = bytearray(size)
    h = hashlib.sha256()
    pos = 0
    with memoryview(data) as view:
        if size <= 2 * _CHUNK:
            pos = f.readinto(view)
            h.update(view[:pos])
        else:
            with ThreadPoolExecutor(1, thread_name_prefix="blob-hash") as pool:
                pending = None
                while pos < size:
                    n = f.readinto(view[pos : pos + _CHUNK])
                    if not n:
                        break
                    if pending is not None:
                        pending.result()
                    pending = pool.submit(h.update, view[pos : pos + n])
                    pos += n
                if pending is not None:
                    pending.result()
    if pos != size:  # the file shrank under us: hand back what was read, the hash decides
        data = data[:pos]
    return data, h.hexdigest()


class BlobStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, content_hash: str) -> Path:
        if not _HEX64.match(content_hash or ""):
            raise ArtifactNotFound(f"{content_hash!r} is not a SHA-256 content hash (64 lowercase hex digits)")
        return self.root / content_hash[:2] / content_hash[2:4] / f"{content_hash}{SUFFIX}"

    def exists(self, content_hash: str) -> bool:
        return self.path(content_hash).exists()

    def put(self, data: bytes) -> str:
        """Store `data` atomically; returns its SHA-256. Storing the same bytes twice is free."""
        digest = sha256_bytes(data)
        target = self.path(digest)
        if target.exists():
            return digest
        with atomic_file(target) as f:
            f.write(data)
        return digest

    def get(self, content_hash: str) -> bytearray:
        """Read and verify. Raises ArtifactNotFound or IntegrityError (message says 'integrity').

        Returns a fresh `bytearray` the caller owns (codec.loads makes zero-copy tensors from it).
        """
        p = self.path(content_hash)
        try:
            with open(p, "rb") as f:
                data, actual = _read_hashed(f)
        except FileNotFoundError:
            raise ArtifactNotFound(
                f"blob {content_hash} is missing from {self.root}; run `cli.py fsck` to see what else is missing"
            ) from None
        if actual != content_hash:
            raise IntegrityError(
                f"blob integrity check failed for {content_hash}: its bytes hash to {actual}. "
                f"The file {p} is corrupt or was modified; restore it from a bundle or run `cli.py rebuild --verify`"
            )
        return data

    def delete(self, content_hash: str) -> bool:
        try:
            self.path(content_hash).unlink()
            return True
        except FileNotFoundError:
            return False

    def __iter__(self) -> Iterator[str]:
        for p in self.root.glob(f"??/??/*{SUFFIX}"):
            name = p.name[: -len(SUFFIX)]
            if _HEX64.match(name):
                yield name

    def partials(self) -> list[Path]:
        """Leftover temporary files from writes that were interrupted (never visible as blobs)."""
        return list(self.root.glob("??/??/.tmp-*.part"))

    def total_bytes(self) -> int:
        return sum(self.path(h).stat().st_size for h in self)
