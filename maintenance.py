"""Upkeep of a store: export/import bundles, rebuild-and-compare, fsck, ledger replay, list/show/delete.

Each function takes a `services.Library` and returns a frozen report with `as_dict()` for `--json`.
It reads and writes through the library's catalog and blob store, and the tar side through
`db.bundles`; it formats nothing. Nothing enters the store from a bundle before every hash in it
has been checked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from db import bundles
from db.blobs import sha256_bytes
from db.catalog import EXPORT_FORMAT
from db.rows import ArtifactRow
from graft_core import codec, generate
from graft_core.artifact import FORMAT, text_sha256
from graft_core.capture import capture
from graft_core.errors import ArtifactNotFound, IncompatibleArtifact, IntegrityError, InvalidInput, KvgraftError
from retrieval import VectorIndex
from services import Library

BUNDLE_FORMAT = "kvgraft-bundle/1"
MANIFEST = "manifest.json"
CATALOG = "catalog.json"
ORPHAN_GRACE_S = 60.0  # an orphan or partial younger than this may be a deposit in flight


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _blob_member(content_sha256: str) -> str:
    return f"blobs/{content_sha256}.safetensors"


def _row_dict(row: ArtifactRow) -> dict:
    return {**asdict(row), "created_at": row.created_at.isoformat(), "end_pos": row.end_pos}


# ---- export / import -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportReport:
    path: str
    bundle_sha256: str
    bytes: int
    artifacts: tuple[str, ...]  # every exported id, parents before children
    requested: tuple[str, ...]
    model_fingerprints: tuple[str, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def export_bundle(lib: Library, ids: list[str], out: str | Path) -> ExportReport:
    """Write the artifacts `ids`, their ancestors, their catalog rows and a manifest to the tar `out`."""
    if not ids:
        raise InvalidInput("give at least one artifact id to export; list ids with `cli.py list`")
    requested = tuple(lib.catalog.get(i).id for i in ids)
    rows = lib.catalog.export_rows(requested)
    members: dict[str, bytes] = {}
    entries = []
    for a in rows["artifacts"]:
        data = lib.blobs.get(a["content_sha256"])  # re-hashed on read: a corrupt blob is never exported
        members[_blob_member(a["content_sha256"])] = data
        entries.append(
            {
                "id": a["id"],
                "parent": a["parent_id"],
                "content_sha256": a["content_sha256"],
                "bytes": len(data),
                "model_fingerprint": a["model_fingerprint"],
                "member": _blob_member(a["content_sha256"]),
            }
        )
    catalog_bytes = _json_bytes(rows)
    members[CATALOG] = catalog_bytes
    fingerprints = tuple(sorted({e["model_fingerprint"] for e in entries}))
    manifest = {
        "format": BUNDLE_FORMAT,
        "artifact_format": FORMAT,
        "catalog_format": EXPORT_FORMAT,
        "catalog": {"member": CATALOG, "sha256": sha256_bytes(catalog_bytes), "bytes": len(catalog_bytes)},
        "model_fingerprints": list(fingerprints),
        "requested": sorted(requested),
        "artifacts": entries,
    }
    members[MANIFEST] = _json_bytes(manifest)
    size = bundles.write(out, members)
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return ExportReport(
        path=str(out),
        bundle_sha256=digest.hexdigest(),
        bytes=size,
        artifacts=tuple(e["id"] for e in entries),
        requested=requested,
        model_fingerprints=fingerprints,
    )


@dataclass(frozen=True)
class ImportReport:
    path: str
    artifacts: tuple[str, ...]  # every id in the bundle
    new: tuple[str, ...]  # ids that were not in this store before
    blobs_written: int  # new blobs, and missing or corrupt ones restored from the bundle
    model_fingerprints: tuple[str, ...]
    model_checked: bool  # True when the fingerprints were compared with a loaded model

    def as_dict(self) -> dict:
        return asdict(self)


def _manifest(staged: dict[str, Path]) -> dict:
    if MANIFEST not in staged:
        raise InvalidInput(f"bundle has no {MANIFEST}; it is not a kvgraft bundle (make one with `cli.py export`)")
    try:
        manifest = json.loads(staged[MANIFEST].read_bytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidInput(f"bundle {MANIFEST} is not JSON ({type(e).__name__}); export it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise InvalidInput(f"bundle format is {found!r}, this kvgraft reads {BUNDLE_FORMAT!r}")
    if manifest.get("artifact_format") != FORMAT:
        raise IncompatibleArtifact(
            f"bundle holds artifacts of format {manifest.get('artifact_format')!r}; this kvgraft reads {FORMAT!r}"
        )
    try:
        entries = [
            {k: e[k] for k in ("id", "parent", "content_sha256", "bytes", "model_fingerprint", "member")}
            for e in manifest["artifacts"]
        ]
        cat = manifest["catalog"]
        _ = (cat["member"], cat["sha256"])
    except (KeyError, TypeError) as e:
        raise InvalidInput(f"bundle {MANIFEST} is malformed ({type(e).__name__}: {e}); export it again") from None
    manifest["artifacts"] = entries
    return manifest


def _verify_staged(staged: dict[str, Path]) -> tuple[dict, dict, dict[str, bytes]]:
    """Every check of a staged bundle against itself: (manifest, catalog rows, content hash -> blob bytes)."""
    manifest = _manifest(staged)
    entries = manifest["artifacts"]
    listed = {MANIFEST, manifest["catalog"]["member"], *(e["member"] for e in entries)}
    extra = sorted(set(staged) - listed)
    if extra:
        raise InvalidInput(f"bundle member {extra[0]!r} is not listed in {MANIFEST}; refusing the bundle")
    missing = sorted(listed - set(staged))
    if missing:
        raise IntegrityError(f"bundle lacks {missing[0]!r}, which its {MANIFEST} lists; export it again")
    cat_bytes = staged[manifest["catalog"]["member"]].read_bytes()
    if sha256_bytes(cat_bytes) != manifest["catalog"]["sha256"]:
        raise IntegrityError(
            f"bundle {CATALOG} hashes to {sha256_bytes(cat_bytes)}, its manifest says {manifest['catalog']['sha256']}: "
            "the bundle was modified; nothing was imported"
        )
    try:
        rows = json.loads(cat_bytes)
        by_id = {a["id"]: a for a in rows["artifacts"]}
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise InvalidInput(f"bundle {CATALOG} is malformed ({type(e).__name__}); export it again") from None
    if set(by_id) != {e["id"] for e in entries} or len(by_id) != len(entries):
        raise IntegrityError(f"bundle {CATALOG} and {MANIFEST} list different artifacts; export it again")
    blobs: dict[str, bytes] = {}
    for e in entries:
        data = staged[e["member"]].read_bytes()
        actual = sha256_bytes(data)
        if actual != e["content_sha256"] or e["member"] != _blob_member(e["content_sha256"]):
            raise IntegrityError(
                f"blob integrity check failed for artifact {e['id']}: {e['member']} hashes to {actual}, "
                f"the manifest says {e['content_sha256']}; the bundle is corrupt or was modified, nothing was imported"
            )
        row = by_id[e["id"]]
        if row.get("content_sha256") != e["content_sha256"]:
            raise IntegrityError(
                f"bundle {CATALOG} gives artifact {e['id']} another content hash than {MANIFEST}; export it again"
            )
        art = codec.loads(data)  # IntegrityError / IncompatibleArtifact on anything malformed
        if art.key != e["id"]:
            raise IntegrityError(f"artifact file {e['member']} holds artifact {art.key}, not {e['id']}; nothing was imported")
        if (art.parent or None) != (row.get("parent_id") or None):
            raise IntegrityError(
                f"artifact {e['id']} names parent {art.parent or 'none'} but its catalog row another; nothing was imported"
            )
        for what, fp in (("the manifest", e["model_fingerprint"]), (f"its {CATALOG} row", row.get("model_fingerprint"))):
            if fp != art.model_fingerprint:
                raise IncompatibleArtifact(
                    f"artifact {e['id']} was made by model {art.model_fingerprint} but {what} says {fp}; nothing was imported"
                )
        blobs[e["content_sha256"]] = data
    return manifest, rows, blobs


def import_bundle(
    lib: Library, path: str | Path, limits: bundles.Limits = bundles.Limits(), check_model: bool = True
) -> ImportReport:
    """Check every member, hash and fingerprint of the bundle at `path`, then add it to the store.

    Members are staged in a temporary folder inside the home, removed afterwards whatever happens.
    With `check_model` the library's model is loaded and every artifact must be its own."""
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=lib.home))
    try:
        staged = bundles.stage(path, staging, limits)
        manifest, rows, blobs = _verify_staged(staged)
        expected = lib.lm.fingerprint if check_model else None  # loaded only for a bundle that is sound
        for e in manifest["artifacts"]:
            if expected is not None and e["model_fingerprint"] != expected:
                raise IncompatibleArtifact(
                    f"artifact {e['id']} was made by model {e['model_fingerprint'][:16]}, this store's model is "
                    f"{expected[:16]}; import it into a store running that model (--model), nothing was imported"
                )
        written = []
        try:
            for digest, data in sorted(blobs.items()):
                if lib.blobs.exists(digest):
                    try:
                        lib.blobs.get(digest)
                        continue
                    except IntegrityError:  # a corrupt copy: the bundle's verified bytes restore it
                        lib.blobs.delete(digest)
                lib.blobs.put(data)
                written.append(digest)
            new = lib.catalog.import_rows(rows)
        except BaseException:
            for digest in written:  # undo: a blob no row refers to is an orphan
                if lib.catalog.content_refcount(digest) == 0:
                    lib.blobs.delete(digest)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportReport(
        path=str(path),
        artifacts=tuple(e["id"] for e in manifest["artifacts"]),
        new=tuple(new),
        blobs_written=len(written),
        model_fingerprints=tuple(manifest.get("model_fingerprints") or ()),
        model_checked=expected is not None,
    )


