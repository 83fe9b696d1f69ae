"""`LibraryDoor`: what the front ends (`web/`, `cli/`) call on a library, and nothing more.

Three classes serve those callers: `services.Library` (the store and the model in this process),
`web.remote.RemoteLibrary` (a deployment over HTTP) and `web.startup.StartingLibrary` (a library seen
through the app's start-up). Each declares every member below, doing nothing or refusing with a message
where it has nothing to do; callers never ask `hasattr`. Defaults written `...` are the implementation's
own. Every value a member returns is a torch-free dataclass from `services.results` (or a catalog row).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from db.rows import LedgerRow
    from graft_core.model import LoadedModel
    from retrieval import VectorIndex

    from .results import (
        AnswerResult,
        DeleteReport,
        Deposited,
        Flywheel,
        LibraryEntry,
        ShowReport,
        Solved,
        StoreStats,
        VerifyReport,
        WarmReport,
    )

Progress = Callable[[float, str], None]


class LibraryDoor(Protocol):
    home: Path  # where the store lives (what the app and the CLI print)
    model_name: str | None

    @property
    def model_loaded(self) -> bool: ...

    @property
    def lm(self) -> LoadedModel: ...

    # ---- reads of the store ----

    def count(self) -> int: ...

    def entries(self, query: str = ..., kind: str | None = ..., limit: int = ..., offset: int = ...) -> list[LibraryEntry]: ...

    def show(self, ref: str) -> ShowReport: ...

    def artifact_ids(self) -> list[str]: ...

    def ledger(self, last: int | None = ...) -> list[LedgerRow]: ...

    def stats(self, recent: int = ...) -> StoreStats: ...

    def flywheel(self) -> Flywheel: ...

    # ---- what runs the model or writes ----

    def answer(
        self,
        question: str,
        k: int = ...,
        artifact: str | None = ...,
        graft: bool = ...,
        max_new_tokens: int = ...,
        raw: bool = ...,
        check: bool = ...,
        compare: bool = ...,
        relocated: bool = ...,
        on_token: Callable[[str], None] | None = ...,
        record: bool = ...,
        compose: bool = ...,
    ) -> AnswerResult: ...

    def deposit_text(
        self,
        text: str,
        parent: str | None = ...,
        title: str = ...,
        attested_by: str | None = ...,
        admin: bool = ...,
        on_progress: Progress | None = ...,
    ) -> Deposited: ...

    def deposit_item(
        self,
        question: str,
        solution: str,
        answer: str | None,
        verifier: str,
        reference: str,
        parent: str | None = ...,
        title: str = ...,
        admin: bool = ...,
        on_progress: Progress | None = ...,
    ) -> Deposited: ...

    def verify_samples(
        self,
        samples: int = ...,
        relocate: int | None = ...,
        seed: int = ...,
        on_progress: Progress | None = ...,
        decode_steps: int = ...,
        monolithic: bool = ...,
        max_tokens: int | None = ...,
    ) -> VerifyReport: ...

    def solve(
        self,
        question: str,
        verifier: str,
        reference: str,
        budget: int = ...,
        attempts: int | None = ...,
        seed: int = ...,
        temperature: float = ...,
        admin: bool = ...,
    ) -> Solved: ...

    def delete(self, ref: str) -> DeleteReport: ...

    # ---- start-up and warm-up (web/startup.py, `cli.py ask --artifact`) ----

    def index(self) -> VectorIndex: ...

    def start_decoding_together(self) -> str: ...

    def warm_proofs(self, limit: int) -> WarmReport: ...

    def prove_chain(self, artifact_id: str) -> float: ...

    def warm_answer(self, artifact_id: str) -> float: ...

    def close(self) -> None: ...
