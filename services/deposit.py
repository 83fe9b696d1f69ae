"""The deposit pipeline of a Library: bound, name the artifact before any work, prefill, gate (the
model answers the item's question with the new artifact grafted and the verifier accepts that answer;
or an admin attests), then write the blob and every catalog row in one transaction. A refusal leaves
nothing but its recorded verification row. Also `compose`, which deposits retrieved items as one exact chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

import verifiers
from db.rows import ArtifactRow, SourceRow, VerificationRow
from errors import ArtifactNotFound, InputTooLong, InvalidInput, VerificationFailed
from files import write_faults
from graft_core import templates

from . import gate
from .limits import MAX_TEXT_CHARS, bounded
from .results import Deposited

if TYPE_CHECKING:  # the engine (torch) loads at the first deposit, not with the web page
    from graft_core.artifact import KVArtifact
    from graft_core.model import LoadedModel
    from graft_core.stepgroup import StepGroup
    from retrieval import Embedder

    from .artifacts import Artifacts
    from .store import Store
    from .turns import ModelTurns

Progress = Callable[[float, str], None]
# chain, the decode group its gate answers go through (None: alone) -> (row, seconds, tokens)
Gate = Callable[[list["KVArtifact"], "StepGroup | None"], tuple[VerificationRow, float, int]]


class DepositPipeline:
    """The deposits of one store and one model. It is handed the store, the artifact reads (a child is
    prefilled after its parent's chain), accessors of the model and the embedder (loaded at first use) and the
    model's turns (whose lock is the store's)."""

    def __init__(
        self,
        store: Store,
        artifacts: Artifacts,
        lm: Callable[[], LoadedModel],
        embedder: Callable[[], Embedder],
        turns: ModelTurns,
    ):
        self._store = store
        self._artifacts = artifacts
        self._lm = lm
        self._embedder = embedder
        self._turns = turns

    def _turn(self):
        """The model's turn for a deposit's prefill and gate runs: a background turn (ModelTurns.background), so
        the gate's answers decode in the answers' shared passes once a serving process or a batched eval built the
        decode group (the same tokens as alone, graft_core.stepgroup); the model lock alone before that (yields None)."""
        return self._turns.background()

    def _deposit(
        self,
        text: str,
        parent: str | None,
        title: str,
        kind: str,
        item: tuple[str | None, str | None, str | None],
        verification: VerificationRow | None,
        embed_text: str,
        on_progress: Progress | None = None,
        gate_check: Gate | None = None,
        gate_cost: tuple[float, int] = (0.0, 0),
    ) -> Deposited:
        """Tokenise, name (before any work), prefill, run `gate_check` on the chain with the new artifact
        grafted (it raises to refuse; nothing has been written yet), then write the blob and the catalog
        rows in one transaction. `item` is the source's (question, solution, answer), None for free text."""
        from graft_core import codec
        from graft_core.artifact import artifact_key, text_sha256
        from graft_core.capture import capture

        progress = on_progress or (lambda f, m: None)
        lm = self._lm()
        parent_row = self._store.catalog.get(parent) if parent else None
        token_ids = templates.deposit_ids(lm.tokenizer, text, root=parent_row is None)
        start = parent_row.end_pos if parent_row else 0
        if start + len(token_ids) > lm.info.max_positions:
            raise InputTooLong(
                f"deposit of {len(token_ids):,} tokens at position {start:,} exceeds the model's "
                f"{lm.info.max_positions:,}-token context; split the text into several deposits"
            )
        key = artifact_key(lm.fingerprint, parent_row.id if parent_row else "", token_ids)
        try:  # hash before work: a repeated deposit costs nothing
            row = self._store.catalog.get(key)
            return self._deposited(row, prefill_s=0.0, created=False)
        except ArtifactNotFound:
            pass
        progress(0.1, f"prefilling {len(token_ids)} tokens")
        gate_s, gate_tokens = gate_cost
        with self._turn() as steps:
            parents = self._artifacts.chain(parent_row.id)[0] if parent_row else []
            art, stats = capture(lm, token_ids, parents=parents, text_sha256=text_sha256(text))
            assert art.key == key, "capture must name the artifact exactly as artifact_key() predicted"
            if gate_check is not None:  # before the blob write and the catalog transaction
                progress(0.5, "gate: answering the question with the new artifact grafted")
                verification, seconds, tokens = gate_check([*parents, art], steps)
                gate_s, gate_tokens = gate_s + seconds, gate_tokens + tokens
        data = codec.dumps(art)
        progress(0.8, "embedding and recording")
        embedder = self._embedder()
        vec = embedder.embed(embed_text)
        row = ArtifactRow(
            id=key,
            content_sha256="",
            model_fingerprint=lm.fingerprint,
            tokens=art.length,
            start=art.start,
            kind=kind,
            title=title[:200],
            parent_id=parent_row.id if parent_row else None,
            bytes=len(data),
            probe_sha256=art.probe_sha256,
        )
        question, solution, answer = item
        src = SourceRow(artifact_id=key, text=text, question=question, solution=solution, answer=answer)
        emb = (embedder.embedder_id, np.asarray(vec, dtype="<f4").tobytes(), int(vec.shape[0]), text_sha256(embed_text))
        row = self._record_deposit(row, src, verification, emb, data)
        progress(1.0, "deposited")
        return self._deposited(row, prefill_s=stats.prefill_s, created=True, gate_s=gate_s, gate_tokens=gate_tokens)

    def _record_deposit(self, row: ArtifactRow, src: SourceRow, verification, emb, data: bytes) -> ArtifactRow:
        """Write the blob and the catalog rows in one transaction. A disk that refuses a write, or a catalog
        that cannot commit, leaves nothing: a blob this call created is removed again (when no row refers to
        it), and the error is one line naming the store's folder and what to free."""
        made: list[str] = []

        def write_blob() -> str:
            digest, created = self._store.blobs.write(data)
            if created:
                made.append(digest)
            return digest

        with write_faults(self._store.folder(), "deposit again", needed_bytes=len(data) + (1 << 20)):
            try:
                return self._store.catalog.add_deposit(row, src, verification, emb, write_blob)
            except BaseException:
                self._store.discard_blobs(made)
                raise

    def _deposited(
        self, row: ArtifactRow, prefill_s: float, created: bool, gate_s: float = 0.0, gate_tokens: int = 0
    ) -> Deposited:
        passed = [v for v in self._store.catalog.verifications(row.id) if v.verdict == "pass"]
        last = passed[-1] if passed else None
        return Deposited(
            id=row.id,
            content_sha256=row.content_sha256,
            tokens=row.tokens,
            start=row.start,
            bytes=row.bytes,
            prefill_s=prefill_s,
            kind=row.kind,
            title=row.title,
            parent=row.parent_id,
            verified=bool(last and last.counts_as_verified),
            verifier=last.verifier if last else "none",
            created=created,
            provenance=last.label if last else "unverified",
            gate_s=gate_s,
            gate_tokens=gate_tokens,
            prefill_tokens=row.tokens if created else 0,
        )

    def deposit_text(
        self,
        text: str,
        parent: str | None = None,
        title: str = "",
        attested_by: str | None = None,
        admin: bool = False,
        on_progress: Progress | None = None,
    ) -> Deposited:
        """Free text (a document, a fact sheet). Unverified unless an admin attests it."""
        from graft_core.artifact import text_sha256

        text = templates.document_text(bounded("text", text, MAX_TEXT_CHARS))
        verification, kind = None, "text"
        if attested_by:
            if not admin:
                raise VerificationFailed("only an admin can attest a deposit; pass the admin token")
            verdict = verifiers.judge("", "attested", attested_by)  # attesting free text vouches for the text
            if not verdict.ok:
                raise VerificationFailed(f"attestation refused: {verdict.detail}")
            verification = VerificationRow(
                artifact_id=None,
                item_sha256=text_sha256(text),
                verifier="attested",
                verdict="pass",
                reference=attested_by,
                detail=verdict.detail,
                provenance="attested",
            )
            kind = "attested"
        title = title or text.strip().splitlines()[0][:80]
        return self._deposit(
            text, parent, title, kind, (None, None, None), verification, embed_text=text, on_progress=on_progress
        )

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
        """A verified item, accepted only through the gate: `answer` (optional) is a cheap pre-check
        before any prefill; then the model answers `question` with the solution grafted alone and with
        the new artifact grafted, and the verifier must accept both generated answers against
        `reference`. A refusal is recorded (verdict refused) and raised; nothing else is stored."""
        if verifier == "attested":
            if not admin:
                raise VerificationFailed(
                    "the 'attested' verifier is for admins only; use exact, numeric or sympy, or pass the admin token"
                )
            return self._deposit_attested_item(question, solution, answer, reference, parent, title, on_progress)
        given = (answer or "").strip()
        item = verifiers.VerifiedItem(
            question=question, solution=solution, answer=given or reference, verifier=verifier, reference=reference
        )
        item_sha = verifiers.item_sha256(item)
        verifiers.validate(item)
        if given:  # the cheap pre-check: refuse a wrong typed answer before any prefill
            verdict = verifiers.judge(given, verifier, reference, question)
            if not verdict.ok:
                self._store.catalog.record_refusal(
                    VerificationRow(
                        None, item_sha, verifier, "refused", reference, f"pre-check: {verdict.detail}", provenance="verified"
                    )
                )
                raise VerificationFailed(f"refused, nothing deposited: {verdict.detail}")
            found = self._existing(templates.item_text(question, solution, given), parent)
            if found is not None:
                return found
        else:
            verifiers.judge(reference, verifier, reference, question)  # a reference its kind cannot read is an input error
        steps = verifiers.check_solution(solution, verifier, reference, question)  # before any prefill
        if not steps.ok:
            self._store.catalog.record_refusal(
                VerificationRow(
                    None, item_sha, verifier, "refused", reference, f"solution: {steps.detail}", provenance="verified"
                )
            )
            raise VerificationFailed(f"refused, nothing deposited: {steps.detail}")
        progress = on_progress or (lambda f, m: None)
        progress(0.05, "gate: answering the question with the solution grafted")
        with self._turn() as steps:
            fact = gate.fact_run(self._lm(), question, solution, verifier, reference, steps=steps)
        if not fact.ok:
            self._store.catalog.record_refusal(gate.record(fact, item_sha, verifier, reference))
            raise VerificationFailed(fact.refusal(reference), gate_tokens=fact.tokens)

        def gate_check(chain: list[KVArtifact], steps: StepGroup | None) -> tuple[VerificationRow, float, int]:
            run = self._graft_run(chain, question, solution, verifier, reference, item_sha, steps)
            if not run.ok:
                raise VerificationFailed(run.refusal(reference), gate_tokens=fact.tokens + run.tokens)
            detail = f"with the solution grafted the model answered {fact.generated!r}; with the artifact grafted {run.generated!r}; {run.detail}"
            return gate.record(run, item_sha, verifier, reference, detail=detail), run.seconds, run.tokens

        text = templates.item_text(question, solution, given or fact.answer)
        return self._deposit(
            text,
            parent,
            title or question[:80],
            "verified",
            (question, solution, given or fact.answer),
            None,
            embed_text=question,
            on_progress=on_progress,
            gate_check=gate_check,
            gate_cost=(fact.seconds, fact.tokens),
        )

    def _existing(self, text: str, parent: str | None) -> Deposited | None:
        """The deposit of exactly this text after this parent, if it is already stored (costs no model run)."""
        from graft_core.artifact import artifact_key

        parent_row = self._store.catalog.get(parent) if parent else None
        lm = self._lm()
        token_ids = templates.deposit_ids(lm.tokenizer, text, root=parent_row is None)
        try:
            row = self._store.catalog.get(artifact_key(lm.fingerprint, parent_row.id if parent_row else "", token_ids))
        except ArtifactNotFound:
            return None
        return self._deposited(row, prefill_s=0.0, created=False)

    def _deposit_attested_item(
        self,
        question: str,
        solution: str,
        answer: str | None,
        reference: str,
        parent: str | None,
        title: str,
        on_progress: Progress | None,
    ) -> Deposited:
        """An admin's attested item: no behavioural gate, labelled "attested" everywhere, never "verified"."""
        item = verifiers.VerifiedItem(
            question=question, solution=solution, answer=answer or "", verifier="attested", reference=reference
        )
        verifiers.validate(item)
        verdict = verifiers.judge(item.answer, "attested", reference, question)
        vrow = VerificationRow(
            None,
            verifiers.item_sha256(item),
            "attested",
            "pass" if verdict.ok else "refused",
            reference,
            verdict.detail,
            provenance="attested",
        )
        if not verdict.ok:
            self._store.catalog.record_refusal(vrow)
            raise VerificationFailed(f"refused, nothing deposited: {verdict.detail}")
        text = templates.item_text(question, solution, answer or "")
        return self._deposit(
            text,
            parent,
            title or question[:80],
            "attested",
            (question, solution, answer),
            vrow,
            embed_text=question,
            on_progress=on_progress,
        )

    def compose(self, ids: list[str], on_progress: Progress | None = None) -> str:
        """Chain several artifacts exactly: the first one's chain, then each other item's text
        deposited as a child in order (one prefill each, the first time only: keys are
        deterministic, so composing the same items again costs nothing). Returns the leaf id."""
        if not ids:
            raise InvalidInput("nothing to compose: give at least one artifact id")
        leaf = self._store.catalog.get(ids[0])
        have = {self._store.catalog.source(r.id).text for r in self._store.catalog.chain(leaf.id)}
        todo = []
        for other in ids[1:]:
            for node in self._store.catalog.chain(other):
                src = self._store.catalog.source(node.id)
                if src.text not in have:
                    have.add(src.text)
                    todo.append((node, src))
        for i, (node, src) in enumerate(todo):
            if on_progress:
                on_progress(i / max(1, len(todo)), f"composing {i + 1}/{len(todo)}")
            passed = [v for v in self._store.catalog.verifications(node.id) if v.verdict == "pass"]
            v = passed[-1] if passed else None
            vrow, check = None, None
            if v is not None and v.provenance == "verified" and src.question:
                check = self._regate(node.id, src, v)  # a verdict is about this graft: re-run it on the new chain
            elif v is not None:  # an attestation or an import label is about the text: it travels, saying so
                vrow = replace(v, artifact_id=None, id=None, detail=f"composed from {node.id}: {v.detail}")
            item = (src.question, src.solution, src.answer)
            d = self._deposit(
                src.text, leaf.id, node.title, node.kind, item, vrow, embed_text=src.question or src.text, gate_check=check
            )
            leaf = self._store.catalog.get(d.id)
        return leaf.id

    def _graft_run(
        self,
        chain: list[KVArtifact],
        question: str,
        solution: str,
        verifier: str,
        reference: str,
        item_sha: str,
        steps: StepGroup | None = None,
    ):
        """The gate's graft run on `chain`; a refusal is recorded here (the caller decides what it means)."""
        run = gate.graft_run(self._lm(), chain, question, solution, verifier, reference, steps=steps)
        if not run.ok:
            self._store.catalog.record_refusal(gate.record(run, item_sha, verifier, reference))
        return run

    def _regate(self, origin: str, src, v: VerificationRow):
        """The graft run of a gate-verified item, re-run with the item after its new parent. A pass is a
        fresh verification row of the composed artifact; a refusal is recorded and the composed artifact
        is stored unverified (the exact chain is still useful; it is not claimed verified)."""

        def check(chain: list[KVArtifact], steps: StepGroup | None) -> tuple[VerificationRow | None, float, int]:
            run = self._graft_run(chain, src.question, src.solution, v.verifier, v.reference, v.item_sha256, steps)
            if not run.ok:
                return None, run.seconds, run.tokens
            detail = f"composed from {origin}: re-gated after the new parent, the model answered {run.generated!r}; {run.detail}"
            return gate.record(run, v.item_sha256, v.verifier, v.reference, detail=detail), run.seconds, run.tokens

        return check
