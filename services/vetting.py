"""Never trust a bundle: before an import is recorded, each artifact's source text is re-tokenised and
must give the artifact's own token ids, its probe hash is checked on the restored state, embeddings
are recomputed here (the bundle's are dropped), and each verification is replayed (graft, generate,
verifier) before it counts as verified. With `trust_verdicts` (an admin's choice) or without a model,
the replay is skipped and the rows are labelled "imported, not re-verified".

It works on the staged, hash-checked rows of `services.exchange` and returns the rows to record; it
writes nothing itself.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from db.blobs import sha256_bytes
from db.rows import VerificationRow
from errors import IntegrityError, InvalidInput

from . import gate

if TYPE_CHECKING:
    from graft_core.artifact import KVArtifact

    from .library import Library

UNTRUSTED = "imported, not re-verified"


@dataclass(frozen=True)
class Reverified:
    rows: dict  # the catalog rows to record: local embeddings, replayed (or labelled) verifications
    replayed: int  # verifications replayed and passed here
    labelled: int  # verifications kept as "imported, not re-verified"
    probes_checked: int


def _blob(blobs: dict[str, Path | bytes], digest: str) -> bytes:
    """A checked blob's bytes: staged files are read again and must still hash to their name."""
    blob = blobs[digest]
    data = blob.read_bytes() if isinstance(blob, Path) else bytes(blob)
    if sha256_bytes(data) != digest:
        raise IntegrityError(f"staged blob {digest} changed during the import; nothing was imported")
    return data


def _chains(rows: dict, blobs: dict[str, Path | bytes]) -> dict[str, list[KVArtifact]]:
    """Artifact id -> its chain (root first), decoded from the bundle's blobs (exports carry every ancestor)."""
    from graft_core import codec  # the engine loads at the first import of a bundle, not with the web page

    arts = {a["id"]: codec.loads(_blob(blobs, a["content_sha256"])) for a in rows["artifacts"]}
    parent = {a["id"]: a.get("parent_id") for a in rows["artifacts"]}
    out = {}
    for aid in arts:
        chain, cur = [], aid
        while cur:
            if cur not in arts:
                raise IntegrityError(f"bundle artifact {aid} continues {cur}, which the bundle lacks; export it again")
            chain.append(arts[cur])
            cur = parent[cur]
        out[aid] = chain[::-1]
    return out


def _retokenise(lib: Library, aid: str, text: str, art: KVArtifact) -> None:
    from graft_core.artifact import text_sha256

    ids = lib.lm.tokenizer(text, add_special_tokens=not art.parent)["input_ids"]
    if list(ids) != art.token_ids.tolist() or (art.text_sha256 and art.text_sha256 != text_sha256(text)):
        raise IntegrityError(
            f"artifact {aid}: its source text in the bundle tokenises to other tokens than the artifact holds "
            "(the text does not describe the KV state); nothing was imported"
        )


def _replay(lib: Library, chain: list[KVArtifact], src: dict, v: VerificationRow) -> VerificationRow:
    q, s = src.get("question"), src.get("solution")
    if not q or not s or v.reference is None:
        raise IntegrityError(
            f"artifact {chain[-1].key}: a '{v.verifier}' verification without question, solution or reference cannot be replayed; nothing was imported"
        )
    with lib._lock:
        fact = gate.fact_run(lib.lm, q, s, v.verifier, v.reference)
        run = gate.graft_run(lib.lm, chain, q, s, v.verifier, v.reference) if fact.ok else fact
    if not (fact.ok and run.ok):
        raise IntegrityError(
            f"artifact {chain[-1].key}: its verification does not replay here ({run.refusal(v.reference).removesuffix('; nothing deposited')}); "
            "nothing was imported (an admin may import it with --trust-verdicts, labelled 'imported, not re-verified')"
        )
    detail = f"replayed on import: with the solution grafted the model answered {fact.generated!r}; with the artifact grafted {run.generated!r}; {run.detail}"
    return gate.record(run, v.item_sha256, v.verifier, v.reference, detail=detail)


def vet(lib: Library, rows: dict, blobs: dict[str, Path | bytes], use_model: bool, trust_verdicts: bool) -> Reverified:
    """The rows of a staged bundle as this store will record them (see the module docstring)."""
    from graft_core.artifact import text_sha256
    from graft_core.proof import check_probe

    srcs = {s["artifact_id"]: s for s in rows["sources"]}
    chains = _chains(rows, blobs)
    probes = 0
    if use_model:
        for a in rows["artifacts"]:
            chain = chains[a["id"]]
            _retokenise(lib, a["id"], srcs[a["id"]]["text"], chain[-1])
            with lib._lock:
                why, _ = check_probe(lib.lm, chain, a.get("probe_sha256"))
            if why is not None:
                raise IntegrityError(f"artifact {a['id']} fails its probe check: {why}; nothing was imported")
            probes += 1
    replayed = labelled = 0
    vers = []
    for raw in rows["verifications"]:
        try:
            v = VerificationRow(**{**raw, "created_at": datetime.fromisoformat(raw["created_at"]), "id": None})
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(f"bundle verification row is malformed ({type(e).__name__}: {e}); export it again") from None
        if v.verdict != "pass":
            continue
        if v.verifier == "attested":
            vers.append({**raw, "provenance": "attested"})
        elif trust_verdicts or not use_model:
            vers.append({**raw, "provenance": UNTRUSTED})
            labelled += 1
        else:
            new = _replay(lib, chains[v.artifact_id], srcs[v.artifact_id], v)
            vers.append({**raw, **{k: getattr(new, k) for k in _RECORD}, "created_at": raw["created_at"]})
            replayed += 1
    embs = []
    for a in rows["artifacts"]:
        src = srcs[a["id"]]
        text = src.get("question") or src["text"]
        vec = np.asarray(lib.embedder.embed(text), dtype="<f4")
        embs.append(
            {
                "artifact_id": a["id"],
                "embedder_id": lib.embedder.embedder_id,
                "dim": int(vec.shape[0]),
                "vector": base64.b64encode(vec.tobytes()).decode("ascii"),
                "text_sha256": text_sha256(text),
            }
        )
    arts = [{**a, "quarantine": None, "probe_sha256": chains[a["id"]][-1].probe_sha256} for a in rows["artifacts"]]
    return Reverified({**rows, "artifacts": arts, "verifications": vers, "embeddings": embs}, replayed, labelled, probes)


_RECORD = (
    "verdict",
    "detail",
    "question_token_ids",
    "question_sha256",
    "generated_token_ids",
    "generated_sha256",
    "generated_answer",
    "provenance",
)