# ---- rebuild --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebuildReport:
    id: str
    equal: bool  # rebuilt bytes equal the catalog's content hash
    stored_sha256: str  # what the catalog says
    blob_sha256: str | None  # what the file on disk hashes to (None: missing)
    rebuilt_sha256: str
    rebuilt_id: str
    bytes: int
    prefill_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def rebuild_verify(lib: Library, artifact_id: str) -> RebuildReport:
    """Recompute the artifact from its source text on this machine and compare bytes with the stored blob."""
    row = lib.catalog.get(artifact_id)
    lm = lib.lm
    if row.model_fingerprint != lm.fingerprint:
        raise IncompatibleArtifact(
            f"artifact {row.id} was made by model {row.model_fingerprint[:16]}, this model is {lm.fingerprint[:16]}; "
            "rebuild it with the model that made it (--model)"
        )
    text = lib.catalog.source(row.id).text
    token_ids = lm.tokenizer(text, add_special_tokens=row.parent_id is None)["input_ids"]
    with lib.lock:
        parents = lib.load_chain(row.parent_id)[0] if row.parent_id else []
        art, stats = capture(lm, token_ids, parents=parents, text_sha256=text_sha256(text))
    data = codec.dumps(art)
    try:
        blob_sha = sha256_bytes(lib.blobs.path(row.content_sha256).read_bytes())
    except FileNotFoundError:
        blob_sha = None
    rebuilt = sha256_bytes(data)
    return RebuildReport(
        id=row.id,
        equal=rebuilt == row.content_sha256 and blob_sha == row.content_sha256 and art.key == row.id,
        stored_sha256=row.content_sha256,
        blob_sha256=blob_sha,
        rebuilt_sha256=rebuilt,
        rebuilt_id=art.key,
        bytes=len(data),
        prefill_s=stats.prefill_s,
    )


