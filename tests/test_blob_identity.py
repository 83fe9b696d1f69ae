"""The blob store's once-per-file hash (restore within 1.5x a raw read): a blob is SHA-256 hashed on its first read,
later reads of the very same file skip the hash, and any write to the file (even one that restores the
size and the modification time) makes the next read hash it again and refuse changed bytes."""

from __future__ import annotations

import os
import time

import pytest

from db.blobs import BlobStore, identity
from errors import IntegrityError

DATA = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB, past one read chunk


def settled_store(tmp_path) -> tuple[BlobStore, str]:
    store = BlobStore(tmp_path / "blobs")
    store.racy_ns = 0  # the test waits out the file clock's tick itself (see tick())
    h = store.put(DATA)
    tick()
    return store, h


def tick() -> None:
    """Longer than one tick of the kernel's coarse file clock, so a later write gets another ctime."""
    time.sleep(0.05)


def test_second_read_of_an_unchanged_file_skips_the_hash_and_returns_the_same_bytes(tmp_path):
    store, h = settled_store(tmp_path)
    first = store.get(h)
    second = store.get(h)
    assert bytes(first) == bytes(second) == DATA
    assert store.hashed_reads == 1
    assert store.get(h, rehash=True) == first and store.hashed_reads == 2


def test_in_place_overwrite_with_size_and_mtime_restored_is_rehashed_and_refused(tmp_path):
    store, h = settled_store(tmp_path)
    store.get(h)
    p = store.path(h)
    st = os.stat(p)
    bad = bytearray(DATA)
    bad[len(bad) // 2] ^= 0x10
    tick()
    with open(p, "r+b") as f:  # same inode, same size
        f.write(bad)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # hide the write from size and mtime
    now = os.stat(p)
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert now.st_ctime_ns != st.st_ctime_ns  # what the identity check relies on: user space cannot set ctime
    with pytest.raises(IntegrityError, match=f"blob integrity check failed for {h}"):
        store.get(h)
    assert store.hashed_reads == 2
    with pytest.raises(IntegrityError):  # and it stays refused: nothing about the bad file was remembered
        store.get(h)


def test_file_replaced_by_another_with_the_old_times_is_refused(tmp_path):
    store, h = settled_store(tmp_path)
    store.get(h)
    p = store.path(h)
    st = os.stat(p)
    other = p.with_name("other")
    other.write_bytes(DATA[:-1] + b"X")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, p)
    with pytest.raises(IntegrityError):
        store.get(h)


def test_a_file_verified_inside_the_racy_window_is_hashed_again(tmp_path):
    store = BlobStore(tmp_path / "blobs")  # default window: a blob written just now is not trusted yet
    h = store.put(DATA)
    store.get(h)
    store.get(h)
    assert store.hashed_reads == 2
    assert time.time_ns() - identity(os.stat(store.path(h)))[4] < store.racy_ns


def test_a_deleted_and_rewritten_blob_is_hashed_again(tmp_path):
    store, h = settled_store(tmp_path)
    store.get(h)
    assert store.delete(h)
    assert store.put(DATA) == h
    tick()
    assert bytes(store.get(h)) == DATA and store.hashed_reads == 2
