"""Bundles on disk: a deterministic tar writer and a defensive tar reader that stages members.

The writer's bytes are a pure function of the members (sorted names, mtime 0, uid/gid 0, no user
or group names, mode 0644, plain ustar, no compression). The reader never calls `extractall`: it
walks the members one by one and refuses, before writing anything, absolute names, `..`, anything
that is not a regular file (links, devices, folders, fifos), duplicate names, members over the
per-member limit, archives over the total limit or with too many members. Accepted members are
copied into files of a staging folder under names it picks itself (`m00000`, ...), so a member name
never becomes a path. It knows nothing about artifacts or catalogs: services/exchange.py checks hashes.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from db.blobs import atomic_file
from errors import InvalidInput, StoreFull

GiB = 1 << 30
MiB = 1 << 20
_BLOCK = 512
_HEADER_KINDS = {  # tar type byte -> what it is; only b"0"/b"\0" (file) and b"5" (folder) reach tarfile
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a device",
    b"4": "a device",
    b"6": "a fifo",
    b"7": "a contiguous file",
    b"x": "a pax extended header",
    b"g": "a pax global header",
    b"L": "a GNU long name header",
    b"K": "a GNU long link header",
    b"S": "a GNU sparse file",
    b"M": "a GNU multi-volume continuation",
    b"V": "a GNU volume label",
}
_MAGICS = (b"ustar\x0000", b"ustar  \x00")  # POSIX ustar, GNU
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What a bundle may hold. Defaults suit real stores; tests pass small ones."""

    max_member_bytes: int = 2 * GiB
    max_total_bytes: int = 64 * GiB  # a ceiling: `stage` lowers it to what the staging folder's disk can hold
    max_members: int = 100_000
    disk_margin_bytes: int = 256 * MiB  # left free on the staging disk after an import


