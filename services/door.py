"""`LibraryDoor`: what the front ends (`web/`, `cli/`, `serving/`) call on a library, and nothing more, with
each member's contract; `AnswerOptions`, how one question is to be answered.

Three classes serve those callers: `services.Library` (the store and the model in this process),
`serving.remote.RemoteLibrary` (a deployment over HTTP) and `web.startup.StartingLibrary` (a library seen
through the app's start-up). The Library implements each member with the signature written here (the same
names, kinds and defaults: tests/test_door.py); the two stand-ins write none of them out: `services.forwarding`
generates each from this declaration and hands the call to the stand-in, so no member is forgotten and no other
name passes. Callers never ask `hasattr`. Every value a member returns is a torch-free dataclass from
`services.results` (or a catalog row). Every error a member raises for a reason the caller can act on is
a `KvgraftError` (errors.py) whose message says what to do; the remote library raises `NotAvailable` for
what has no route, the start-up proxy `NotReady` (stage, time left) for what needs the model before it is up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from errors import InvalidInput

if TYPE_CHECKING:
    from db.rows import LedgerRow
    from graft_core.model import LoadedModel
    from retrieval import VectorIndex

    from .results import (
        AnswerResult,
        DeleteReport,
        Deposited,
        ExactnessReport,
        Flywheel,
        LibraryEntry,
        ShowReport,
        Solved,
        StoreStats,
        WarmReport,
    )
    from .store import Store

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class AnswerOptions:
    """How to answer one question: what `LibraryDoor.answer` takes besides the question and a token callback."""

    k: int = 3  # artifacts retrieved (1..MAX_K)
    artifact: str | None = None  # graft this artifact's chain instead of retrieving
    graft: bool = True  # False: the plain no-graft baseline
    max_new_tokens: int = 32
    raw: bool = False  # the question as the whole prompt, not the completion template
    check: bool = False  # recompute the served rows from scratch and compare bytes (the full check)
    compare: bool = False  # also measure the no-graft baseline
    relocated: bool = False  # graft independent roots at other offsets (keys re-rotated: approximate, labelled)
    threshold: float | None = None  # the least similarity retrieved (None: retrieval's DEFAULT_THRESHOLD)
    record: bool = True  # write the answer to the ledger
    compose: bool = False  # compose the retrieved items into one exact chain (deposits its links)
    max_prompt_tokens: int | None = None  # refuse a longer question (InputTooLong) before any retrieval
    form: str = "answer"  # the query form (graft_core.templates.FORMS): "answer", "cot" (reason first), "qa"
    temperature: float = 0.0  # 0: greedy; above: each token drawn from softmax(logits / temperature), seeded
    top_p: float = 1.0  # sampling only: draw within the most likely tokens whose probability reaches top_p
    seed: int | None = None  # sampling only: the generator's seed (None: one is drawn and reported)
    stop: tuple[str, ...] = ()  # decoding also ends at the first of these strings, which the answer leaves out
    examples: bool = True  # offer a verified worked solution to a question of its shape with other names and numbers
    logprobs: int | None = None  # each generated token's log-probability, with this many alternatives (0..20)
    echo: bool = False  # also each prompt token's log-probability (raw only); max_new_tokens may then be 0
    prompt_ids: tuple[int, ...] = ()  # raw only: the prompt as these token ids, used as given (the question names it)

    def to_json(self) -> dict:
        return asdict(self) | {"stop": list(self.stop), "prompt_ids": list(self.prompt_ids)}

    @classmethod
    def from_json(cls, data: dict) -> AnswerOptions:
        """The options a JSON object names (the others keep their defaults); InvalidInput for a name that is none."""
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise InvalidInput(
                f"unknown answer option(s) {', '.join(sorted(unknown))}: use {', '.join(f.name for f in fields(cls))}"
            )
        lists = {k: tuple(data[k]) for k in ("stop", "prompt_ids") if isinstance(data.get(k), list)}
        return cls(**data | lists)


DEFAULT_ANSWER = AnswerOptions()


class LibraryDoor(Protocol):
    """The library's members front ends call. Unless a member says otherwise it may raise, besides what it
    names: `InvalidInput` for an argument out of its bounds (services.limits), `StorageError` when the disk or
    the database refuses a write, `NotAvailable` (remote) or `NotReady` (start-up) as the module doc says."""

    home: Path  # where the store lives (what the app and the CLI print)
    model_name: str | None  # the model asked for (None: the packaged default)

    @property
    def model_loaded(self) -> bool:
        """Whether the model is in memory (reading `lm` would not load it). Never raises, never loads."""
        ...

    @property
    def lm(self) -> LoadedModel:
        """The loaded model (loading it on first use: seconds to a minute). Raises `NotReady` before the app's
        start-up has loaded it, `NotAvailable` where the model lives in remote replicas."""
        ...

    @property
    def store(self) -> Store:
        """The store (catalog, blobs, index, model lock) the upkeep functions (services.fsck, export_bundle,
        import_bundle, rebuild_compare, replay_ledger) work on. Open from the start: no model needed.
        Raises `NotAvailable` where the store is a deployment's."""
        ...

    # ---- reads of the store ----

    def count(self) -> int:
        """Artifacts in the store (a running total: one bounded read, whatever its size). Needs no model."""
        ...

    def holds_own(self) -> bool:
        """Whether the store holds an artifact of the served model (a store may hold several models')."""
        ...

    def entries(
        self, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0, model: str | None = None
    ) -> list[LibraryEntry]:
        """Artifacts newest first, each with its latest verification; `query` matches title or text, `kind`
        ("verified", "text", ...) filters, `model` keeps the artifacts that model made (a name the store opened
        it under, or a fingerprint prefix), at most `limit` from `offset`. Needs no model. Raises `InvalidInput`
        for a `kind` that is none of the catalog's kinds, or a `model` the store does not know (naming its models)."""
        ...

    def show(self, ref: str) -> ShowReport:
        """One artifact (its id or a unique prefix): row, source, verifications, chain, children. Raises
        `ArtifactNotFound` for an unknown, malformed or ambiguous ref (the message says which)."""
        ...

    def artifact_ids(self) -> list[str]:
        """Every artifact id, newest first (what an export of the whole store names). Needs no model."""
        ...

    def ledger(self, last: int | None = None) -> list[LedgerRow]:
        """Recorded answers, oldest first (the newest `last` when given). Needs no model."""
        ...

    def stats(self, recent: int = 60) -> StoreStats:
        """Ledger totals (every answer ever recorded), the latest `recent` answers and the store's size against
        the context window: bounded reads whatever the ledger's size. Reads the model's window, so it loads the
        model on a library that has none yet (`NotReady` until the start-up is done, `NotAvailable` on the
        remote library)."""
        ...

    def flywheel(self) -> Flywheel:
        """What solve has deposited and what its recalls saved: the catalog's running figures, one read
        transaction of bounded statements whatever the store's size (`NotReady` until the start-up is done,
        `NotAvailable` on the remote library)."""
        ...

    # ---- what runs the model or writes ----

    def answer(
        self, question: str, options: AnswerOptions = DEFAULT_ANSWER, on_token: Callable[[str], None] | None = None
    ) -> AnswerResult:
        """Answer `question` as `options` say: retrieve (or take `options.artifact`'s chain), graft, generate
        with token accounting and the proof of the served state, record it in the ledger. Guarantees: what
        is grafted passed its probe in this process (a failed probe or state proof quarantines the artifact
        and raises `IntegrityError`, before any token is chosen); `result.check`, when asked, compares bytes.
        `on_token` gets the growing answer text (not called by the remote library: its answer arrives whole).
        Raises `InputTooLong` past `options.max_prompt_tokens`, `InvalidInput` for a question or k out of bounds."""
        ...

    def deposit_text(
        self,
        text: str,
        parent: str | None = None,
        title: str = "",
        attested_by: str | None = None,
        admin: bool = False,
        on_progress: Progress | None = None,
    ) -> Deposited:
        """Prefill free text (after `parent`'s chain) and store its artifact, unverified unless an admin attests
        it. Named by its key before any prefill: a repeated deposit costs nothing and returns the same id.
        Raises `ArtifactNotFound` for an unknown parent, `InputTooLong` past the context window."""
        ...

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
        """A verified item, stored only through the gate: the model, with the item grafted, must answer and
        `verifier` accept that answer against `reference`. A refusal is recorded (a verification row) and
        nothing else is stored. Raises `VerificationFailed` when the gate refuses (or `verifier` is "attested"
        without `admin`), `InvalidInput` for an unknown verifier or a reference its kind cannot read,
        `ArtifactNotFound` for an unknown parent."""
        ...

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
        """The N-sample exactness report: `samples` seeded artifacts (chains of at most `max_tokens` tokens),
        each grafted and compared byte for byte with a fresh computation over `decode_steps` greedy steps (and
        the monolithic forward unless `monolithic` is False); at offset `relocate` when given (approximate,
        labelled). `max_tokens` set is an anonymous caller's bound (the remote library sends no admin token then).
        Each sample takes the model on its own, after answers decoding meanwhile, and `on_progress` runs between
        samples. Guarantees: `byte_equal` counts samples whose grafted and fresh rows are equal bytes, never a
        label. Raises `InvalidInput` for `samples` outside 1..1000 or `decode_steps` outside 1..16,
        `ArtifactNotFound` when the store holds no artifact (or none within `max_tokens`)."""
        ...

    def solve(
        self,
        question: str,
        verifier: str,
        reference: str,
        budget: int = 4096,
        attempts: int | None = None,
        seed: int = 0,
        temperature: float = 0.8,
        max_new_tokens: int = 32,
        admin: bool = False,
        library: bool = True,
        between: Callable[[], None] | None = None,
    ) -> Solved:
        """The flywheel: recall from the library first (`library`), else sampled attempts within `budget`
        tokens, each judged by `verifier` against `reference`; a passing attempt is deposited through the gate.
        `between` runs between attempts (a fair model turn). Raises `NotAvailable` on the remote library."""
        ...

    def delete(self, ref: str) -> DeleteReport:
        """Remove one artifact and its blob if nothing else uses it. Raises `KvgraftError` while other artifacts
        continue its chain (nothing removed), `ArtifactNotFound` for an unknown ref."""
        ...

    # ---- start-up and warm-up (web/startup.py, `cli.py ask --artifact`) ----

    def index(self) -> VectorIndex:
        """The FAISS index at the catalog's current version (loaded, synced by difference or rebuilt from the
        catalog's embeddings; an artifact the live embedder has no vector for is embedded first). A store that
        refuses the index's write still answers from the index in memory. Raises `NotReady` before retrieval
        has loaded, `NotAvailable` on the remote library."""
        ...

    def start_decoding_together(self) -> str:
        """Build what lets concurrent answers decode in one pass, only at the padded widths whose bytes equal
        the 1-row products (an answer's bytes do not depend on who decodes beside it); returns a log line.
        Idempotent: a second call builds nothing. Loads the model; raises `NotReady` before the start-up has."""
        ...

    def warm_proofs(self, limit: int) -> WarmReport:
        """Run the first-use probe on up to `limit` of the newest artifacts (the same check an answer's first
        use runs: a mismatch quarantines), so their first answers carry the state proof instead of paying the
        probe. Each probe takes the model lock alone (answers interleave); quarantined artifacts, other models'
        and those without a probe hash are passed over and named in the report. An unreadable artifact is
        reported, not raised. Raises `NotReady` before the model is up, `NotAvailable` on the remote library."""
        ...

    def prove_chain(self, artifact_id: str) -> float:
        """Prove `artifact_id`'s chain now, root first (each artifact's first-use probe, once per content in this
        process), so the answer grafting it next carries the state proof. Returns the seconds it took. Raises
        `IntegrityError` (the artifact quarantined) on a mismatch, `ArtifactNotFound` for an unknown id."""
        ...

    def warm_answer(self, artifact_id: str) -> float:
        """One throw-away answer from `artifact_id` (a fixed question, one token, not recorded in the ledger) so
        the real one's first token does not pay the first read and restore; it changes nothing an answer
        computes. Returns the seconds it took. Raises as `answer` does."""
        ...

    def close(self) -> None:
        """Release the store's connections; the library is unusable afterwards."""
        ...
