"""Never trust a bundle: before an import is recorded, each artifact's source text is re-tokenised and
must give the artifact's own token ids, and the artifact is recomputed here from those tokens (on its
parent chain) and must give the bundle's bytes exactly: a KV state that does not come from its tokens
is refused, whatever its probe hash says. Embeddings are recomputed here (the bundle's are dropped),
and each verification is replayed (graft, generate, verifier) before it counts as verified. With
`trust_verdicts` (an admin's choice) or without a model, the replay is skipped and the rows are labelled
"imported, not re-verified"; `attested` rows (a person's word, nothing to replay) are kept only with
`trust_verdicts`, so without it their artifacts arrive unverified.

It works on the staged, hash-checked rows of `services.exchange` and returns the rows to record; it
writes nothing itself.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
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
UNPROVEN = (
    "imported without recomputation (no model check): `cli.py rebuild --compare ID` proves it from its tokens and releases it"
)


@dataclass(frozen=True)
class Reverified:
    rows: dict  # the catalog rows to record: local embeddings, replayed (or labelled) verifications
    replayed: int  # verifications replayed and passed here
    labelled: int  # verifications kept as "imported, not re-verified"
    probes_checked: int  # artifacts recomputed from their tokens and found byte-identical to the bundle's
    attested_dropped: int = 0  # attested verdicts left out (kept only with trust_verdicts)
    blobs: dict | None = None  # content hash -> the bytes to store (staged file, or the rebuilt artifact's bytes)
    rebuilt: int = 0  # artifacts of another numerical definition, recomputed here from their tokens under new ids


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
    from graft_core import templates
    from graft_core.artifact import text_sha256

    ids = templates.deposit_ids(lib.lm.tokenizer, text, root=not art.parent)
    if list(ids) != art.token_ids.tolist() or (art.text_sha256 and art.text_sha256 != text_sha256(text)):
        raise IntegrityError(
            f"artifact {aid}: its source text in the bundle tokenises to other tokens than the artifact holds "
            "(the text does not describe the KV state); nothing was imported"
        )


def _rebuild(lib: Library, chain: list[KVArtifact]) -> KVArtifact:
    """The artifact's own tokens prefilled here after its (already rebuilt) parent chain: this model's bytes
    under this machine's numerical definition, whatever the bundle held."""
    from graft_core.capture import capture

    art = chain[-1]
    with lib.store.lock:
        rebuilt, _ = capture(lib.lm, art.token_ids.tolist(), parents=chain[:-1], text_sha256=art.text_sha256)
    return rebuilt


def _recompute(lib: Library, aid: str, chain: list[KVArtifact], bundled: bytes) -> None:
    """Prefill the artifact's own tokens after its parent chain here and compare the bytes with the bundle's.

    The parents are the bundle's own artifacts; each of them is recomputed in its turn, so a chain passes
    only if every link is what its tokens give on this machine."""
    from graft_core import codec

    rebuilt = _rebuild(lib, chain)
    if codec.dumps(rebuilt) != bundled:
        what = _first_difference(chain[-1], rebuilt)
        raise IntegrityError(
            f"artifact {aid}: recomputed here from its own tokens it is not the bundle's artifact ({what}); "
            "its KV state does not come from its tokens, nothing was imported"
        )


def _first_difference(bundled: KVArtifact, rebuilt: KVArtifact) -> str:
    if bundled.probe_sha256 != rebuilt.probe_sha256:
        return f"probe hash {bundled.probe_sha256[:16]} in the bundle, {rebuilt.probe_sha256[:16]} here"
    for name, ours, theirs in (("keys", bundled.keys, rebuilt.keys), ("values", bundled.values, rebuilt.values)):
        for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
            if x.shape != y.shape or x.numpy().tobytes() != y.numpy().tobytes():
                return f"layer {i} {name} differ"
    return "the file bytes differ"


def _replay(lib: Library, chain: list[KVArtifact], src: dict, v: VerificationRow) -> VerificationRow:
    q, s = src.get("question"), src.get("solution")
    if not q or not s or v.reference is None:
        raise IntegrityError(
            f"artifact {chain[-1].key}: a '{v.verifier}' verification without question, solution or reference cannot be replayed; nothing was imported"
        )
    with lib.store.lock:
        fact = gate.fact_run(lib.lm, q, s, v.verifier, v.reference)
        run = gate.graft_run(lib.lm, chain, q, s, v.verifier, v.reference) if fact.ok else fact
    if not (fact.ok and run.ok):
        raise IntegrityError(
            f"artifact {chain[-1].key}: its verification does not replay here ({run.refusal(v.reference).removesuffix('; nothing deposited')}); "
            "nothing was imported (an admin may import it with --trust-verdicts, labelled 'imported, not re-verified')"
        )
    detail = f"replayed on import: with the solution grafted the model answered {fact.generated!r}; with the artifact grafted {run.generated!r}; {run.detail}"
    return gate.record(run, v.item_sha256, v.verifier, v.reference, detail=detail)


