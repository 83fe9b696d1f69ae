"""The built-in library (library_seed/: verified items and attested fact sheets) brought into a store.

Deposited through the gate (`seed_library`), each item costs the model's generations (about 10 s each on
two cores). So the library also ships as what an export of those deposits holds, less the artifact files
(`write_bundle`, `cli.py seed --write-bundle`: deterministic, a test compares it with the committed
library.json): the catalog rows (texts, gate runs with their token ids) and each artifact's content hash.
A store running the model and numerical definition it was made by brings it in through the import's proof
instead (`bring_in`): each artifact recomputed here from its text must hash to what the gate deposited,
then the bundle import checks every hash again before anything is recorded; the gate runs are kept
(replayable), labelled as imported. Anything else seeds through the gate. The artifact files themselves
(1.3-1.8 MB each, float32 KV state that does not compress) are never committed. Used by the app's start-up,
`cli.py seed`, `cli.py verify` on an empty store and the eval; a repeat costs nothing (deposits and imports
are named before any work).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from errors import IntegrityError, InvalidInput, VerificationFailed

log = logging.getLogger("kvgraft.seed")

SEED_DIR = Path(__file__).resolve().parent.parent / "library_seed"
BUNDLE = SEED_DIR / "library.json"  # the built-in library's recipe: a bundle's manifest and catalog (write_bundle)
BUNDLE_FORMAT = "kvgraft-library/1"
BUNDLE_TIME = datetime(2026, 1, 1, tzinfo=UTC)  # every timestamp in it: its bytes name no moment


def seed_items(folder: Path = SEED_DIR) -> tuple[list[dict], list[tuple[str, str]]]:
    """The verified items (items.jsonl) and the fact sheets (*.txt: (title, text)) of a seed folder."""
    items = [json.loads(line) for line in (folder / "items.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    sheets = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]
    return items, sheets


def seed_library(library, folder: Path = SEED_DIR, on_progress: Callable[[float, str], None] | None = None) -> int:
    """Deposit the built-in library into `library`, each item through the deposit gate: an item the model
    does not answer correctly with its graft is refused, logged and left out (the rest still seed).
    Returns how many artifacts were new."""
    progress = on_progress or (lambda f, m: None)
    items, sheets = seed_items(folder)
    total, created = len(items) + len(sheets), 0
    for i, it in enumerate(items):
        progress(i / total, f"seeding the built-in library: {i + 1}/{total} {it['question']}")
        try:
            created += library.deposit_item(**it).created
        except VerificationFailed as e:
            log.warning("seed item refused by the gate: %s", e)
    for j, (title, text) in enumerate(sheets, start=len(items)):
        progress(j / total, f"seeding the built-in library: {j + 1}/{total} fact sheet '{title}'")
        created += library.deposit_text(text, title=title, attested_by="kvgraft built-in library", admin=True).created
    progress(1.0, f"built-in library ready: {total} artifacts ({created} new)")
    return created


def write_bundle(library, out: Path = BUNDLE, folder: Path = SEED_DIR, on_progress=None) -> dict:
    """Seed `library`, an empty store, through the gate (`seed_library`), export every artifact as a
    deterministic bundle (services.exchange, timestamps BUNDLE_TIME, no embeddings) and write its manifest
    and catalog, without the artifact files, to `out`: the recipe `bring_in` recomputes them from, each
    checked against the content hash the gate's deposit gave it. The same deposits give the same bytes.
    Returns what was written (path, artifacts, bytes, sha256)."""
    import tarfile
    import tempfile

    from files import write_atomic

    from .exchange import CATALOG, MANIFEST, export_bundle

    if library.count():
        raise InvalidInput(
            f"the built-in library is written from an empty store; this one holds {library.count()} artifacts "
            "(point KVGRAFT_HOME at a new folder)"
        )
    seed_library(library, folder, on_progress)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=library.home) as tmp:
        export_bundle(library, library.artifact_ids(), Path(tmp) / "library.tar", at=BUNDLE_TIME)
        with tarfile.open(Path(tmp) / "library.tar", "r:") as tar:
            manifest, catalog = (json.loads(tar.extractfile(m).read()) for m in (MANIFEST, CATALOG))
    data = _json({"format": BUNDLE_FORMAT, "manifest": manifest, "catalog": catalog})
    write_atomic(Path(out), data)
    return {"path": str(out), "artifacts": len(manifest["artifacts"]), "bytes": len(data), "sha256": _sha256(data)}


def _json(obj) -> bytes:
    from .exchange import _json_bytes

    return _json_bytes(obj)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _read(bundle: Path) -> dict | None:
    try:
        doc = json.loads(Path(bundle).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == BUNDLE_FORMAT else None


def recipe_path(model_name: str, folder: Path = SEED_DIR) -> Path:
    """Where the built-in library's recipe for `model_name` is written: library.json for the default packaged
    model, library-<name>.json for another (`packaged:qwen2.5-coder-1.5b-instruct` -> library-qwen2.5-coder-1.5b-instruct.json)."""
    from graft_core.model import DEFAULT_MODEL

    if model_name == DEFAULT_MODEL:
        return folder / BUNDLE.name
    slug = "".join(c if c.isalnum() or c in ".-_" else "-" for c in model_name.split(":")[-1].rsplit("/", 1)[-1])
    return folder / f"library-{slug}.json"


def recipe_for(identity: str, folder: Path = SEED_DIR) -> Path | None:
    """The committed recipe whose artifacts this model identity (ModelInfo.fingerprint) made, whichever file holds
    it (decided by what each file says, never by its name); None where none does."""
    for path in sorted(folder.glob("library*.json")):
        if bundle_model(path) == identity:
            return path
    return None


def bundle_model(bundle: Path = BUNDLE) -> str | None:
    """The model identity (ModelInfo.fingerprint) the built-in library's artifacts were made by, or None (no
    file, another format, or one that does not say)."""
    doc = _read(bundle)
    claims = (doc.get("manifest") or {}).get("models") if doc else None
    ids = {c.get("identity") for c in claims.values() if isinstance(c, dict)} if isinstance(claims, dict) else set()
    return ids.pop() if len(ids) == 1 else None


def _recomputed(library, doc: dict, progress) -> dict[str, bytes]:
    """Each artifact of the recipe prefilled here from its source text's tokens (after its recomputed parents),
    as tar members by name; IntegrityError unless its bytes hash to the content hash the gate's deposit gave it."""
    from graft_core import codec, templates
    from graft_core.artifact import text_sha256
    from graft_core.capture import capture

    from .exchange import CATALOG, MANIFEST

    manifest, rows = doc["manifest"], doc["catalog"]
    texts = {s["artifact_id"]: s["text"] for s in rows["sources"]}
    entries = {e["id"]: e for e in manifest["artifacts"]}
    made: dict[str, object] = {}
    members: dict[str, bytes] = {MANIFEST: _json(manifest), CATALOG: _json(rows)}
    lm = library.lm
    for n, a in enumerate(sorted(rows["artifacts"], key=lambda r: (r["depth"], r["id"])), start=1):
        chain, cur = [], a.get("parent_id")
        while cur:
            chain.insert(0, made[cur])
            cur = entries[cur]["parent"]
        text = texts[a["id"]]
        ids = templates.deposit_ids(lm.tokenizer, text, root=not chain)
        with library.store.lock:
            art, _ = capture(lm, list(ids), parents=chain, text_sha256=text_sha256(text))
        data = codec.dumps(art)
        entry = entries[a["id"]]
        if _sha256(data) != entry["content_sha256"] or art.key != a["id"]:
            raise IntegrityError(
                f"built-in artifact {a['id'][:16]} recomputed here from its text is not the one the gate deposited "
                f"(content {_sha256(data)[:16]}, the library says {entry['content_sha256'][:16]}): this machine computes "
                "other bytes; seed through the gate instead (`cli.py seed --through-gate`)"
            )
        made[a["id"]] = art
        members[entry["member"]] = data
        progress(0.9 * n / len(rows["artifacts"]), f"built-in library: recomputed {n}/{len(rows['artifacts'])} artifacts")
    return members


