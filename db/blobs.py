"""The content-addressed blob store: the only code that reads or writes artifact files.

Blobs live at `<root>/<aa>/<bb>/<sha256>.safetensors`. Writes go to a temporary file in the same
folder, are fsynced, then `os.replace`d into place, so a reader never sees a partial blob. Every read
is checked: a file is SHA-256 hashed on its first read in this store object, and later reads skip the
hash only while the file's identity (device, inode, size, mtime, ctime) is the one its bytes were hashed
under; any write to the file changes its ctime, so changed bytes are always re-hashed. A mismatch
raises `IntegrityError` and nothing is recomputed silently (docs/RELIABILITY.md says what each check
catches and what it cannot).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from errors import ArtifactNotFound, IntegrityError
from files import atomic_file

SUFFIX = ".safetensors"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_CHUNK = 4 << 20
# A file whose ctime is this close to the moment it was verified is re-hashed on its next read: file
# times come from a coarse kernel clock, so a second write in the same tick could leave them unchanged
# (git's "racy timestamp" rule for its index).
RACY_NS = 2_000_000_000


def identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What any write through the file system changes: the same path holding other bytes differs here."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_plain(f, size: int) -> bytearray:
    data = bytearray(size)
    with memoryview(data) as view:
        pos = 0
        while pos < size and (n := f.readinto(view[pos:])):
            pos += n
    return data if pos == size else data[:pos]


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
    racy_ns = RACY_NS

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._verified: dict[str, tuple] = {}  # content hash -> identity of the file whose bytes hashed to it
        self._verified_lock = threading.Lock()
        self.hashed_reads = 0  # reads that ran SHA-256 (the rest were vouched for by an unchanged identity)

    def path(self, content_hash: str) -> Path:
        if not _HEX64.match(content_hash or ""):
            raise ArtifactNotFound(f"{content_hash!r} is not a SHA-256 content hash (64 lowercase hex digits)")
        return self.root / content_hash[:2] / content_hash[2:4] / f"{content_hash}{SUFFIX}"

    def exists(self, content_hash: str) -> bool:
        return self.path(content_hash).exists()

    def put(self, data: bytes) -> str:
        """Store `data` atomically; returns its SHA-256. Storing the same bytes twice is free."""
        return self.write(data)[0]

    def write(self, data: bytes) -> tuple[str, bool]:
        """`put`, also saying whether this call created the file (False: those bytes were stored already), so
        that a caller whose transaction then fails removes only a blob it made. An error (a full disk, an I/O
        error, also in the folder's fsync after the rename) leaves no file (files.atomic_file)."""
        digest = sha256_bytes(data)
        target = self.path(digest)
        if target.exists():
            return digest, False
        with atomic_file(target) as f:
            f.write(data)
        return digest, True

    def get(self, content_hash: str, rehash: bool = False) -> bytearray:
        """Read and verify. Raises ArtifactNotFound or IntegrityError (message says 'integrity').

        The bytes are SHA-256 hashed unless this store already hashed this very file (same identity,
        verified outside the racy window) and it is unchanged before and after the read; `rehash`
        always hashes. Returns a fresh `bytearray` the caller owns (codec.loads makes zero-copy
        tensors from it).
        """
        p = self.path(content_hash)
        try:
            with open(p, "rb") as f:
                before = identity(os.fstat(f.fileno()))
                trusted = not rehash and self._verified.get(content_hash) == before
                if trusted:
                    data = _read_plain(f, before[2])
                    trusted = identity(os.fstat(f.fileno())) == before and len(data) == before[2]
                    actual = content_hash if trusted else sha256_bytes(data)
                else:
                    data, actual = _read_hashed(f)
                after = identity(os.fstat(f.fileno()))
        except FileNotFoundError:
            raise ArtifactNotFound(
                f"blob {content_hash} is missing from {self.root}; run `cli.py fsck` to see what else is missing"
            ) from None
        if not trusted:
            self.hashed_reads += 1
        if actual != content_hash:
            with self._verified_lock:
                self._verified.pop(content_hash, None)
            raise IntegrityError(
                f"blob integrity check failed for {content_hash}: its bytes hash to {actual}. "
                f"The file {p} is corrupt or was modified; restore it from a bundle or run `cli.py rebuild --compare`"
            )
        if not trusted and after == before and time.time_ns() - after[4] > self.racy_ns:
            with self._verified_lock:
                self._verified[content_hash] = after
        return data

    def forget(self, content_hash: str | None = None) -> None:
        """Drop what this store remembers as hashed (one blob, or all): the next read hashes again."""
        with self._verified_lock:
            if content_hash is None:
                self._verified.clear()
            else:
                self._verified.pop(content_hash, None)

    def actual_sha256(self, content_hash: str) -> str | None:
        """What the file stored under `content_hash` hashes to now (None when it is missing), streamed:
        fsck compares it with the name without holding the blob in memory."""
        h = hashlib.sha256()
        try:
            with open(self.path(content_hash), "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except FileNotFoundError:
            return None
        return h.hexdigest()

    def delete(self, content_hash: str) -> bool:
        self.forget(content_hash)
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