def disk_limit(staging: str | os.PathLike, limits: Limits, free: int | None = None) -> int:
    """The total a bundle may hold when staged in `staging`: the configured limit, or less when the disk is
    short. An import needs the staged copy and then the store's copy (same disk), so half of what is free
    beyond the margin. `free`: the staging disk's free bytes, when the caller has read them."""
    free = shutil.disk_usage(staging).free if free is None else free
    return max(0, min(limits.max_total_bytes, (free - limits.disk_margin_bytes) // 2))


def check_name(name: str) -> str:
    """The member name if it is a plain relative path of safe segments; InvalidInput otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidInput("bundle member has an empty name; refusing the bundle")
    if name.startswith("/") or name.startswith("\\") or re.match(r"^[A-Za-z]:", name):
        raise InvalidInput(f"bundle member {name!r} has an absolute path; refusing the bundle, nothing was imported")
    parts = name.split("/")
    if any(p in ("..", ".") for p in parts) or "\\" in name:
        raise InvalidInput(f"bundle member {name!r} escapes the bundle ('..' or '.'); refusing the bundle, nothing was imported")
    if not all(_SEGMENT.match(p) for p in parts) or len(parts) > 4:
        raise InvalidInput(
            f"bundle member {name!r} is not a plain name (letters, digits, '.', '_', '-'); refusing the bundle, nothing was imported"
        )
    return name


def write(path: str | os.PathLike, members: dict[str, bytes | Path]) -> int:
    """Write a deterministic tar of `members` (name -> bytes, or a file streamed from disk) to `path`
    atomically; returns its size."""
    target = Path(path)
    with atomic_file(target, prefix=f".{target.name}.") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name in sorted(members):
                data = members[name]
                info = tarfile.TarInfo(check_name(name))
                info.size = data.stat().st_size if isinstance(data, Path) else len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.type = tarfile.REGTYPE
                if isinstance(data, Path):
                    with open(data, "rb") as src:
                        tar.addfile(info, src)
                else:
                    tar.addfile(info, io.BytesIO(data))
    return target.stat().st_size


def _octal(field: bytes) -> int:
    """A tar numeric field as `write` spells it: octal digits, then NUL/space padding; ValueError otherwise.
    (GNU base-256 numbers are refused: no member under the limits needs them.)"""
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if not re.fullmatch(rb"[0-7]{1,12}", text):
        raise ValueError("not an octal number")
    return int(text, 8)


def screen(path: str | os.PathLike, limits: Limits, total_limit: int | None = None, disk: tuple[Path, int] | None = None) -> int:
    """Reads the raw 512-byte headers of the tar at `path` before `tarfile` parses anything; returns the member count.

    Refuses, with InvalidInput, every header kind but plain files and folders: pax headers (the
    quadratic header parsing of CVE-2024-6232 in Python < 3.11.10/3.12.5 never runs), GNU long
    names/links and sparse files (a 10 KB tar could stage gigabytes of zeros), links, devices, and
    broken checksums or numbers; and counts members and sizes against the limits without reading data."""
    total_limit = limits.max_total_bytes if total_limit is None else total_limit
    count, total, offset = 0, 0, 0
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        while True:
            f.seek(offset)
            block = f.read(_BLOCK)
            if not block or block == bytes(_BLOCK):
                return count  # end of archive (tarfile also stops at the first zero block)
            if len(block) < _BLOCK:
                raise InvalidInput(f"{path} is a damaged tar (a header is cut off at byte {offset:,}); export it again")
            count += 1
            if count > limits.max_members:
                raise InvalidInput(f"bundle has more than {limits.max_members:,} members; refusing it, nothing was imported")
            name = block[:100].split(b"\0", 1)[0].decode("ascii", "replace")
            try:
                checksum, size = _octal(block[148:156]), _octal(block[124:136])
            except ValueError:
                if count == 1:
                    raise InvalidInput(
                        f"{path} is not an uncompressed tar bundle; export it again with `cli.py export`"
                    ) from None
                raise InvalidInput(f"{path} is a damaged tar (member {count} has a malformed header); export it again") from None
            if checksum != sum(block[:148]) + 8 * 32 + sum(block[156:]):
                raise InvalidInput(f"{path} is a damaged tar (member {count} fails its header checksum); export it again")
            kind = block[156:157]
            if kind in _HEADER_KINDS or kind not in (b"0", b"\0", b"5") or block[257:265] not in _MAGICS:
                what = _HEADER_KINDS.get(kind) or (f"of tar type {kind!r}" if kind not in (b"0", b"\0", b"5") else "not ustar")
                raise InvalidInput(
                    f"bundle member {count} ({name!r}) is {what}, not a regular file; kvgraft bundles hold plain ustar "
                    "members only (write them with `cli.py export`); refusing the bundle, nothing was imported"
                )
            if size > limits.max_member_bytes:
                raise InvalidInput(
                    f"bundle member {name!r} is {size:,} bytes; the limit is {limits.max_member_bytes:,}; refusing the bundle"
                )
            total += size
            if total > total_limit and disk is not None and total_limit < limits.max_total_bytes:
                folder, free = disk  # the disk, not the configured limit, refuses it: say what to free
                needed = 2 * os.stat(path).st_size + limits.disk_margin_bytes - free
                raise StoreFull(
                    f"not enough free space in {folder} for this bundle: free at least {-(-needed // MiB):,} MB there "
                    f"(an import stages a copy and keeps {limits.disk_margin_bytes // MiB} MB free; or move KVGRAFT_HOME "
                    "to a larger disk), then import again; nothing was imported",
                    28,
                    str(folder),
                )
            if total > total_limit:
                raise InvalidInput(
                    f"bundle holds more than {total_limit:,} bytes (the limit, or what the disk can take); "
                    "refusing it, nothing was imported"
                )
            offset += _BLOCK + -(-size // _BLOCK) * _BLOCK
            if offset > end:
                raise InvalidInput(f"bundle member {name!r} is truncated (the file ends inside it); export it again")


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.isdir():
        return "a folder"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    return f"of tar type {member.type!r}"


def stage(path: str | os.PathLike, staging: str | os.PathLike, limits: Limits = Limits()) -> dict[str, Path]:
    """Check every member of the tar at `path` and copy the regular files into `staging`.

    Returns member name -> staged file. Raises InvalidInput on the first unsafe member; the caller
    removes `staging`. The raw headers are screened first (`screen`), so tarfile only ever parses plain
    ustar headers. Sizes are checked from the header before reading and again while copying, and each
    member is streamed to its file in 1 MiB chunks: nothing holds a whole member in memory."""
    folder = Path(staging)
    out: dict[str, Path] = {}
    total = 0
    free = shutil.disk_usage(folder).free
    total_limit = disk_limit(folder, limits, free)
    screen(path, limits, total_limit, disk=(folder.parent, free))
    try:
        tar = tarfile.open(path, mode="r:")
    except tarfile.TarError as e:
        raise InvalidInput(f"{path} is not an uncompressed tar bundle ({e}); export it again with `cli.py export`") from None
    with tar:
        count = 0
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as e:
                raise InvalidInput(f"{path} is a damaged tar ({e}); export it again") from None
            if member is None:
                break
            count += 1
            if count > limits.max_members:
                raise InvalidInput(f"bundle has more than {limits.max_members:,} members; refusing it, nothing was imported")
            name = check_name(member.name)
            if not member.isreg():
                raise InvalidInput(f"bundle member {name!r} is {_kind(member)}, not a regular file; refusing the bundle")
            if name in out:
                raise InvalidInput(f"bundle member {name!r} appears twice; refusing the bundle, nothing was imported")
            if member.size > limits.max_member_bytes:
                raise InvalidInput(
                    f"bundle member {name!r} is {member.size:,} bytes; the limit is {limits.max_member_bytes:,}; refusing the bundle"
                )
            total += member.size
            if total > total_limit:
                raise InvalidInput(f"bundle holds more than {total_limit:,} bytes; refusing it, nothing was imported")
            src = tar.extractfile(member)
            assert src is not None, "a regular member always has a file object"
            dest = folder / f"m{count:05d}"
            copied = 0
            with src, open(dest, "xb") as f:
                while chunk := src.read(_CHUNK):
                    copied += len(chunk)
                    if copied > member.size:
                        raise InvalidInput(f"bundle member {name!r} holds more bytes than its header says; refusing the bundle")
                    f.write(chunk)
            if copied != member.size:
                raise InvalidInput(f"bundle member {name!r} is truncated ({copied:,} of {member.size:,} bytes); export it again")
            out[name] = dest
    return out