# ---- fsck -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FsckReport:
    artifacts: int
    blobs: int
    missing: tuple[dict, ...]  # {"id", "content_sha256"}: row without its file
    orphans: tuple[str, ...]  # content hashes on disk that no row refers to
    corrupt: tuple[dict, ...]  # {"id", "content_sha256", "actual_sha256"}
    partials: tuple[str, ...]  # leftover temporary files of interrupted writes
    index: dict  # {"status": ok|missing|corrupt|stale, "detail", ...}
    repaired: dict  # {"orphans_removed", "partials_removed", "index_rebuilt"}
    consistent: bool  # nothing left to fix (after repair, when asked)
    advice: tuple[str, ...]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["counts"] = {
            "missing": len(self.missing),
            "orphans": len(self.orphans),
            "corrupt": len(self.corrupt),
            "partials": len(self.partials),
        }
        return d


def _index_status(lib: Library) -> dict:
    version = lib.catalog.version()
    try:
        idx = VectorIndex.load(lib.home / "index")
    except IntegrityError as e:
        status = "corrupt" if (lib.home / "index" / "index.json").exists() else "missing"
        return {"status": status, "detail": str(e), "catalog_version": version}
    embedded = {a for a, _ in lib.catalog.embeddings(idx.embedder_id)}
    out = {
        "catalog_version": version,
        "index_version": idx.version,
        "embedder_id": idx.embedder_id,
        "indexed": len(idx),
        "embedded": len(embedded),
    }
    if idx.version != version or len(idx) != len(embedded) or not all(a in idx for a in embedded):
        detail = f"index reflects catalog version {idx.version} with {len(idx)} vectors; the catalog is at {version} with {len(embedded)}"
        return {"status": "stale", "detail": detail, **out}
    return {"status": "ok", "detail": "", **out}