def vet(
    lib: Library,
    rows: dict,
    blobs: dict[str, Path | bytes],
    use_model: bool,
    trust_verdicts: bool,
    on_progress: Callable[[float, str], None] | None = None,
    rebuild: dict[str, str] | None = None,
    recomputed: frozenset[str] = frozenset(),
) -> Reverified:
    """The rows of a staged bundle as this store will record them (see the module docstring). `on_progress`
    hears (fraction, message) after each artifact is recomputed, by tokens done of the bundle's tokens.

    `rebuild` names the artifacts made under another numerical definition (id -> its numerics digest): each
    is recomputed from its tokens (after its rebuilt parents) and recorded under its new id with the origin
    "rebuilt: ...", its bytes this machine's, never the bundle's; their descendants are rebuilt with them.

    `recomputed` names artifacts whose bytes the caller itself just computed here from their tokens (the
    built-in library, services.seed, whose bytes are checked against the gate's content hashes): computing
    them once more could only give the same bytes, so they count as recomputed without it."""
    from graft_core import codec
    from graft_core.artifact import text_sha256

    rebuild = rebuild or {}
    srcs = {s["artifact_id"]: s for s in rows["sources"]}
    chains = _chains(rows, blobs)
    parent_of = {a["id"]: a.get("parent_id") for a in rows["artifacts"]}
    probes = 0
    made: dict[str, KVArtifact] = {}  # bundle id -> the artifact rebuilt here
    blobs = dict(blobs)
    if rebuild and not use_model:
        raise InvalidInput(
            "this bundle was made under another numerical definition: importing it rebuilds it, which needs the model"
        )
    if use_model:
        total = sum(chains[a["id"]][-1].length for a in rows["artifacts"]) or 1
        done = 0
        for a in sorted(rows["artifacts"], key=lambda r: len(chains[r["id"]])):  # parents before children
            chain = chains[a["id"]]
            _retokenise(lib, a["id"], srcs[a["id"]]["text"], chain[-1])
            if a["id"] in rebuild or parent_of[a["id"]] in made:
                made[a["id"]] = _rebuild(lib, [made.get(x.key, x) for x in chain])
            else:
                if a["id"] not in recomputed:
                    _recompute(lib, a["id"], chain, _blob(blobs, a["content_sha256"]))
                probes += 1
            done += chain[-1].length
            if on_progress:
                n = probes + len(made)
                on_progress(done / total, f"recomputed {n}/{len(rows['artifacts'])} artifacts ({done:,}/{total:,} tokens)")
    new_id = {old: art.key for old, art in made.items()}
    rows = _renamed(rows, new_id)
    srcs = {new_id.get(k, k): v for k, v in srcs.items()}
    chains = {new_id.get(k, k): [made.get(x.key, x) for x in chain] for k, chain in chains.items()}
    replayed = labelled = attested_dropped = 0
    vers = []
    for raw in rows["verifications"]:
        try:
            v = VerificationRow(**{**raw, "created_at": datetime.fromisoformat(raw["created_at"]), "id": None})
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(f"bundle verification row is malformed ({type(e).__name__}: {e}); export it again") from None
        if v.verdict != "pass":
            continue
        if v.verifier == "attested":
            if trust_verdicts:
                vers.append({**raw, "provenance": "attested"})
            else:  # a person's word cannot be replayed: only the admin's --trust-verdicts brings it in
                attested_dropped += 1
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
        vec = np.asarray(lib.store.embedder.embed(text), dtype="<f4")
        embs.append(
            {
                "artifact_id": a["id"],
                "embedder_id": lib.store.embedder.embedder_id,
                "dim": int(vec.shape[0]),
                "vector": base64.b64encode(vec.tobytes()).decode("ascii"),
                "text_sha256": text_sha256(text),
            }
        )
    held = None if use_model else UNPROVEN
    arts = []
    rebuilt_ids = {art.key: old for old, art in made.items()}
    for a in rows["artifacts"]:
        art = chains[a["id"]][-1]
        out = {**a, "quarantine": held, "probe_sha256": art.probe_sha256, "origin": "imported"}
        if a["id"] in rebuilt_ids:
            data = codec.dumps(art)
            digest = sha256_bytes(data)
            blobs.pop(a["content_sha256"], None)  # the bundle's bytes are not kept
            blobs[digest] = data
            numerics = rebuild.get(rebuilt_ids[a["id"]]) or "its parent's"
            out.update(
                content_sha256=digest,
                bytes=len(data),
                model_fingerprint=art.model_fingerprint,
                origin=f"rebuilt: made under numerics {numerics[:16]}, recomputed here from its tokens (bundle id {rebuilt_ids[a['id']][:16]})",
            )
        arts.append(out)
    return Reverified(
        {**rows, "artifacts": arts, "verifications": vers, "embeddings": embs},
        replayed,
        labelled,
        probes,
        attested_dropped,
        blobs=blobs,
        rebuilt=len(made),
    )


def _renamed(rows: dict, new_id: dict[str, str]) -> dict:
    """The bundle's rows with every artifact id in `new_id` replaced by its new one (ids, parents, sources,
    verifications; embeddings are recomputed under the new ids)."""
    if not new_id:
        return rows

    def n(x):
        return new_id.get(x, x) if x else x

    return {
        **rows,
        "artifacts": [{**a, "id": n(a["id"]), "parent_id": n(a.get("parent_id"))} for a in rows["artifacts"]],
        "sources": [{**s, "artifact_id": n(s["artifact_id"])} for s in rows["sources"]],
        "verifications": [{**v, "artifact_id": n(v.get("artifact_id"))} for v in rows["verifications"]],
    }


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
