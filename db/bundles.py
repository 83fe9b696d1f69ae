"""Bundles on disk: a deterministic tar writer and a defensive tar reader that stages members.

The writer's bytes are a pure function of the members (sorted names, mtime 0, uid/gid 0, no user
or group names, mode 0644, plain ustar, no compression). The reader never calls `extractall`: it
walks the members one by one and refuses, before writing anything, absolute names, `..`, anything
that is not a regular file (links, devices, folders, fifos), duplicate names, members over the
per-member limit, archives over the total limit or with too many members. Accepted members are
copied into files of a staging folder under names it picks itself (`m00000`, ...), so a member name
never becomes a path. It knows nothing about artifacts or catalogs: maintenance.py checks hashes.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from db.blobs import atomic_file
from errors import InvalidInput

GiB = 1 << 30
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What a bundle may hold. Defaults suit real stores; tests pass small ones."""

    max_member_bytes: int = 2 * GiB
    max_total_bytes: int = 64 * GiB
    max_members: int = 100_000


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


def write(path: str | os.PathLike, members: dict[str, bytes]) -> int:
    """Write a deterministic tar of `members` (name -> bytes) to `path` atomically; returns its size."""
    target = Path(path)
    with atomic_file(target, prefix=f".{target.name}.") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name in sorted(members):
                data = members[name]
                info = tarfile.TarInfo(check_name(name))
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.type = tarfile.REGTYPE
                tar.addfile(info, io.BytesIO(data))
    return target.stat().st_size


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
    removes `staging`. Sizes are checked from the header before reading and again while copying."""
    folder = Path(staging)
    out: dict[str, Path] = {}
    total = 0
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
            if total > limits.max_total_bytes:
                raise InvalidInput(f"bundle holds more than {limits.max_total_bytes:,} bytes; refusing it, nothing was imported")
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
