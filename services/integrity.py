"""fsck: a store checked against itself (catalog rows against blobs and their hashes, the index, quarantine,
and with `deep` every probe), and with `repair` what can be repaired safely.

Takes a `Library` and returns a frozen report with `to_json()`; it formats nothing. Blob files are hashed
through the store's blob store (`BlobStore.actual_sha256`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from errors import IntegrityError, KvgraftError

if TYPE_CHECKING:
    from .library import Library

ORPHAN_GRACE_S = 60.0  # an orphan or partial younger than this may be a deposit in flight


@dataclass(frozen=True)
class BlobProblem:
    """A catalog row whose blob is missing (`actual_sha256` None) or hashes to something else."""

    id: str
    content_sha256: str
    actual_sha256: str | None = None

    def to_json(self) -> dict:
        d = {"id": self.id, "content_sha256": self.content_sha256}
        return d if self.actual_sha256 is None else d | {"actual_sha256": self.actual_sha256}


@dataclass(frozen=True)
class IndexStatus:
    status: str  # ok | missing | stale | half-saved (the cache's states) | corrupt
    detail: str
    catalog_version: int
    index_version: int | str | None = None  # the rest: None when no index could be read
    embedder_id: str | None = None
    indexed: int | None = None
    embedded: int | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None or k in ("status", "detail", "catalog_version")}


@dataclass(frozen=True)
class Repaired:
    orphans_removed: tuple[str, ...] = ()
    partials_removed: tuple[str, ...] = ()
    index_rebuilt: bool = False


@dataclass(frozen=True)
class Quarantined:
    id: str
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FsckReport:
    artifacts: int
    blobs: int
    missing: tuple[BlobProblem, ...]  # rows without their file
    orphans: tuple[str, ...]  # content hashes on disk that no row refers to
    corrupt: tuple[BlobProblem, ...]  # rows whose file hashes to something else
    partials: tuple[str, ...]  # leftover temporary files of interrupted writes
    index: IndexStatus
    repaired: Repaired
    consistent: bool  # nothing damaged: every row's blob there and intact, nothing quarantined, the index sound
    advice: tuple[str, ...]
    quarantined: tuple[Quarantined, ...] = ()  # never grafted until rebuilt (rebuild --compare) or deleted
    probes_checked: int = 0  # with --deep: artifacts restored and probe-checked now

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(
            missing=[m.to_json() for m in self.missing],
            corrupt=[c.to_json() for c in self.corrupt],
            index=self.index.to_json(),
            quarantined=[q.to_json() for q in self.quarantined],
            repaired={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.repaired).items()},
        )
        d["counts"] = {
            "missing": len(self.missing),
            "orphans": len(self.orphans),
            "corrupt": len(self.corrupt),
            "partials": len(self.partials),
            "quarantined": len(self.quarantined),
        }
        return d


# An index not written yet, or behind the catalog, is what a store is between deposits and the next answer;
# one whose two files come from two saves is what a process killed inside a save leaves. The index is a
# cache of the catalog's embeddings, rebuilt on first use: information, not damage.
CACHE_STATES = ("missing", "stale", "half-saved")


def _index_status(lib: Library) -> IndexStatus:
    from retrieval import VectorIndex  # faiss loads here, not with the web page
    from retrieval.index import HalfSaved

    version = lib.store.catalog.version()
    try:
        idx = VectorIndex.load(lib.home / "index")
    except HalfSaved as e:
        return IndexStatus("half-saved", str(e), version)
    except IntegrityError as e:
        status = "corrupt" if (lib.home / "index" / "index.json").exists() else "missing"
        return IndexStatus(status, str(e), version)
    embedded = {a for a, _ in lib.store.catalog.embeddings(idx.embedder_id)}
    found = {"index_version": idx.version, "embedder_id": idx.embedder_id, "indexed": len(idx), "embedded": len(embedded)}
    if idx.version != version or len(idx) != len(embedded) or not all(a in idx for a in embedded):
        detail = f"index reflects catalog version {idx.version} with {len(idx)} vectors; the catalog is at {version} with {len(embedded)}"
        return IndexStatus("stale", detail, version, **found)
    return IndexStatus("ok", "", version, **found)


def _older_than(p: Path, grace_s: float) -> bool:
    try:
        return time.time() - p.stat().st_mtime >= grace_s
    except FileNotFoundError:
        return False


def _deep(lib: Library, rows: list, bad: set[str]) -> int:
    """Probe-check every artifact whose blob is sound (a mismatch quarantines it); returns how many ran."""
    n = 0
    for r in sorted(rows, key=lambda r: (r.depth, r.id)):
        if r.content_sha256 in bad or r.quarantine:
            continue
        try:
            lib.probe(r.id, force=True)
        except KvgraftError:  # a parent that is missing, corrupt or quarantined: reported on its own row
            continue
        n += 1
    return n


def fsck(lib: Library, repair: bool = False, grace_s: float = ORPHAN_GRACE_S, deep: bool = False) -> FsckReport:
    """Compare catalog, blobs and index. `repair` removes orphan blobs and partial files older than
    `grace_s` and rebuilds the index; it never removes a blob a catalog row refers to. `deep` also
    restores each artifact and checks its probe hash (a mismatch quarantines it). Quarantined
    artifacts are listed and make the store not consistent."""
    rows = lib.store.catalog.list_artifacts(limit=max(lib.store.catalog.count_artifacts(), 1))
    on_disk = set(lib.store.blobs)
    referenced: dict[str, list[str]] = {}
    for r in rows:
        referenced.setdefault(r.content_sha256, []).append(r.id)
    missing, corrupt = [], []
    for digest, ids in sorted(referenced.items()):
        if digest not in on_disk:
            missing += [BlobProblem(i, digest) for i in sorted(ids)]
            continue
        actual = lib.store.blobs.actual_sha256(digest)
        if actual != digest:
            corrupt += [BlobProblem(i, digest, actual) for i in sorted(ids)]
    probes = _deep(lib, rows, {p.content_sha256 for p in missing + corrupt}) if deep else 0
    quarantined = tuple(Quarantined(r.id, r.quarantine or "") for r in lib.store.catalog.quarantined())
    orphans = sorted(on_disk - set(referenced))
    partials = sorted(lib.store.blobs.partials()) + sorted(lib.home.glob(".import-*"))  # interrupted writes and imports
    index = _index_status(lib)
    removed_orphans, removed_partials, rebuilt = [], [], False
    if repair:
        for digest in orphans:
            # re-check: a deposit in another process may have committed a row for it meanwhile
            if _older_than(lib.store.blobs.path(digest), grace_s) and lib.store.catalog.content_refcount(digest) == 0:
                lib.store.blobs.delete(digest)
                removed_orphans.append(digest)
        for p in partials:
            if _older_than(p, grace_s):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed_partials.append(p.name)
        if index.status != "ok":
            lib.store.rebuild_index()
            rebuilt = True
    left_orphans = [o for o in orphans if o not in removed_orphans]
    left_partials = [p for p in partials if p.name not in removed_partials]
    advice = []
    if missing or corrupt:
        advice.append(
            "blobs referenced by the catalog are missing or corrupt: restore them with `cli.py import BUNDLE` from a bundle "
            "that holds them, or check what a recompute gives with `cli.py rebuild --compare ID`"
        )
    if (left_orphans or left_partials) and not repair:
        advice.append(
            f"{len(left_orphans)} orphan blob(s) and {len(left_partials)} partial file(s) are leftovers of interrupted "
            "writes: nothing acknowledged refers to them; `cli.py fsck --repair` removes them to free their space"
        )
    elif left_orphans or left_partials:
        advice.append(
            f"some orphans or partial files are younger than {grace_s:.0f} s (a deposit in flight?); run fsck again later"
        )
    if index.status in CACHE_STATES and not rebuilt:
        advice.append(
            f"the index is {index.status}: it is a cache of the catalog, rebuilt on first use (`cli.py fsck --repair` rebuilds it now)"
        )
    elif index.status != "ok" and not rebuilt:
        advice.append("run `cli.py fsck --repair` to rebuild the index from the catalog")
    if quarantined:
        advice.append(
            "quarantined artifacts are never grafted: run `cli.py rebuild --compare ID` to check a recompute "
            "(it releases an artifact whose probe passes again) or `cli.py delete ID`"
        )
    damaged_index = index.status not in ("ok", *CACHE_STATES) and not rebuilt
    # leftovers of an interrupted write (orphans, partials) hold no acknowledged work: space, not damage
    consistent = not (missing or corrupt or quarantined or damaged_index)
    return FsckReport(
        artifacts=len(rows),
        blobs=len(on_disk),
        missing=tuple(missing),
        orphans=tuple(orphans),
        corrupt=tuple(corrupt),
        partials=tuple(str(p) for p in partials),
        index=index,
        repaired=Repaired(tuple(removed_orphans), tuple(removed_partials), rebuilt),
        consistent=consistent,
        advice=tuple(advice),
        quarantined=quarantined,
        probes_checked=probes,
    )
