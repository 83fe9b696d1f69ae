"""Security finding: bundle headers are screened before tarfile parses them (pax ReDoS, CVE-2024-6232,
and sparse members), the total follows the staging disk, and members stream to staging."""

import io
import tarfile
import time
import tracemalloc
from collections import namedtuple

import pytest

from db import bundles
from errors import StoreFull
from graft_core.errors import InvalidInput


def _member(name: str, data: bytes, fmt=tarfile.USTAR_FORMAT, **kw) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    return info.tobuf(format=fmt) + data + b"\0" * (-len(data) % 512)


def _tar(tmp_path, *members: bytes, end: bytes = b"\0" * 1024):
    path = tmp_path / "bundle.tar"
    path.write_bytes(b"".join(members) + end)
    return path


def _refused(tmp_path, path, match: str, limits=bundles.Limits()) -> float:
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    start = time.perf_counter()
    with pytest.raises(InvalidInput) as raised:
        bundles.stage(path, staging, limits)
    took = time.perf_counter() - start
    assert match in str(raised.value), str(raised.value)
    assert list(staging.iterdir()) == [], "a refused bundle staged something"
    return took


PLAIN = _member("manifest.json", b"{}")
REFUSAL = "not a regular file; kvgraft bundles hold plain ustar members only (write them with `cli.py export`)"


def test_a_pax_header_that_is_quadratic_for_tarfile_is_refused_before_it_parses(tmp_path):
    payload = b"0" * 16_000 + b" a"  # 3.11.7's pax regex backtracks on this: ~2.7 s here; 1 MB would take hours
    pax = _member("././@PaxHeader", payload, type=tarfile.XHDTYPE)
    path = _tar(tmp_path, pax, PLAIN)
    assert path.stat().st_size < 20_000
    took = _refused(tmp_path, path, f"bundle member 1 ('././@PaxHeader') is a pax extended header, {REFUSAL}")
    assert took < 0.5, f"the refusal took {took:.2f} s"


@pytest.mark.parametrize(
    "build,what",
    [
        (lambda: _member("manifest.json", b"{}", fmt=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}), "a pax extended header"),
        (lambda: _member("m\u00e9.json", b"{}", fmt=tarfile.PAX_FORMAT), "a pax extended header"),
        (lambda: _member("a" * 120, b"{}", fmt=tarfile.GNU_FORMAT), "a GNU long name header"),
        (lambda: _member("l", b"", fmt=tarfile.GNU_FORMAT, type=tarfile.SYMTYPE, linkname="x" * 120), "a GNU long link header"),
        (lambda: _member("zeros", b"", fmt=tarfile.GNU_FORMAT, type=tarfile.GNUTYPE_SPARSE), "a GNU sparse file"),
        (lambda: _member("link", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd"), "a symbolic link"),
        (lambda: _member("hard", b"", type=tarfile.LNKTYPE, linkname="manifest.json"), "a hard link"),
        (lambda: _member("dev", b"", type=tarfile.CHRTYPE), "a device"),
        (lambda: _member("fifo", b"", type=tarfile.FIFOTYPE), "a fifo"),
        (lambda: _member("cont", b"{}", type=tarfile.CONTTYPE), "a contiguous file"),
    ],
    ids=[
        "pax-x",
        "pax-non-ascii",
        "gnu-longname",
        "gnu-longlink",
        "gnu-sparse",
        "symlink",
        "hardlink",
        "device",
        "fifo",
        "contiguous",
    ],
)
def test_every_header_kind_but_plain_files_is_refused(tmp_path, build, what):
    _refused(tmp_path, _tar(tmp_path, PLAIN, build()), "bundle member 2 (")
    _refused(tmp_path, _tar(tmp_path, PLAIN, build()), f"is {what}, {REFUSAL}")


def test_a_global_pax_header_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}) as tar:
        tar.addfile(tarfile.TarInfo("manifest.json"), io.BytesIO(b""))
    path = tmp_path / "g.tar"
    path.write_bytes(buf.getvalue())
    _refused(tmp_path, path, f"bundle member 1 ('././@PaxHeader') is a pax global header, {REFUSAL}")


def test_a_sparse_member_in_a_10_kb_tar_never_expands(tmp_path):
    """The issue's 10 KB tar staged 512 MiB of zeros; the sparse header is refused before any byte is written."""
    info = tarfile.TarInfo("zeros")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 512 << 20  # the expanded size a sparse map would claim
    head = info.tobuf(format=tarfile.GNU_FORMAT)
    path = _tar(tmp_path, head, end=b"\0" * 9_000)
    assert path.stat().st_size < 10_240
    _refused(tmp_path, path, "is a GNU sparse file")


