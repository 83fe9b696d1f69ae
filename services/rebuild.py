"""Rebuild-and-compare: recompute one artifact from its source text on this machine and compare its bytes
with the stored blob (CLI `rebuild --compare`); a match also lifts a quarantine, the only way one is lifted.

Takes a `Library` and returns a frozen report with `to_json()`; it formats nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from db.blobs import sha256_bytes
from errors import IncompatibleArtifact

if TYPE_CHECKING:
    from .library import Library


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
    probe_ok: bool | None = None  # the stored artifact's probe check on its restored state (None: no blob)
    probe_detail: str = ""  # why the probe failed (the artifact is then quarantined)

    def to_json(self) -> dict:
        return asdict(self)


def rebuild_compare(lib: Library, artifact_id: str) -> RebuildReport:
    """Recompute the artifact from its source text on this machine and compare bytes with the stored blob."""
    from graft_core import codec, templates  # the engine loads here, not with the web page
    from graft_core.artifact import text_sha256
    from graft_core.capture import capture

    row = lib.store.catalog.get(artifact_id)
    lm = lib.lm
    if row.model_fingerprint != lm.fingerprint:
        raise IncompatibleArtifact(
            f"artifact {row.id} was made by model {row.model_fingerprint[:16]}, this model is {lm.fingerprint[:16]}; "
            "rebuild it with the model that made it (--model)"
        )
    text = lib.store.catalog.source(row.id).text
    token_ids = templates.deposit_ids(lm.tokenizer, text, root=row.parent_id is None)
    with lib.store.lock:
        parents = lib.load_chain(row.parent_id)[0] if row.parent_id else []
        art, stats = capture(lm, token_ids, parents=parents, text_sha256=text_sha256(text))
    data = codec.dumps(art)
    blob_sha = lib.store.blobs.actual_sha256(row.content_sha256)
    rebuilt = sha256_bytes(data)
    why = lib.probe(row.id, force=True) if blob_sha == row.content_sha256 else "the stored blob is missing or corrupt"
    probe_ok = why is None
    same = probe_ok and rebuilt == row.content_sha256 and blob_sha == row.content_sha256 and art.key == row.id
    if same and row.quarantine:  # recomputed from its tokens to the stored bytes: proven, release it
        lib.store.catalog.set_quarantine(row.id, None)
    return RebuildReport(
        id=row.id,
        probe_ok=probe_ok,
        probe_detail=why or "",
        equal=same,
        stored_sha256=row.content_sha256,
        blob_sha256=blob_sha,
        rebuilt_sha256=rebuilt,
        rebuilt_id=art.key,
        bytes=len(data),
        prefill_s=stats.prefill_s,
    )