def _older_than(p: Path, grace_s: float) -> bool:
    try:
        return time.time() - p.stat().st_mtime >= grace_s
    except FileNotFoundError:
        return False


def fsck(lib: Library, repair: bool = False, grace_s: float = ORPHAN_GRACE_S) -> FsckReport:
    """Compare catalog, blobs and index. `repair` removes orphan blobs and partial files older than
    `grace_s` and rebuilds the index; it never removes a blob a catalog row refers to."""
    rows = lib.catalog.list_artifacts(limit=max(lib.catalog.count_artifacts(), 1))
    on_disk = set(lib.blobs)
    referenced: dict[str, list[str]] = {}
    for r in rows:
        referenced.setdefault(r.content_sha256, []).append(r.id)
    missing, corrupt = [], []
    for digest, ids in sorted(referenced.items()):
        if digest not in on_disk:
            missing += [{"id": i, "content_sha256": digest} for i in sorted(ids)]
            continue
        h = hashlib.sha256()
        with open(lib.blobs.path(digest), "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if h.hexdigest() != digest:
            corrupt += [{"id": i, "content_sha256": digest, "actual_sha256": h.hexdigest()} for i in sorted(ids)]
    orphans = sorted(on_disk - set(referenced))
    partials = sorted(lib.blobs.partials()) + sorted(lib.home.glob(".import-*"))  # interrupted writes and imports
    index = _index_status(lib)
    removed_orphans, removed_partials, rebuilt = [], [], False
    if repair:
        for digest in orphans:
            # re-check: a deposit in another process may have committed a row for it meanwhile
            if _older_than(lib.blobs.path(digest), grace_s) and lib.catalog.content_refcount(digest) == 0:
                lib.blobs.delete(digest)
                removed_orphans.append(digest)
        for p in partials:
            if _older_than(p, grace_s):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed_partials.append(p.name)
        if index["status"] != "ok":
            lib.rebuild_index()
            rebuilt = True
    left_orphans = [o for o in orphans if o not in removed_orphans]
    left_partials = [p for p in partials if p.name not in removed_partials]
    advice = []
    if missing or corrupt:
        advice.append(
            "blobs referenced by the catalog are missing or corrupt: restore them with `cli.py import BUNDLE` from a bundle "
            "that holds them, or check what a recompute gives with `cli.py rebuild --verify ID`"
        )
    if (left_orphans or left_partials) and not repair:
        advice.append("run `cli.py fsck --repair` to remove orphan blobs and partial files")
    elif left_orphans or left_partials:
        advice.append(
            f"some orphans or partial files are younger than {grace_s:.0f} s (a deposit in flight?); run fsck again later"
        )
    if index["status"] != "ok" and not rebuilt:
        advice.append("run `cli.py fsck --repair` to rebuild the index from the catalog")
    consistent = not (missing or corrupt or left_orphans or left_partials or (index["status"] != "ok" and not rebuilt))
    return FsckReport(
        artifacts=len(rows),
        blobs=len(on_disk),
        missing=tuple(missing),
        orphans=tuple(orphans),
        corrupt=tuple(corrupt),
        partials=tuple(str(p) for p in partials),
        index=index,
        repaired={"orphans_removed": removed_orphans, "partials_removed": removed_partials, "index_rebuilt": rebuilt},
        consistent=consistent,
        advice=tuple(advice),
    )


# ---- replay ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayEntry:
    ledger_id: int | None
    tier: str
    artifact_ids: tuple[str, ...]
    max_new_tokens: int
    raw: bool | None
    output_equal: bool
    logits_equal: bool
    recorded_output_sha256: str
    replayed_output_sha256: str | None
    recorded_logits_sha256: str | None
    replayed_logits_sha256: str | None
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class ReplayReport:
    entries: tuple[ReplayEntry, ...]
    replayed: int
    matched: int
    mismatched: int
    ok: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _replay_one(lib: Library, row) -> ReplayEntry:
    lm = lib.lm
    base = dict(
        ledger_id=row.id,
        tier=row.tier,
        artifact_ids=row.artifact_ids,
        max_new_tokens=max(1, len(row.output_token_ids)),
        recorded_output_sha256=row.output_sha256,
        recorded_logits_sha256=row.logits_sha256,
    )

    def failed(error: str, raw: bool | None = None) -> ReplayEntry:
        return ReplayEntry(
            **base,
            raw=raw,
            output_equal=False,
            logits_equal=False,
            replayed_output_sha256=None,
            replayed_logits_sha256=None,
            ok=False,
            error=error,
        )

    if row.model_fingerprint != lm.fingerprint:
        return failed(
            f"recorded with model {row.model_fingerprint[:16]}, this model is {lm.fingerprint[:16]}; replay with --model"
        )
    grafted = row.tier != "none" and bool(row.artifact_ids)
    raw = next(
        (
            r
            for r in (False, True)
            if generate.tokens_sha256(generate.encode_prompt(lm, row.query, grafted, raw=r)) == row.prompt_sha256
        ),
        None,
    )
    if raw is None:
        return failed("the query no longer encodes to the recorded prompt (prompt_sha256 differs)")
    try:
        with lib.lock:
            chain = [lib.load_artifact(i) for i in row.artifact_ids] if grafted else []
            ans = generate.answer(
                lm, chain, row.query, max_new_tokens=base["max_new_tokens"], raw=raw, relocated=row.tier == "relocated"
            )
    except KvgraftError as e:
        return failed(f"{type(e).__name__}: {e}", raw)
    out_eq = ans.output_sha256 == row.output_sha256
    log_eq = row.logits_sha256 is not None and ans.logits_sha256 == row.logits_sha256
    return ReplayEntry(
        **base,
        raw=raw,
        output_equal=out_eq,
        logits_equal=log_eq,
        replayed_output_sha256=ans.output_sha256,
        replayed_logits_sha256=ans.logits_sha256,
        ok=out_eq and log_eq,
        error="" if row.logits_sha256 is not None else "no logits_sha256 was recorded",
    )


def replay(lib: Library, last: int | None = None) -> ReplayReport:
    """Re-run ledger entries (the newest `last`, oldest first) and compare output and logits hashes."""
    if last is not None and last < 1:
        raise InvalidInput(f"--last must be at least 1, got {last}")
    rows = lib.catalog.ledger(last=last)
    if not rows:
        raise ArtifactNotFound("the ledger is empty: nothing to replay (answer a question first with `cli.py ask`)")
    entries = tuple(_replay_one(lib, r) for r in rows)
    matched = sum(e.ok for e in entries)
    return ReplayReport(
        entries=entries, replayed=len(entries), matched=matched, mismatched=len(entries) - matched, ok=matched == len(entries)
    )


# ---- list / show / delete -------------------------------------------------------------------------


def list_rows(lib: Library, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0) -> list[dict]:
    return [_row_dict(r) for r in lib.catalog.list_artifacts(query=query, kind=kind, limit=limit, offset=offset)]


@dataclass(frozen=True)
class ShowReport:
    artifact: dict
    source: dict
    verifications: tuple[dict, ...]
    chain: tuple[str, ...]  # root first, this artifact last
    children: tuple[str, ...]
    blob_present: bool

    def as_dict(self) -> dict:
        return asdict(self)


def show(lib: Library, artifact_id: str) -> ShowReport:
    row = lib.catalog.get(artifact_id)
    return ShowReport(
        artifact=_row_dict(row),
        source=asdict(lib.catalog.source(row.id)),
        verifications=tuple({**asdict(v), "created_at": v.created_at.isoformat()} for v in lib.catalog.verifications(row.id)),
        chain=tuple(r.id for r in lib.catalog.chain(row.id)),
        children=tuple(r.id for r in lib.catalog.children(row.id)),
        blob_present=lib.blobs.exists(row.content_sha256),
    )


@dataclass(frozen=True)
class DeleteReport:
    id: str
    content_sha256: str
    blob_removed: bool  # False while another row still refers to the same bytes

    def as_dict(self) -> dict:
        return asdict(self)


def delete(lib: Library, artifact_id: str) -> DeleteReport:
    """Remove one artifact (refused while others continue its chain) and its blob if nothing else uses it."""
    key = lib.catalog.get(artifact_id).id
    content = lib.catalog.delete(key)
    removed = lib.catalog.content_refcount(content) == 0 and lib.blobs.delete(content)
    return DeleteReport(id=key, content_sha256=content, blob_removed=bool(removed))


__all__ = [
    "BUNDLE_FORMAT",
    "DeleteReport",
    "ExportReport",
    "FsckReport",
    "ImportReport",
    "RebuildReport",
    "ReplayEntry",
    "ReplayReport",
    "ShowReport",
    "delete",
    "export_bundle",
    "fsck",
    "import_bundle",
    "list_rows",
    "rebuild_verify",
    "replay",
    "show",
]
