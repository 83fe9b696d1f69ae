"""Moving artifacts between stores: export to and import from tar bundles (format kvgraft-bundle/1).

Each function takes a `Library` and returns a frozen report with `to_json()`. It reads and
writes through the library's catalog and blob store and the tar side through `db.bundles`; it formats
nothing. Nothing enters the store from a bundle before every hash in it has been checked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from db import bundles
from db.blobs import sha256_bytes
from db.catalog import EXPORT_FORMAT
from errors import IncompatibleArtifact, IntegrityError, InvalidInput
from files import sha256_file, write_faults

from .vetting import vet

if TYPE_CHECKING:
    from .library import Library

BUNDLE_FORMAT = "kvgraft-bundle/1"
MANIFEST = "manifest.json"
CATALOG = "catalog.json"


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _blob_member(content_sha256: str) -> str:
    return f"blobs/{content_sha256}.safetensors"


# ---- export / import -----------------------------------------------------------------------------


def numerics_claim(lm) -> dict:
    """What an export says of its model fingerprint: the model's identity (weights, config, tokenizer) and the
    digest of the numerical definition its bytes were computed under; fingerprint = sha256(identity|numerics)."""
    return {"identity": lm.info.fingerprint, "numerics": lm.config.digest()}


def other_numerics(lm, manifest: dict, fingerprint: str) -> str | None:
    """The numerics digest under which a bundle's artifacts of `fingerprint` were made, where the bundle shows
    them to be this model's (same identity) under another numerical definition; None otherwise (another model,
    or a bundle that does not say). A claim costs nothing to make, and needs nothing more: such artifacts are
    rebuilt here from their tokens, never stored from the bundle's bytes."""
    claim = (manifest.get("models") or {}).get(fingerprint) if isinstance(manifest.get("models"), dict) else None
    if not isinstance(claim, dict) or claim.get("identity") != lm.info.fingerprint:
        return None
    numerics = claim.get("numerics")
    if not isinstance(numerics, str) or hashlib.sha256(f"{lm.info.fingerprint}|{numerics}".encode()).hexdigest() != fingerprint:
        return None
    return numerics


@dataclass(frozen=True)
class ExportReport:
    path: str
    bundle_sha256: str
    bytes: int
    artifacts: tuple[str, ...]  # every exported id, parents before children
    requested: tuple[str, ...]
    model_fingerprints: tuple[str, ...]

    def to_json(self) -> dict:
        return asdict(self)


def _checked_blob(lib: Library, digest: str) -> Path:
    """The stored file of blob `digest` after hashing it in 1 MiB chunks: a corrupt blob is never exported."""
    actual = lib.store.blobs.actual_sha256(digest)
    if actual != digest:
        raise IntegrityError(
            f"blob integrity check failed for {digest}: its bytes hash to {actual or 'nothing (missing)'}; "
            "nothing was exported. Restore it from a bundle or run `cli.py rebuild --compare`"
        )
    return lib.store.blobs.path(digest)


