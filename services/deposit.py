"""The deposit pipeline of a Library: bound, gate (verifier or admin attestation), name the artifact
before any work, prefill, then write the blob and every catalog row in one transaction. Also `compose`,
which deposits retrieved items as one exact chain.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import verifiers
from db.rows import ArtifactRow, SourceRow, VerificationRow
from errors import ArtifactNotFound, InputTooLong, InvalidInput, VerificationFailed
from graft_core import codec, templates
from graft_core.artifact import artifact_key, text_sha256
from graft_core.capture import capture

from .limits import MAX_TEXT_CHARS, bounded
from .results import Deposited

Progress = Callable[[float, str], None]


class DepositPipeline:
    """Mixed into `Library`; uses its `_catalog`, `_blobs`, `_lock`, `lm`, `embedder` and `load_chain`."""

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
    ) -> Deposited:
        """Tokenise, name (before any work), prefill, write the blob and the catalog rows in one
        transaction. `item` is the source's (question, solution, answer), all None for free text."""
        progress = on_progress or (lambda f, m: None)
        lm = self.lm
        parent_row = self._catalog.get(parent) if parent else None
        token_ids = lm.tokenizer(text, add_special_tokens=parent_row is None)["input_ids"]
        start = parent_row.end_pos if parent_row else 0
        if start + len(token_ids) > lm.info.max_positions:
            raise InputTooLong(
                f"deposit of {len(token_ids):,} tokens at position {start:,} exceeds the model's "
                f"{lm.info.max_positions:,}-token context; split the text into several deposits"
            )
        key = artifact_key(lm.fingerprint, parent_row.id if parent_row else "", token_ids)
        try:  # hash before work: a repeated deposit costs nothing
            row = self._catalog.get(key)
            return self._deposited(row, prefill_s=0.0, created=False)
        except ArtifactNotFound:
            pass
        progress(0.1, f"prefilling {len(token_ids)} tokens")
        with self._lock:
            parents = self.load_chain(parent_row.id)[0] if parent_row else []
            art, stats = capture(lm, token_ids, parents=parents, text_sha256=text_sha256(text))
        assert art.key == key, "capture must name the artifact exactly as artifact_key() predicted"
        data = codec.dumps(art)
        progress(0.8, "embedding and recording")
        vec = self.embedder.embed(embed_text)
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
        )
        question, solution, answer = item
        src = SourceRow(artifact_id=key, text=text, question=question, solution=solution, answer=answer)
        emb = (self.embedder.embedder_id, np.asarray(vec, dtype="<f4").tobytes(), int(vec.shape[0]), text_sha256(embed_text))
        row = self._catalog.add_deposit(row, src, verification, emb, lambda: self._blobs.put(data))
        progress(1.0, "deposited")
        return self._deposited(row, prefill_s=stats.prefill_s, created=True)

    def _deposited(self, row: ArtifactRow, prefill_s: float, created: bool) -> Deposited:
        passed = [v for v in self._catalog.verifications(row.id) if v.verdict == "pass"]
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
            verified=bool(passed),
            verifier=passed[-1].verifier if passed else "none",
            created=created,
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
        text = templates.document_text(bounded("text", text, MAX_TEXT_CHARS))
        verification, kind = None, "text"
        if attested_by:
            if not admin:
                raise VerificationFailed("only an admin can attest a deposit; pass the admin token")
            verdict = verifiers.AttestedVerifier().check("", attested_by)
            if not verdict.ok:
                raise VerificationFailed(f"attestation refused: {verdict.detail}")
            verification = VerificationRow(
                artifact_id=None,
                item_sha256=text_sha256(text),
                verifier="attested",
                verdict="pass",
                reference=attested_by,
                detail=verdict.detail,
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
        answer: str,
        verifier: str,
        reference: str,
        parent: str | None = None,
        title: str = "",
        admin: bool = False,
        on_progress: Progress | None = None,
    ) -> Deposited:
        """A verified item: the verifier runs before any prefill; a refusal is recorded and raised."""
        item = verifiers.VerifiedItem(question=question, solution=solution, answer=answer, verifier=verifier, reference=reference)
        if verifier == "attested" and not admin:
            raise VerificationFailed(
                "the 'attested' verifier is for admins only; use exact, numeric or sympy, or pass the admin token"
            )
        verdict = verifiers.check(item)
        vrow = VerificationRow(
            artifact_id=None,
            item_sha256=verifiers.item_sha256(item),
            verifier=verifier,
            verdict="pass" if verdict.ok else "refused",
            reference=reference,
            detail=verdict.detail,
        )
        if not verdict.ok:
            self._catalog.record_refusal(vrow)
            raise VerificationFailed(f"refused, nothing deposited: {verdict.detail}")
        text = templates.item_text(question, solution, answer)
        kind = "attested" if verifier == "attested" else "verified"
        return self._deposit(
            text,
            parent,
            title or question[:80],
            kind,
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
        leaf = self._catalog.get(ids[0])
        have = {self._catalog.source(r.id).text for r in self._catalog.chain(leaf.id)}
        todo = []
        for other in ids[1:]:
            for node in self._catalog.chain(other):
                src = self._catalog.source(node.id)
                if src.text not in have:
                    have.add(src.text)
                    todo.append((node, src))
        for i, (node, src) in enumerate(todo):
            if on_progress:
                on_progress(i / max(1, len(todo)), f"composing {i + 1}/{len(todo)}")
            passed = [v for v in self._catalog.verifications(node.id) if v.verdict == "pass"]
            v = passed[-1] if passed else None
            vrow = None
            if v is not None:
                vrow = VerificationRow(
                    artifact_id=None,
                    item_sha256=v.item_sha256,
                    verifier=v.verifier,
                    verdict="pass",
                    reference=v.reference,
                    detail=v.detail,
                )
            item = (src.question, src.solution, src.answer)
            d = self._deposit(src.text, leaf.id, node.title, node.kind, item, vrow, embed_text=src.question or src.text)
            leaf = self._catalog.get(d.id)
        return leaf.id