def test_damaged_headers_are_refused(tmp_path):
    bad_sum = bytearray(PLAIN)
    bad_sum[0] ^= 1
    _refused(tmp_path, _tar(tmp_path, PLAIN, bytes(bad_sum)), "is a damaged tar (member 2 fails its header checksum)")
    base256 = bytearray(_member("big", b"x"))
    base256[124:136] = b"\x80" + bytes(10) + b"\x01"
    _refused(tmp_path, _tar(tmp_path, PLAIN, bytes(base256)), "is a damaged tar (member 2 has a malformed header)")
    _refused(tmp_path, _tar(tmp_path, b"\x1f\x8b" * 256), "is not an uncompressed tar bundle")
    _refused(tmp_path, _tar(tmp_path, PLAIN[:300], end=b""), "is a damaged tar (a header is cut off at byte 0)")
    claims = _member("manifest.json", b"x" * 2000)[:1024]  # header says 2,000 bytes, the file ends first
    _refused(tmp_path, _tar(tmp_path, claims, end=b""), "'manifest.json' is truncated (the file ends inside it)")


def test_limits_are_checked_from_headers_before_tarfile_reads_data(tmp_path):
    members = [_member(f"f{i}", b"x" * 10) for i in range(5)]
    path = _tar(tmp_path, *members)
    _refused(tmp_path, path, "more than 3 members", bundles.Limits(max_members=3))
    _refused(tmp_path, path, "more than 25 bytes", bundles.Limits(max_total_bytes=25))
    _refused(tmp_path, path, "'f0' is 10 bytes; the limit is 9", bundles.Limits(max_member_bytes=9))


def test_the_total_limit_follows_the_free_space_of_the_staging_disk(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(bundles.shutil, "disk_usage", lambda p: usage(10 << 30, 0, (256 << 20) + 60))
    assert bundles.disk_limit(tmp_path, bundles.Limits()) == 30  # (free - margin) // 2: staged copy + store copy
    path = _tar(tmp_path, *[_member(f"f{i}", b"x" * 10) for i in range(5)])
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(StoreFull) as full:  # the disk, not the configured limit, refuses it: the message says what to free
        bundles.stage(path, staging, bundles.Limits())
    assert str(full.value) == (
        f"not enough free space in {tmp_path} for this bundle: free at least 1 MB there (an import stages a copy and "
        "keeps 256 MB free; or move KVGRAFT_HOME to a larger disk), then import again; nothing was imported"
    )
    assert list(staging.iterdir()) == []
    _refused(
        tmp_path,
        path,
        "bundle holds more than 25 bytes (the limit, or what the disk can take)",
        bundles.Limits(max_total_bytes=25),
    )
    monkeypatch.setattr(bundles.shutil, "disk_usage", lambda p: usage(10 << 30, 0, 1 << 50))
    assert bundles.disk_limit(tmp_path, bundles.Limits()) == bundles.Limits().max_total_bytes == 64 << 30
    monkeypatch.setattr(bundles.shutil, "disk_usage", lambda p: usage(10 << 30, 0, 1 << 20))
    assert bundles.disk_limit(tmp_path, bundles.Limits()) == 0


def test_our_writer_makes_only_plain_ustar_members_that_the_screen_accepts(tmp_path):
    members = {"manifest.json": b"{}", "blobs/" + "a" * 64 + ".safetensors": b"x" * 1000, "catalog.json": b""}
    path = tmp_path / "ours.tar"
    bundles.write(path, members)
    data = path.read_bytes()
    assert bundles.screen(path, bundles.Limits()) == 3
    offset, kinds = 0, []
    while data[offset : offset + 512] != bytes(512):
        head = data[offset : offset + 512]
        kinds.append((head[156:157], head[257:265]))
        offset += 512 + -(-int(head[124:136].rstrip(b"\0 "), 8) // 512) * 512
    assert kinds == [(b"0", b"ustar\x0000")] * 3
    (tmp_path / "s").mkdir()
    staged = bundles.stage(path, tmp_path / "s")
    assert {n: p.read_bytes() for n, p in staged.items()} == members


def test_members_stream_to_staging_without_being_held_in_memory(tmp_path):
    big = b"\x5a" * (32 << 20)
    path = _tar(tmp_path, _member("blob", big))
    (tmp_path / "s").mkdir()
    tracemalloc.start()
    try:
        staged = bundles.stage(path, tmp_path / "s")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert staged["blob"].stat().st_size == len(big)
    assert peak < 4 << 20, f"staging a 32 MiB member peaked at {peak / 2**20:.1f} MiB of Python memory"
