"""`Library`: one store (`services.store.Store`: catalog, blobs, index, model lock) and one model, behind
the door front ends use (`LibraryDoor`).

The pipelines live in their own modules (deposit, answer, samples, solve) and are mixed in here; this
module holds the shared parts (lazily loaded model and embedder, artifact reads) and the read-only
views of the store (list, show, stats). Front ends call a method and format its result; the upkeep
functions (services.checks, exchange, replay) work on `store`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import settings
from db import aggregates
from db.catalog import Embedding
from db.queries import library_rows
from db.rows import ArtifactRow, LedgerRow, SourceRow
from errors import IntegrityError, KvgraftError, quarantine_message
from graft_core import model as model_mod  # names only: torch loads in model_mod.load

from . import limits
from .answer import AnswerPipeline
from .deposit import DepositPipeline
from .door import AnswerOptions
from .results import DeleteReport, LibraryEntry, ShowReport, StoreStats, WarmReport
from .samples import VerifyPipeline
from .solve import SolvePipeline
from .store import Store

WARM_UP_QUESTION = "What is this about?"  # warm_answer's fixed question: never a user's, never recorded

if TYPE_CHECKING:  # the engine (torch) and retrieval (faiss) load at first use (the web app's start-up
    from graft_core.artifact import KVArtifact  # stages), so that importing services serves a page at once
    from graft_core.proof import ProvenState
    from retrieval import Embedder, VectorIndex


def default_home() -> Path:
    return settings.get("KVGRAFT_HOME")


class Library(DepositPipeline, AnswerPipeline, VerifyPipeline, SolvePipeline):
    """One store (catalog + blobs + index) and one model, shared by every request of a process.

    The model runs one request at a time per process (the store's lock); the catalog is safe to share
    between processes."""

    def __init__(
        self,
        home: str | os.PathLike | None = None,
        db_url: str | None = None,
        model_name: str | None = None,
        embedder: Embedder | None = None,
        lm: model_mod.LoadedModel | None = None,
        blob_root: str | os.PathLike | None = None,
    ):
        self.home = Path(home) if home else default_home()
        self.home.mkdir(parents=True, exist_ok=True)
        blobs = Path(blob_root) if blob_root else None  # a root shared by replicas (serving/)
        self.store = Store.open(self.home, db_url or settings.get("KVGRAFT_DB_URL"), blobs, lambda: self.embedder)
        self.model_name = model_name
        self._lm = lm
        self._embedder = embedder
        self._probed: dict[str, ProvenState] = {}  # content hash -> its restored state, probe-proved in this process
        # content hash -> the artifact as decoded, while a restored cache still holds it (graft_core.graft.restore
        # keeps its chain on the cache): concurrent answers from one artifact read one copy of its rows
        self._live: weakref.WeakValueDictionary[str, KVArtifact] = weakref.WeakValueDictionary()
        self._live_lock = threading.Lock()
        self._steps = None  # graft_core.stepgroup.StepGroup once an answer needs it; False where none applies
        self._fill_flywheel()

    def close(self) -> None:
        """Release the catalog's connections (the library is unusable afterwards)."""
        self.store.close()

    def index(self) -> VectorIndex:
        """The store's FAISS index (loaded, synced or rebuilt from the catalog: `Store.index`)."""
        return self.store.index()

    # ---- lazily loaded parts ----------------------------------------------------------------

    @property
    def lm(self) -> model_mod.LoadedModel:
        if self._lm is not None:  # loaded: no lock, or every use (a tokenisation, a record) would wait for the model
            return self._lm
        with self.store.lock:
            if self._lm is None:
                self._lm = model_mod.load(self.model_name)
            return self._lm

    @property
    def model_loaded(self) -> bool:
        """Whether the model is in memory already (else the first use of `lm` loads it)."""
        return self._lm is not None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from retrieval.embedder import SentenceEmbedder

            self._embedder = SentenceEmbedder()
        return self._embedder

    @contextlib.contextmanager
    def _after_answers(self):
        """The model lock for one unit of work that is not an answer (a verify sample, a sampled solve attempt):
        where answers decode together, taken once none is decoding or coming, or after ANSWERS_FIRST_S, so a
        chat never waits behind a queue of other work, and that work still runs at least once per bound. Yields
        what to call between two parts of the work, to let answers that arrived meanwhile go first again."""
        steps = self.decode_group()
        if steps is None:
            with self.store.lock:
                yield lambda: None
        else:
            with steps.after_answers(limits.ANSWERS_FIRST_S):
                yield lambda: steps.yield_to_answers(limits.ANSWERS_FIRST_S)

    # ---- reading artifacts -------------------------------------------------------------------

    def load_artifact(self, artifact_id: str, quarantined_too: bool = False) -> KVArtifact:
        """Read, hash-check and decode one artifact (IntegrityError on any mismatch, and on a quarantined
        artifact unless `quarantined_too`: only the probe check reads those). While an answer's cache holds
        the same content (read, hash-checked and decoded by that answer), that object is returned instead of
        a second copy: the answers grafting it then read one copy of its rows (graft_core.layers), and each
        answer's state proof still hashes the state it serves."""
        row = self.store.catalog.get(artifact_id)
        if row.quarantine and not quarantined_too:
            raise IntegrityError(quarantine_message(row.id, row.quarantine))
        from graft_core import codec

        with self._live_lock:
            art = self._live.get(row.content_sha256)
        if art is None:
            art = codec.loads(self.store.blobs.get(row.content_sha256))
            with self._live_lock:
                art = self._live.setdefault(row.content_sha256, art)
        if art.key != row.id:
            raise KvgraftError(f"artifact file for {row.id} holds {art.key}: the catalog and the blob store disagree; run fsck")
        return art

    def probe_check(self, artifact_id: str, force: bool = False) -> str | None:
        """Restore the artifact's chain and check its probe hash (once per content hash in this process
        unless `force`), remembering the proved state's BLAKE3 for the answers' state proofs. A mismatch
        quarantines the artifact and is returned as the reason; None: passed."""
        from graft_core.proof import check_probe

        row = self.store.catalog.get(artifact_id)
        if self._probed.get(row.content_sha256) and not force:
            return None
        with self.store.lock:
            if self._probed.get(row.content_sha256) and not force:  # an answer proved it while this one waited
                return None
            chain = [self.load_artifact(r.id, quarantined_too=r.id == row.id) for r in self.store.catalog.chain(row.id)]
            why, state = check_probe(self.lm, chain, row.probe_sha256)
        if why is not None:
            self.store.catalog.set_quarantine(row.id, f"probe check failed: {why}")
            self._probed.pop(row.content_sha256, None)
            return why
        self._probed[row.content_sha256] = state
        return None

    def prove_chain(self, artifact_id: str) -> float:
        """Prove `artifact_id`'s chain now, root first (`graftable`: each artifact's first-use probe,
        once per content hash in this process; a mismatch quarantines and raises IntegrityError), so that
        an answer grafting it next carries the state proof instead of paying the probe forward: what a
        process that knows its artifact before its question (`cli.py ask --artifact`) does at load.
        Returns the seconds it took."""
        t0 = time.perf_counter()
        self.graftable([r.id for r in self.store.catalog.chain(artifact_id)])
        return time.perf_counter() - t0

    def warm_answer(self, artifact_id: str) -> float:
        """One throw-away answer from `artifact_id` (a fixed question, 1 token, not recorded in the ledger):
        a process that knows its artifact before its question (`cli.py ask --artifact`) pays its first blob
        read into fresh memory, first restore and first question-sized forward over that cache here, at
        load, instead of in the question's time to first token (~15 ms at 2,048 tokens in a one-off
        timing). It changes nothing an answer computes: the bytes of a forward do not depend on what ran
        before it. Run after `prove_chain` (so it carries the state proof, as the real answer will).
        Returns the seconds it took."""
        t0 = time.perf_counter()
        self.answer(WARM_UP_QUESTION, AnswerOptions(artifact=artifact_id, max_new_tokens=1, record=False))
        return time.perf_counter() - t0

    def warm_proofs(self, limit: int) -> WarmReport:
        """Run the first-use probe (`probe_check`, the same check an answer's first use runs: a mismatch
        quarantines) on up to `limit` of the newest artifacts, so that their first answers in this process
        carry the state proof (one BLAKE3 of the served state) instead of paying the probe forward. Each probe
        takes the model lock on its own, so answers asked meanwhile interleave. Quarantined artifacts, other
        models' artifacts and artifacts without a probe hash are passed over (answers refuse or skip them anyway)."""
        t0 = time.perf_counter()
        rows = self.store.catalog.list_artifacts(limit=limit) if limit > 0 else []
        fingerprint = self.lm.fingerprint if rows else ""
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
            elif self._probed.get(row.content_sha256):
                already += 1
            else:
                try:
                    why = self.probe_check(row.id)
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

    def graftable(self, ids: list[str]) -> list[KVArtifact]:
        """Load `ids` for grafting; each artifact's probe is checked on its first restore in this process
        and a mismatch quarantines it and raises IntegrityError (nothing is grafted)."""
        arts = [self.load_artifact(i) for i in ids]
        for i in ids:
            why = self.probe_check(i)
            if why is not None:
                raise IntegrityError(quarantine_message(i, f"probe check failed: {why}"))
        return arts

    def load_chain(self, artifact_id: str) -> tuple[list[KVArtifact], float]:
        t0 = time.perf_counter()
        chain = [self.load_artifact(r.id) for r in self.store.catalog.chain(artifact_id)]
        return chain, time.perf_counter() - t0

    # ---- views of the store ------------------------------------------------------------------

    def entries(self, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0) -> list[LibraryEntry]:
        """Artifacts newest first, each with its latest verification; `query` matches title or text."""
        return [LibraryEntry.of(x) for x in library_rows(self.store.catalog, query=query, kind=kind, limit=limit, offset=offset)]

    def catalog_version(self) -> int:
        """The catalog's change counter (every deposit or delete bumps it); an index built at another
        version is stale. Replicas (serving/) compare it with their index in their health check."""
        return self.store.catalog.version()

    def count(self) -> int:
        """Artifacts in the store (a running total: one primary-key read, whatever the store's size)."""
        return aggregates.read(self.store.catalog, (aggregates.store_size,))[0].artifacts

    def artifact_ids(self) -> list[str]:
        """Every artifact id, newest first."""
        return [r.id for r in self.store.catalog.list_artifacts(limit=max(1, self.count()))]

    def show(self, ref: str) -> ShowReport:
        """One artifact (id or unique prefix): row, source, verification records, chain, children."""
        row = self.store.catalog.get(ref)
        return ShowReport(
            artifact=row,
            source=self.store.catalog.source(row.id),
            verifications=tuple(self.store.catalog.verifications(row.id)),
            chain=tuple(r.id for r in self.store.catalog.chain(row.id)),
            children=tuple(r.id for r in self.store.catalog.children(row.id)),
            blob_present=self.store.blobs.exists(row.content_sha256),
        )

    def ledger(self, last: int | None = None) -> list[LedgerRow]:
        """Recorded answers, oldest first (the newest `last` when given)."""
        return self.store.catalog.ledger(last=last)

    def stats(self, recent: int = 60) -> StoreStats:
        """Ledger sums (running totals: every answer ever recorded, pruned rows included), the latest `recent`
        answers and the store's size against the context window: three bounded reads whatever the ledger's size."""
        size = aggregates.read(self.store.catalog, (aggregates.store_size,))[0]
        return StoreStats(
            totals=self.store.catalog.ledger_totals(),
            recent=tuple(self.store.catalog.ledger(last=recent)),
            store_tokens=size.tokens,
            artifacts=size.artifacts,
            window=self.lm.info.max_positions,
        )

    def delete(self, ref: str) -> DeleteReport:
        """Remove one artifact (refused while others continue its chain) and its blob if nothing else uses it."""
        key = self.store.catalog.get(ref).id
        content = self.store.catalog.delete(key)
        removed = self.store.catalog.content_refcount(content) == 0 and self.store.blobs.delete(content)
        return DeleteReport(id=key, content_sha256=content, blob_removed=bool(removed))

    # ---- for the tools that measure or stress a store (bench/, scripts/) ----------------------

    def stored_tokens(self) -> int:
        """Tokens held by every artifact of the store together."""
        return self.store.catalog.total_tokens()

    def blob_file(self, content_sha256: str) -> Path:
        """Where the bytes stored under `content_sha256` lie (for their size and age; read them with `read_blob`)."""
        return self.store.blobs.path(content_sha256)

    def read_blob(self, content_sha256: str) -> bytearray:
        """The bytes stored under `content_sha256`, integrity-checked as `load_artifact` reads them."""
        return self.store.blobs.get(content_sha256)

    def blob_trusted_after_s(self, content_sha256: str) -> float:
        """Seconds until the blob is older than the store's racy window (its next read is then hashed once and
        trusted after, db/blobs.py); 0 when it already is."""
        age_ns = time.time_ns() - os.stat(self.store.blobs.path(content_sha256)).st_ctime_ns
        return max(0.0, (self.store.blobs.racy_ns - age_ns) / 1e9)

    def corrupt_blobs(self) -> list[str]:
        """Every visible blob, referenced or orphan, whose bytes do not hash to its name (fsck reads referenced ones)."""
        return [h for h in list(self.store.blobs) if self.store.blobs.actual_sha256(h) != h]

    def record_synthetic(self, row: ArtifactRow, source: SourceRow, embedding: Embedding, data: bytes) -> None:
        """Record bytes the caller made as one artifact, without capture or the gate: how bench/scale.py fills a
        store with random payloads in the model's shapes. Never a deposit path."""
        self.store.catalog.add_deposit(row, source, None, embedding, lambda: self.store.blobs.put(data))
