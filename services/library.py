"""`Library`: one store (`services.store.Store`: catalog, blobs, index, model lock) and one model, behind
the door front ends use (`services.door.LibraryDoor`, where each member's contract is written).

The Library composes its parts and implements the door by delegating: `artifacts` (reads and first-use
proofs, services.artifacts), `turns` (who computes on the model when, services.turns) and the pipelines
`deposits`, `answers`, `reports` (the exactness report) and `solving`, each handed what it needs (the store, those parts,
accessors of the lazily loaded model and embedder) when the Library is made. It holds the read-only views of
the store itself (list, show, stats). Front ends call a member and format its result; the upkeep functions
(services.rebuild, integrity, exchange, replay) work on `store`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import settings
from db import aggregates
from db.catalog import Embedding
from db.queries import library_rows
from db.rows import ArtifactRow, LedgerRow, SourceRow
from graft_core import model as model_mod  # names only: torch loads in model_mod.load

from . import limits
from .answer import AnswerPipeline
from .artifacts import Artifacts
from .deposit import DepositPipeline
from .door import DEFAULT_ANSWER, AnswerOptions, Progress
from .exactness_report import ExactnessReportPipeline
from .results import (
    AnswerResult,
    DeleteReport,
    Deposited,
    ExactnessReport,
    Flywheel,
    LibraryEntry,
    Retrieved,
    ShowReport,
    Solved,
    StoreStats,
    WarmReport,
)
from .solve import DEFAULT_BUDGET, DEFAULT_TEMPERATURE, SolvePipeline
from .store import Store
from .turns import ModelTurns

WARM_UP_QUESTION = "What is this about?"  # warm_answer's fixed question: never a user's, never recorded

if TYPE_CHECKING:  # the engine (torch) and retrieval (faiss) load at first use (the web app's start-up
    from graft_core.artifact import KVArtifact  # stages), so that importing services serves a page at once
    from graft_core.stepgroup import StepGroup
    from retrieval import Embedder, VectorIndex


def default_home() -> Path:
    return settings.get("KVGRAFT_HOME")


class Library:
    """One store (catalog + blobs + index) and one model, shared by every request of a process.

    The model runs one request at a time per process (the store's lock); the catalog is safe to share
    between processes. Each door member's contract is on `LibraryDoor` (services/door.py)."""

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
        model, embed = (lambda: self.lm), (lambda: self.embedder)
        self.turns = ModelTurns(self.store.lock, model, limits.ANSWERS_FIRST_S, limits.decode_together)
        self.artifacts = Artifacts(self.store, model)
        self.deposits = DepositPipeline(self.store, self.artifacts, model, embed, self.turns)
        self.answers = AnswerPipeline(self.store, self.artifacts, self.turns, model, embed, self.deposits.compose)
        self.reports = ExactnessReportPipeline(self.store, self.artifacts, self.turns, model)
        self.solving = SolvePipeline(self.store, self.turns, model, self.answers, self.deposits)
        self.solving.fill_flywheel()
        if lm is not None:
            self._note_model(lm)

    def close(self) -> None:
        """LibraryDoor.close."""
        self.store.close()

    def index(self) -> VectorIndex:
        """LibraryDoor.index (`Store.index`)."""
        return self.store.index()

    # ---- lazily loaded parts ----------------------------------------------------------------

    @property
    def lm(self) -> model_mod.LoadedModel:
        """LibraryDoor.lm: loaded under the model lock on first use."""
        if self._lm is not None:  # loaded: no lock, or every use (a tokenisation, a record) would wait for the model
            return self._lm
        with self.store.lock:
            if self._lm is None:
                loaded = model_mod.load(self.model_name)
                self._note_model(loaded)
                self._lm = loaded
            return self._lm

    def _note_model(self, lm: model_mod.LoadedModel) -> None:
        """Name the model in the store (db.models): `list --model NAME` and the dashboard read it there."""
        from db import models

        models.note(self.store.catalog, lm.fingerprint, lm.info.name)

    @property
    def model_loaded(self) -> bool:
        """LibraryDoor.model_loaded."""
        return self._lm is not None

    @property
    def embedder(self) -> Embedder:
        """The embedder (the packaged sentence embedder, loaded on first use, unless one was handed in)."""
        if self._embedder is None:
            from retrieval.embedder import SentenceEmbedder

            self._embedder = SentenceEmbedder()
        return self._embedder

    # ---- the door's members that run the model or write: delegated ------------------------------

    def answer(
        self, question: str, options: AnswerOptions = DEFAULT_ANSWER, on_token: Callable[[str], None] | None = None
    ) -> AnswerResult:
        """LibraryDoor.answer (AnswerPipeline.answer)."""
        return self.answers.answer(question, options, on_token)

    def retrieve(self, question: str, k: int = 3, threshold: float | None = None) -> list[Retrieved]:
        """AnswerPipeline.retrieve: the artifacts nearest to `question`, each with the relevance stage's decision."""
        return self.answers.retrieve(question, k, threshold)

    def deposit_text(
        self,
        text: str,
        parent: str | None = None,
        title: str = "",
        attested_by: str | None = None,
        admin: bool = False,
        on_progress: Progress | None = None,
    ) -> Deposited:
        """LibraryDoor.deposit_text (DepositPipeline.deposit_text)."""
        return self.deposits.deposit_text(text, parent, title, attested_by, admin, on_progress)

    def deposit_item(
        self,
        question: str,
        solution: str,
        answer: str | None,
        verifier: str,
        reference: str,
        parent: str | None = None,
        title: str = "",
        admin: bool = False,
        on_progress: Progress | None = None,
    ) -> Deposited:
        """LibraryDoor.deposit_item (DepositPipeline.deposit_item)."""
        return self.deposits.deposit_item(question, solution, answer, verifier, reference, parent, title, admin, on_progress)

    def compose(self, ids: list[str], on_progress: Progress | None = None) -> str:
        """DepositPipeline.compose: the items of `ids` as one exact chain; returns the leaf id."""
        return self.deposits.compose(ids, on_progress)

    def exactness_report(
        self,
        samples: int = 10,
        relocate: int | None = None,
        seed: int = 0,
        on_progress: Progress | None = None,
        decode_steps: int = 4,
        monolithic: bool = True,
        max_tokens: int | None = None,
    ) -> ExactnessReport:
        """LibraryDoor.exactness_report (ExactnessReportPipeline.exactness_report)."""
        return self.reports.exactness_report(samples, relocate, seed, on_progress, decode_steps, monolithic, max_tokens)

    def solve(
        self,
        question: str,
        verifier: str,
        reference: str,
        budget: int = DEFAULT_BUDGET,
        attempts: int | None = None,
        seed: int = 0,
        temperature: float = DEFAULT_TEMPERATURE,
        max_new_tokens: int = 32,
        admin: bool = False,
        library: bool = True,
        between: Callable[[], None] | None = None,
    ) -> Solved:
        """LibraryDoor.solve (SolvePipeline.solve)."""
        return self.solving.solve(
            question, verifier, reference, budget, attempts, seed, temperature, max_new_tokens, admin, library, between
        )

    def flywheel(self) -> Flywheel:
        """LibraryDoor.flywheel (SolvePipeline.flywheel)."""
        return self.solving.flywheel()

    def solves(self) -> list[dict]:
        """SolvePipeline.solves: every recorded solve, oldest first."""
        return self.solving.solves()

    # ---- start-up and warm-up -------------------------------------------------------------------

    def decode_group(self) -> StepGroup | None:
        """ModelTurns.decode_group: the group answers decode through, None while they decode alone."""
        return self.turns.decode_group()

    def start_decoding_together(self) -> str:
        """LibraryDoor.start_decoding_together (ModelTurns.start_decoding_together)."""
        return self.turns.start_decoding_together()

    def warm_proofs(self, limit: int) -> WarmReport:
        """LibraryDoor.warm_proofs (Artifacts.warm_proofs)."""
        return self.artifacts.warm_proofs(limit)

    def prove_chain(self, artifact_id: str) -> float:
        """LibraryDoor.prove_chain (Artifacts.prove_chain): what a process that knows its artifact before its
        question (`cli.py ask --artifact`) does at load."""
        return self.artifacts.prove_chain(artifact_id)

    def warm_answer(self, artifact_id: str) -> float:
        """LibraryDoor.warm_answer: one throw-away answer from `artifact_id` (a fixed question, 1 token, not
        recorded in the ledger). A process that knows its artifact before its question (`cli.py ask
        --artifact`) pays its first blob read into fresh memory, first restore and first question-sized forward
        over that cache here, at load, instead of in the question's time to first token (~15 ms at 2,048 tokens
        in a one-off timing). It changes nothing an answer computes: the bytes of a forward do not depend on
        what ran before it. Run after `prove_chain` (so it carries the state proof, as the real answer will).
        Returns the seconds it took."""
        t0 = time.perf_counter()
        self.answer(WARM_UP_QUESTION, AnswerOptions(artifact=artifact_id, max_new_tokens=1, record=False))
        return time.perf_counter() - t0

    # ---- reading artifacts (the upkeep functions: services.rebuild, integrity, exchange, vetting) ---

    def load_artifact(self, artifact_id: str, quarantined_too: bool = False) -> KVArtifact:
        """Artifacts.load: one artifact read, hash-checked and decoded (IntegrityError on any mismatch)."""
        return self.artifacts.load(artifact_id, quarantined_too)

    def load_chain(self, artifact_id: str) -> tuple[list[KVArtifact], float]:
        """Artifacts.chain: `artifact_id`'s chain, root first, and the seconds the reads took."""
        return self.artifacts.chain(artifact_id)

    def probe(self, artifact_id: str, force: bool = False) -> str | None:
        """Artifacts.probe: the artifact's probe checked (a mismatch quarantines and is returned; None: passed)."""
        return self.artifacts.probe(artifact_id, force)

    def graftable(self, ids: list[str]) -> list[KVArtifact]:
        """Artifacts.graftable: `ids` loaded for grafting, each probed on first use (IntegrityError on a mismatch)."""
        return self.artifacts.graftable(ids)

    # ---- views of the store ------------------------------------------------------------------

    def entries(
        self, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0, model: str | None = None
    ) -> list[LibraryEntry]:
        """Artifacts newest first, each with its latest verification; `query` matches title or text, `model` keeps
        the artifacts that model made (db.models.fingerprints_of: a name or a fingerprint prefix)."""
        from db import models

        fps = models.fingerprints_of(self.store.catalog, model) if model else None
        rows = library_rows(self.store.catalog, query=query, kind=kind, limit=limit, offset=offset, fingerprints=fps)
        return [LibraryEntry.of(x) for x in rows]

    def catalog_version(self) -> int:
        """The catalog's change counter (every deposit or delete bumps it); an index built at another
        version is stale. Replicas (serving/) compare it with their index in their health check."""
        return self.store.catalog.version()

    def count(self) -> int:
        """Artifacts in the store (a running total: one primary-key read, whatever the store's size)."""
        return aggregates.read(self.store.catalog, (aggregates.store_size,))[0].artifacts

    def holds_own(self) -> bool:
        """Whether the store holds an artifact of the loaded model (a store may hold several models')."""
        return bool(self.store.catalog.list_artifacts(limit=1, fingerprints=(self.lm.fingerprint,)))

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
        from db import models

        size = aggregates.read(self.store.catalog, (aggregates.store_size,))[0]
        return StoreStats(
            totals=self.store.catalog.ledger_totals(),
            recent=tuple(self.store.catalog.ledger(last=recent)),
            store_tokens=size.tokens,
            artifacts=size.artifacts,
            window=self.lm.info.max_positions,
            model=self.lm.info.name,
            models=tuple(names[0] for names in models.names(self.store.catalog).values()),
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