def bring_in(
    library, folder: Path = SEED_DIR, on_progress: Callable[[float, str], None] | None = None, bundle: Path | None = None
) -> int:
    """The built-in library into `library`. Where it was made by this model under this numerical definition,
    each artifact is recomputed here from its text and must hash to the content hash the gate's deposit gave
    it, then the whole goes through the bundle import (services.exchange: every hash checked against the
    manifest, retokenised, embeddings made here; not recomputed a second time) with its gate runs kept, token ids and all,
    labelled imported, and the fact sheets' attestation kept (the library ships with this code). Anything
    else (another model, another definition, no file) is deposited through the gate (`seed_library`).
    Returns how many artifacts were new."""
    import tempfile

    from db import bundles

    from .exchange import import_bundle

    progress = on_progress or (lambda f, m: None)
    lm = library.lm
    bundle = bundle or recipe_for(lm.info.fingerprint, folder) or folder / BUNDLE.name  # this model's recipe, if committed
    doc = _read(bundle)
    if bundle_model(bundle) != lm.info.fingerprint or lm.fingerprint not in doc["manifest"].get("model_fingerprints", []):
        log.info("the built-in library was made by another model or numerical definition: seeding through the gate")
        return seed_library(library, folder, on_progress)
    progress(0.0, "bringing in the built-in library: recomputing each artifact from its text")
    members = _recomputed(library, doc, progress)
    with tempfile.TemporaryDirectory(prefix=".builtin-", dir=library.home) as tmp:
        path = Path(tmp) / "library.tar"
        bundles.write(path, members)
        report = import_bundle(
            library,
            path,
            trust_verdicts=True,
            on_progress=lambda f, m: progress(0.9 + 0.1 * f, f"built-in library: {m}"),
            recomputed=frozenset(e["id"] for e in doc["manifest"]["artifacts"]),
        )
    progress(1.0, f"built-in library ready: {len(report.artifacts)} artifacts ({len(report.new)} new), each recomputed here")
    return len(report.new)