def export_bundle(lib: Library, ids: list[str], out: str | Path, at: datetime | None = None) -> ExportReport:
    """Write the artifacts `ids`, their ancestors, their catalog rows and a manifest to the tar `out`.

    With `at`, every timestamp is written as that instant and the embeddings are left out (an import
    recomputes them anyway): the bundle's bytes are then a function of its artifacts and verifications
    alone, so that one made again from the same deposits is byte-identical (services.seed's built-in one)."""
    from graft_core.artifact import FORMAT  # the engine loads at the first export, not with the web page

    if not ids:
        raise InvalidInput("give at least one artifact id to export; list ids with `cli.py list`")
    requested = tuple(lib.store.catalog.get(i).id for i in ids)
    rows = lib.store.catalog.export_rows(requested)
    if at is not None:
        when = at.isoformat()
        rows = {
            **rows,
            "artifacts": [{**a, "created_at": when} for a in rows["artifacts"]],
            "verifications": [{**v, "created_at": when} for v in rows["verifications"]],
            "embeddings": [],
        }
    members: dict[str, bytes | Path] = {}
    entries = []
    for a in rows["artifacts"]:
        blob = _checked_blob(lib, a["content_sha256"])
        members[_blob_member(a["content_sha256"])] = blob  # streamed into the tar, never held whole
        entries.append(
            {
                "id": a["id"],
                "parent": a["parent_id"],
                "content_sha256": a["content_sha256"],
                "bytes": blob.stat().st_size,
                "model_fingerprint": a["model_fingerprint"],
                "member": _blob_member(a["content_sha256"]),
            }
        )
    catalog_bytes = _json_bytes(rows)
    members[CATALOG] = catalog_bytes
    fingerprints = tuple(sorted({e["model_fingerprint"] for e in entries}))
    lm = lib.lm  # its fingerprint splits into the model's identity and the numerical definition the bytes came from
    models = {lm.fingerprint: numerics_claim(lm)} if lm.fingerprint in fingerprints else {}
    manifest = {
        "format": BUNDLE_FORMAT,
        "artifact_format": FORMAT,
        "catalog_format": EXPORT_FORMAT,
        "catalog": {"member": CATALOG, "sha256": sha256_bytes(catalog_bytes), "bytes": len(catalog_bytes)},
        "model_fingerprints": list(fingerprints),
        "models": models,
        "requested": sorted(requested),
        "artifacts": entries,
    }
    members[MANIFEST] = _json_bytes(manifest)
    needed = sum(e["bytes"] for e in entries) + (1 << 20)  # the blobs, with a MB for the JSON and the tar headers
    folder = Path(out).resolve().parent
    with write_faults(folder, "export again", needed, "nothing was written", "or export to a folder on another disk"):
        size = bundles.write(out, members)
    return ExportReport(
        path=str(out),
        bundle_sha256=sha256_file(Path(out)),
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
    replayed: int = 0  # verifications replayed here (graft, generate, verifier) and passed
    not_reverified: int = 0  # verifications kept labelled "imported, not re-verified"
    probes_checked: int = 0  # artifacts recomputed here from their tokens, byte-identical to the bundle's (probe hash included)
    embeddings_recomputed: int = 0  # the bundle's embeddings are never copied
    rebuilt: int = 0  # artifacts made under another numerical definition, recomputed here from their tokens (new ids)
    attested_dropped: int = 0  # attested verdicts left out: a person's word is kept only with trust_verdicts

    def to_json(self) -> dict:
        return asdict(self)


def _manifest(staged: dict[str, Path]) -> dict:
    from graft_core.artifact import FORMAT

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


def _verify_staged(staged: dict[str, Path]) -> tuple[dict, dict, dict[str, Path]]:
    """Every check of a staged bundle against itself: (manifest, catalog rows, content hash -> staged file).
    Blobs are read one at a time; none is held after its checks."""
    from graft_core import codec

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
    blobs: dict[str, Path] = {}
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
        blobs[e["content_sha256"]] = staged[e["member"]]
    return manifest, rows, blobs


def import_bundle(
    lib: Library,
    path: str | Path,
    limits: bundles.Limits = bundles.Limits(),
    check_model: bool = True,
    trust_verdicts: bool = False,
    on_progress: Callable[[float, str], None] | None = None,
    recomputed: frozenset[str] = frozenset(),
) -> ImportReport:
    """Check every member, hash and fingerprint of the bundle at `path`, then add it to the store.

    Members are staged in a temporary folder inside the home, removed afterwards whatever happens.
    With `check_model` the library's model is loaded, every artifact must be its own, its source text
    must re-tokenise to its token ids, it is recomputed from those tokens and must give the bundle's bytes,
    and each verification is replayed unless `trust_verdicts` (admin): then, as without `check_model`,
    rows are labelled "imported, not re-verified". Without `check_model` nothing is recomputed, so every
    artifact arrives quarantined until `rebuild` proves it. Attested verdicts are kept only with `trust_verdicts`.
    Embeddings are always recomputed here. A disk that refuses a write (full, an I/O error) leaves nothing:
    the staging folder and every blob this import wrote are removed, and the error names the store's folder.
    `recomputed`: ids whose bytes the caller computed here from their tokens just before (services.seed);
    see `vetting.vet`. Never from outside the process."""
    try:
        needed = 2 * Path(path).stat().st_size + (1 << 20)  # staged, then stored
    except OSError:
        needed = 1 << 20  # bundles.stage says what is wrong with the path
    with write_faults(lib.store.folder(), "import again", needed):
        return _import(lib, path, limits, check_model, trust_verdicts, on_progress, recomputed)


def _import(
    lib: Library, path, limits: bundles.Limits, check_model: bool, trust_verdicts: bool, on_progress, recomputed=frozenset()
) -> ImportReport:
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=lib.home))
    try:
        staged = bundles.stage(path, staging, limits)
        manifest, rows, blobs = _verify_staged(staged)
        expected = lib.lm.fingerprint if check_model else None  # loaded only for a bundle that is sound
        rebuild: dict[str, str] = {}  # artifact id -> the numerics digest it was made under, where not ours
        for e in manifest["artifacts"]:
            if expected is not None and e["model_fingerprint"] != expected:
                numerics = other_numerics(lib.lm, manifest, e["model_fingerprint"])
                if numerics is None:
                    raise IncompatibleArtifact(
                        f"artifact {e['id']} was made by model {e['model_fingerprint'][:16]}, this store's model is "
                        f"{expected[:16]}; import it into a store running that model (--model), nothing was imported"
                    )
                rebuild[e["id"]] = numerics
        checked = vet(
            lib,
            rows,
            blobs,
            use_model=check_model,
            trust_verdicts=trust_verdicts,
            on_progress=on_progress,
            rebuild=rebuild,
            recomputed=recomputed,
        )
        rows, blobs = checked.rows, checked.blobs
        written = []
        try:
            for digest, staged_file in sorted(blobs.items()):
                if lib.store.blobs.exists(digest):
                    try:
                        lib.store.blobs.get(digest, rehash=True)
                        continue
                    except IntegrityError:  # a corrupt copy: the bundle's verified bytes restore it
                        lib.store.blobs.delete(digest)
                data = staged_file if isinstance(staged_file, bytes) else staged_file.read_bytes()
                stored, created = lib.store.blobs.write(data)
                if created:
                    written.append(stored)
                if stored != digest:  # the staged file changed after its check: undone below
                    raise IntegrityError(f"staged blob {digest} changed during the import; nothing was imported")
            new = lib.store.catalog.import_rows(rows)
        except BaseException:
            lib.store.discard_blobs(written)  # undo: a blob no row refers to would be an orphan
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
        replayed=checked.replayed,
        not_reverified=checked.labelled,
        probes_checked=checked.probes_checked,
        attested_dropped=checked.attested_dropped,
        embeddings_recomputed=len(rows["embeddings"]),
        rebuilt=checked.rebuilt,
    )
