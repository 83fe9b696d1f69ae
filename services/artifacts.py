"""`Artifacts`: reading a store's artifacts for grafting, and what this process has proved about them. Every
read is hash-checked (the blob store) and matched to its catalog row; an artifact's probe is checked on its
first restore in this process, and the proved state's digest is kept for the answers' state proofs. A failed
probe quarantines. It knows the store and the model it is handed, nothing about retrieval or answers.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from errors import IntegrityError, KvgraftError, quarantine_message

from .results import WarmReport

if TYPE_CHECKING:  # the engine (torch) loads at the first read, not with the web page
    from graft_core.artifact import KVArtifact
    from graft_core.model import LoadedModel
    from graft_core.proof import ProvenState

    from .store import Store


class Artifacts:
    """The artifact reads and first-use proofs of one store and one model (module doc)."""

    def __init__(self, store: Store, lm: Callable[[], LoadedModel]):
        self._store = store
        self._lm = lm
        self._proved: dict[str, ProvenState] = {}  # content hash -> its restored state, probe-proved in this process
        # content hash -> the artifact as decoded, while a restored cache still holds it (graft_core.graft.restore
        # keeps its chain on the cache): concurrent answers from one artifact read one copy of its rows
        self._live: weakref.WeakValueDictionary[str, KVArtifact] = weakref.WeakValueDictionary()
        self._live_lock = threading.Lock()

    # ---- what this process proved -------------------------------------------------------------

    def state(self, content_sha256: str) -> ProvenState | None:
        """The state the probe proved for this content in this process (None: not proved yet)."""
        return self._proved.get(content_sha256)

    def proven(self) -> frozenset[str]:
        """The content hashes proved in this process."""
        return frozenset(self._proved)

    def remember(self, content_sha256: str, state: ProvenState) -> None:
        """Record a state an answer's own probe proved (its later answers then carry the state proof)."""
        self._proved[content_sha256] = state

    def forget(self, content_sha256: str) -> None:
        """Drop what was proved for this content (a failed proof): its next use probes again."""
        self._proved.pop(content_sha256, None)

    def forget_proofs(self) -> None:
        """Drop every proof, as a new process starts: each artifact's next restore probes again."""
        self._proved.clear()

    # ---- reads ------------------------------------------------------------------------------------

    def load(self, artifact_id: str, quarantined_too: bool = False) -> KVArtifact:
        """Read, hash-check and decode one artifact (IntegrityError on any mismatch, and on a quarantined
        artifact unless `quarantined_too`: only the probe reads those). While an answer's cache holds the same
        content (read, hash-checked and decoded by that answer), that object is returned instead of a second
        copy: the answers grafting it then read one copy of its rows (graft_core.layers), and each answer's
        state proof still hashes the state it serves."""
        row = self._store.catalog.get(artifact_id)
        if row.quarantine and not quarantined_too:
            raise IntegrityError(quarantine_message(row.id, row.quarantine))
        from graft_core import codec

        with self._live_lock:
            art = self._live.get(row.content_sha256)
        if art is None:
            art = codec.loads(self._store.blobs.get(row.content_sha256))
            with self._live_lock:
                art = self._live.setdefault(row.content_sha256, art)
        if art.key != row.id:
            raise KvgraftError(f"artifact file for {row.id} holds {art.key}: the catalog and the blob store disagree; run fsck")
        return art

    def chain(self, artifact_id: str) -> tuple[list[KVArtifact], float]:
        """`artifact_id`'s chain, root first, read as `load` reads, and the seconds the reads took."""
        t0 = time.perf_counter()
        chain = [self.load(r.id) for r in self._store.catalog.chain(artifact_id)]
        return chain, time.perf_counter() - t0

    def probe(self, artifact_id: str, force: bool = False) -> str | None:
        """Restore the artifact's chain and check its probe hash (once per content hash in this process
        unless `force`), remembering the proved state's BLAKE3 for the answers' state proofs. A mismatch
        quarantines the artifact and is returned as the reason; None: passed."""
        from graft_core.proof import check_probe

        row = self._store.catalog.get(artifact_id)
        if self._proved.get(row.content_sha256) and not force:
            return None
        with self._store.lock:
            if self._proved.get(row.content_sha256) and not force:  # an answer proved it while this one waited
                return None
            chain = [self.load(r.id, quarantined_too=r.id == row.id) for r in self._store.catalog.chain(row.id)]
            why, state = check_probe(self._lm(), chain, row.probe_sha256)
        if why is not None:
            self._store.catalog.set_quarantine(row.id, f"probe check failed: {why}")
            self._proved.pop(row.content_sha256, None)
            return why
        self._proved[row.content_sha256] = state
        return None

    def graftable(self, ids: list[str]) -> list[KVArtifact]:
        """Load `ids` for grafting; each artifact's probe is checked on its first restore in this process
        and a mismatch quarantines it and raises IntegrityError (nothing is grafted)."""
        arts = [self.load(i) for i in ids]
        for i in ids:
            why = self.probe(i)
            if why is not None:
                raise IntegrityError(quarantine_message(i, f"probe check failed: {why}"))
        return arts

    # ---- proving ahead of a question ----------------------------------------------------------------

    def prove_chain(self, artifact_id: str) -> float:
        """Prove `artifact_id`'s chain now, root first (`graftable`: each artifact's first-use probe, once per
        content hash in this process; a mismatch quarantines and raises IntegrityError). Returns the seconds."""
        t0 = time.perf_counter()
        self.graftable([r.id for r in self._store.catalog.chain(artifact_id)])
        return time.perf_counter() - t0

    def warm_proofs(self, limit: int) -> WarmReport:
        """Run the first-use probe (`probe`, the same check an answer's first use runs: a mismatch quarantines)
        on up to `limit` of the newest artifacts, so that their first answers in this process carry the state
        proof (one BLAKE3 of the served state) instead of paying the probe forward. Each probe takes the model
        lock on its own, so answers asked meanwhile interleave. Quarantined artifacts, other models' artifacts
        and artifacts without a probe hash are passed over (answers refuse or skip them anyway)."""
        t0 = time.perf_counter()
        rows = self._store.catalog.list_artifacts(limit=limit) if limit > 0 else []
        fingerprint = self._lm().fingerprint if rows else ""
        proved = already = 0
        skipped: list[str] = []
        quarantined: list[str] = []
        for row in rows:
            why_not = (
                "quarantined"
                if row.quarantine
                else "another model fingerprint"
                if row.model_fingerprint != fingerprint
                else "no probe hash"
                if not row.probe_sha256
                else None
            )
            if why_not:
                skipped.append(f"{row.id[:12]}: {why_not}")
            elif self._proved.get(row.content_sha256):
                already += 1
            else:
                try:
                    why = self.probe(row.id)
                except KvgraftError as exc:  # unreadable, a chain link missing: its answers will say so
                    skipped.append(f"{row.id[:12]}: {exc}")
                else:
                    if why is None:
                        proved += 1
                    else:
                        quarantined.append(row.id)
        return WarmReport(
            proved=proved,
            already=already,
            quarantined=tuple(quarantined),
            seconds=time.perf_counter() - t0,
            skipped_why=tuple(skipped),
        )
