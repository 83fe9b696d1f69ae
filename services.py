"""The pipelines: deposit, answer, verify, and the store's upkeep. The only module that wires the
engine (`graft_core`), the catalog and blobs (`db`) and retrieval (`retrieval`) together.

Front ends (cli.py, app.py) call one method of `Library` and format its result. The model runs one
request at a time per process (`Library.lock`); the catalog is safe to share between processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import retrieval  # noqa: F401  (faiss before torch: see retrieval/__init__.py)
import verifiers
from db.blobs import BlobStore
from db.catalog import Catalog
from db.rows import ArtifactRow, LedgerRow, SourceRow, VerificationRow
from graft_core import codec, generate, templates
from graft_core import model as model_mod
from graft_core.artifact import KVArtifact, artifact_key, text_sha256
from graft_core.capture import capture
from graft_core.errors import ArtifactNotFound, InputTooLong, InvalidInput, KvgraftError, VerificationFailed
from graft_core.verify import check as exact_check
from graft_core.verify import check_composed, check_relocated
from retrieval import DEFAULT_THRESHOLD, Hit, VectorIndex
from retrieval.embedder import Embedder, SentenceEmbedder

MAX_TEXT_CHARS = 200_000
MAX_QUESTION_CHARS = 4_000
MAX_K = 16


def default_home() -> Path:
    return Path(os.environ.get("KVGRAFT_HOME") or Path.home() / ".local" / "share" / "kvgraft")


@dataclass(frozen=True)
class Deposited:
    id: str
    content_sha256: str
    tokens: int
    start: int
    bytes: int
    prefill_s: float
    kind: str
    title: str
    parent: str | None
    verified: bool
    verifier: str
    created: bool  # False when the same deposit already existed (nothing was computed)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Retrieved:
    id: str
    title: str
    score: float
    tokens: int
    kind: str
    verifier: str
    verdict: str


@dataclass(frozen=True)
class AnswerResult:
    answer: str
    tier: str
    retrieved: tuple[Retrieved, ...]
    artifact_ids: tuple[str, ...]
    grafted_tokens: int
    computed_tokens: int
    decode_tokens: int
    ttft_s: float
    total_s: float
    read_s: float
    savings: dict
    check: dict | None
    baseline: dict | None  # measured no-graft run, when asked for
    output_sha256: str
    logits_sha256: str
    ledger_id: int | None
    note: str = ""
    output_token_ids: tuple[int, ...] = ()

    def as_json(self) -> dict:
        d = asdict(self)
        d["retrieved"] = [
            {
                "id": r.id,
                "title": r.title,
                "score": r.score,
                "tokens": r.tokens,
                "kind": r.kind,
                "verifier": r.verifier,
                "verdict": r.verdict,
            }
            for r in self.retrieved
        ]
        if self.check is not None:
            c = self.check
            d["check"] = {
                "exact": c["exact"],
                "fresh_sha256": c["fresh_sha256"],
                "grafted_sha256": c["grafted_sha256"],
                "kl": c["kl"],
                "argmax_agreement": c["argmax_agreement"],
                "max_abs_diff": c["max_abs_diff"],
                "monolithic_max_abs_diff": c.get("monolithic_max_abs_diff"),
                "monolithic_kl": c.get("monolithic_kl"),
                "monolithic_argmax_agreement": c.get("monolithic_argmax_agreement"),
                "rows": c["rows"],
                "tier": c["tier"],
            }
        return d


@dataclass
class VerifyReport:
    samples: int
    byte_equal: int
    max_kl: float
    argmax_agreement: float
    relocate: int | None
    rows: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _bounded(name: str, text: str, limit: int) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{name} is empty")
    if len(text) > limit:
        raise InputTooLong(f"{name} is {len(text):,} characters; the limit is {limit:,}")
    if "\x00" in text:
        raise InvalidInput(f"{name} contains NUL bytes; send plain text")
    return text


class Library:
    """One store (catalog + blobs + index) and one model, shared by every request of a process."""

    def __init__(
        self,
        home: str | os.PathLike | None = None,
        db_url: str | None = None,
        model_name: str | None = None,
        embedder: Embedder | None = None,
        lm: model_mod.LoadedModel | None = None,
    ):
        self.home = Path(home) if home else default_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog.open(db_url or os.environ.get("KVGRAFT_DB_URL") or None, self.home)
        self.blobs = BlobStore(self.home / "blobs")
        self.model_name = model_name
        self._lm = lm
        self._embedder = embedder
        self._index: VectorIndex | None = None
        self.lock = threading.RLock()
        self._index_lock = threading.Lock()
        self._cache: dict[str, KVArtifact] = {}

    # ---- lazily loaded parts ----------------------------------------------------------------

    @property
    def lm(self) -> model_mod.LoadedModel:
        with self.lock:
            if self._lm is None:
                self._lm = model_mod.load(self.model_name)
            return self._lm

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = SentenceEmbedder()
        return self._embedder

    def index(self) -> VectorIndex:
        """The FAISS index, loaded from disk or rebuilt from the catalog when missing or stale.

        One thread rebuilds at a time; the others wait and reuse its result."""
        with self._index_lock:
            version = self.catalog.version()
            idx = self._index
            if idx is not None and not idx.is_stale(version, self.embedder.embedder_id):
                return idx
            if idx is not None and idx.embedder_id == self.embedder.embedder_id:
                return self._sync(idx, version)
            try:
                idx = VectorIndex.load(self.home / "index")
            except (KvgraftError, OSError):
                idx = None
            if idx is None or idx.is_stale(version, self.embedder.embedder_id):
                return self._rebuild(version, must_save=False)
            self._index = idx
            return idx

    def rebuild_index(self) -> VectorIndex:
        """Rebuild the FAISS index from the catalog's embeddings and save it, whatever is on disk."""
        with self._index_lock:
            return self._rebuild(self.catalog.version(), must_save=True)

    def _sync(self, idx: VectorIndex, version: int) -> VectorIndex:
        """Bring a live index up to the catalog by adding and removing only what changed: a deposit
        made by another process costs one insert here, not a rebuild (HNSW builds take seconds)."""
        pairs = dict(self.catalog.embeddings(self.embedder.embedder_id))
        have = idx.ids()
        for gone in have - pairs.keys():
            idx.remove(gone)
        for aid in pairs.keys() - have:
            idx.add(aid, np.frombuffer(pairs[aid], dtype="<f4"))
        idx.mark_version(version)
        try:
            idx.save(self.home / "index")
        except OSError:
            pass
        return idx

    def _rebuild(self, version: int, must_save: bool) -> VectorIndex:
        idx = VectorIndex(self.embedder.dim, self.embedder.embedder_id)
        pairs = [(aid, np.frombuffer(vec, dtype="<f4")) for aid, vec in self.catalog.embeddings(self.embedder.embedder_id)]
        idx.build(pairs, version)
        try:
            idx.save(self.home / "index")
        except OSError:
            if must_save:
                raise  # a read-only store still answers from the in-memory index
        self._index = idx
        return idx

    # ---- reading artifacts -------------------------------------------------------------------

    def load_artifact(self, artifact_id: str) -> KVArtifact:
        """Read, hash-check and decode one artifact (IntegrityError on any mismatch)."""
        row = self.catalog.get(artifact_id)
        art = codec.loads(self.blobs.get(row.content_sha256))
        if art.key != row.id:
            raise KvgraftError(f"artifact file for {row.id} holds {art.key}: the catalog and the blob store disagree; run fsck")
        return art

    def load_chain(self, artifact_id: str) -> tuple[list[KVArtifact], float]:
        t0 = time.perf_counter()
        chain = [self.load_artifact(r.id) for r in self.catalog.chain(artifact_id)]
        return chain, time.perf_counter() - t0

    # ---- deposit -----------------------------------------------------------------------------

    def _deposit(
        self,
        text: str,
        parent: str | None,
        title: str,
        kind: str,
        item: tuple[str | None, str | None, str | None],
        verification: VerificationRow | None,
        embed_text: str,
        on_progress: Callable[[float, str], None] | None = None,
    ) -> Deposited:
        """Tokenise, name (before any work), prefill, write the blob and the catalog rows in one
        transaction. `item` is the source's (question, solution, answer), all None for free text."""
        progress = on_progress or (lambda f, m: None)
        lm = self.lm
        parent_row = self.catalog.get(parent) if parent else None
        token_ids = lm.tokenizer(text, add_special_tokens=parent_row is None)["input_ids"]
        start = parent_row.end_pos if parent_row else 0
        if start + len(token_ids) > lm.info.max_positions:
            raise InputTooLong(
                f"deposit of {len(token_ids):,} tokens at position {start:,} exceeds the model's "
                f"{lm.info.max_positions:,}-token context; split the text into several deposits"
            )
        key = artifact_key(lm.fingerprint, parent_row.id if parent_row else "", token_ids)
        try:  # hash before work: a repeated deposit costs nothing
            row = self.catalog.get(key)
            return self._deposited(row, prefill_s=0.0, created=False)
        except ArtifactNotFound:
            pass
        progress(0.1, f"prefilling {len(token_ids)} tokens")
        with self.lock:
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
        row = self.catalog.add_deposit(row, src, verification, emb, lambda: self.blobs.put(data))
        progress(1.0, "deposited")
        return self._deposited(row, prefill_s=stats.prefill_s, created=True)

    def _deposited(self, row: ArtifactRow, prefill_s: float, created: bool) -> Deposited:
        vs = self.catalog.verifications(row.id)
        passed = [v for v in vs if v.verdict == "pass"]
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
        on_progress=None,
    ) -> Deposited:
        """Free text (a document, a fact sheet). Unverified unless an admin attests it."""
        text = templates.document_text(_bounded("text", text, MAX_TEXT_CHARS))
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
        on_progress=None,
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
            self.catalog.record_refusal(vrow)
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

    # ---- answer -----------------------------------------------------------------------------

    def _describe(self, hit: Hit) -> Retrieved:
        row = self.catalog.get(hit.artifact_id)
        vs = self.catalog.verifications(row.id)
        last = vs[-1] if vs else None
        return Retrieved(
            id=row.id,
            title=row.title,
            score=round(float(hit.score), 4),
            tokens=row.end_pos,
            kind=row.kind,
            verifier=last.verifier if last else "none",
            verdict=last.verdict if last else "unverified",
        )

    def retrieve(self, question: str, k: int = 3, threshold: float = DEFAULT_THRESHOLD) -> list[Retrieved]:
        if not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be between 1 and {MAX_K}, got {k}")
        vec = self.embedder.embed(question)
        return [self._describe(h) for h in self.index().search(vec, k=k, threshold=threshold)]

    def _choose(self, hits: list[Retrieved]) -> str:
        """The leaf to graft: the deepest hit whose chain contains the most other hits (exact composition)."""
        best, best_cover = hits[0].id, -1
        for h in hits:
            chain_ids = {r.id for r in self.catalog.chain(h.id)}
            cover = sum(1 for o in hits if o.id in chain_ids)
            if cover > best_cover:
                best, best_cover = h.id, cover
        return best

    def compose(self, ids: list[str], on_progress: Callable[[float, str], None] | None = None) -> str:
        """Chain several artifacts exactly: the first one's chain, then each other item's text
        deposited as a child in order (one prefill each, the first time only: keys are
        deterministic, so composing the same items again costs nothing). Returns the leaf id."""
        if not ids:
            raise InvalidInput("nothing to compose: give at least one artifact id")
        leaf = self.catalog.get(ids[0])
        have = {self.catalog.source(r.id).text for r in self.catalog.chain(leaf.id)}
        todo = []
        for other in ids[1:]:
            for node in self.catalog.chain(other):
                src = self.catalog.source(node.id)
                if src.text not in have:
                    have.add(src.text)
                    todo.append((node, src))
        for i, (node, src) in enumerate(todo):
            if on_progress:
                on_progress(i / max(1, len(todo)), f"composing {i + 1}/{len(todo)}")
            passed = [v for v in self.catalog.verifications(node.id) if v.verdict == "pass"]
            v = passed[-1] if passed else None
            vrow = (
                None
                if v is None
                else VerificationRow(
                    artifact_id=None,
                    item_sha256=v.item_sha256,
                    verifier=v.verifier,
                    verdict="pass",
                    reference=v.reference,
                    detail=v.detail,
                )
            )
            item = (src.question, src.solution, src.answer)
            d = self._deposit(src.text, leaf.id, node.title, node.kind, item, vrow, embed_text=src.question or src.text)
            leaf = self.catalog.get(d.id)
        return leaf.id

    def answer(
        self,
        question: str,
        k: int = 3,
        artifact: str | None = None,
        graft: bool = True,
        max_new_tokens: int = 32,
        raw: bool = False,
        check: bool = False,
        compare: bool = False,
        relocated: bool = False,
        threshold: float = DEFAULT_THRESHOLD,
        on_token: Callable[[str], None] | None = None,
        record: bool = True,
        compose: bool = False,
    ) -> AnswerResult:
        question = _bounded("question", question, MAX_QUESTION_CHARS)
        retrieved: list[Retrieved] = []
        note = ""
        chain_ids: list[str] = []
        if graft and artifact:
            chain_ids = [r.id for r in self.catalog.chain(artifact)]
            note = "artifact chosen by the caller"
        elif graft:
            retrieved = self.retrieve(question, k=k, threshold=threshold)
            if not retrieved:
                note = f"no artifact above similarity {threshold}: answered without graft"
            elif relocated:
                chain_ids = [h.id for h in retrieved if self.catalog.get(h.id).parent_id is None]
                note = "relocated composition of independent roots (approximate, labelled)"
            else:
                leaf = self._choose(retrieved)
                chain_ids = [r.id for r in self.catalog.chain(leaf)]
                missing = [h.id for h in retrieved if h.id not in chain_ids]
                if missing and compose:
                    leaf = self.compose([leaf, *missing])
                    chain_ids = [r.id for r in self.catalog.chain(leaf)]
                    note = f"composed {len(missing) + 1} retrieved items into one exact chain"
                elif missing:
                    note = f"grafted the chain of the best hit; {len(missing)} other hit(s) not on it (use compose for an exact chain)"
        else:
            note = "graft off: plain baseline"
        with self.lock:
            lm = self.lm
            t0 = time.perf_counter()
            chain = [self.load_artifact(i) for i in chain_ids]
            read_s = time.perf_counter() - t0
            tok_cb = None
            if on_token is not None:
                got: list[int] = []

                def tok_cb(t: int) -> None:
                    got.append(t)
                    on_token(
                        templates.cut_answer(lm.tokenizer.decode(got, skip_special_tokens=True))
                        if not raw
                        else lm.tokenizer.decode(got, skip_special_tokens=True)
                    )

            base = generate.baseline(lm, chain, question, max_new_tokens, raw) if (compare and chain) else None
            ans = generate.answer(
                lm,
                chain,
                question,
                max_new_tokens=max_new_tokens,
                raw=raw,
                run_check=check and not relocated,
                read_s=read_s,
                relocated=relocated and len(chain) > 0,
                on_token=tok_cb,
                baseline_decode_tokens=base.decode_tokens if base else None,
            )
            reloc_check = None
            if check and relocated and chain:
                reloc_check = check_composed(lm, chain, list(ans.prompt_ids))
        checkd = ans.check.as_dict() if ans.check else (reloc_check.as_dict() if reloc_check else None)
        sv = ans.savings.as_dict()
        baseline = None
        if base is not None:
            baseline = asdict(base) | {"ttft_speedup": base.ttft_s / max(ans.ttft_s, 1e-9), "measured": True}
        ledger_id = None
        if record:
            ledger_id = self.catalog.add_ledger(
                LedgerRow(
                    query_sha256=hashlib.sha256(question.encode()).hexdigest(),
                    query=question,
                    prompt_sha256=generate.tokens_sha256(ans.prompt_ids),
                    artifact_ids=ans.artifact_ids,
                    tier=ans.tier,
                    model_fingerprint=lm.fingerprint,
                    output_token_ids=ans.token_ids,
                    output_sha256=ans.output_sha256,
                    grafted_tokens=ans.grafted_tokens,
                    computed_tokens=ans.computed_tokens,
                    decode_tokens=ans.decode_tokens,
                    baseline_tokens=ans.savings.baseline_total,
                    baseline_measured=base is not None,
                    ttft_s=ans.ttft_s,
                    total_s=ans.total_s,
                    flops=int(ans.savings.flops_estimate),
                    baseline_flops=int(ans.savings.baseline_flops_estimate),
                    logits_sha256=ans.logits_sha256,
                    baseline_ttft_s=base.ttft_s if base else None,
                    exact=checkd["exact"] if checkd else None,
                    check_json=json.dumps(checkd) if checkd else None,
                )
            )
        return AnswerResult(
            answer=ans.text,
            tier=ans.tier,
            retrieved=tuple(retrieved),
            artifact_ids=ans.artifact_ids,
            grafted_tokens=ans.grafted_tokens,
            computed_tokens=ans.computed_tokens,
            decode_tokens=ans.decode_tokens,
            ttft_s=ans.ttft_s,
            total_s=ans.total_s,
            read_s=read_s,
            savings=sv,
            check=checkd,
            baseline=baseline,
            output_sha256=ans.output_sha256,
            logits_sha256=ans.logits_sha256,
            ledger_id=ledger_id,
            note=note,
            output_token_ids=ans.token_ids,
        )

    # ---- verify -----------------------------------------------------------------------------

    def verify_samples(
        self,
        samples: int = 10,
        relocate: int | None = None,
        seed: int = 0,
        on_progress: Callable[[float, str], None] | None = None,
    ) -> VerifyReport:
        """Draw `samples` (artifact, query) pairs from the store and check graft vs fresh on each."""
        import random

        if not 1 <= samples <= 1000:
            raise InvalidInput(f"samples must be between 1 and 1000, got {samples}")
        rows = self.catalog.list_artifacts(limit=10_000)
        if not rows:
            raise ArtifactNotFound("the store is empty: deposit something first (cli.py deposit --text-file F)")
        rng = random.Random(seed)
        questions = ["What is it?", "Who built it?", "When did it happen?", "Summarise the fact.", "How many are there?", "Why?"]
        report = VerifyReport(samples=samples, byte_equal=0, max_kl=0.0, argmax_agreement=1.0, relocate=relocate)
        agree = []
        for i in range(samples):
            row = rng.choice(rows)
            q = rng.choice(questions)
            with self.lock:
                chain, _ = self.load_chain(row.id)
                qids = generate.encode_prompt(self.lm, q, grafted=True)
                if relocate is not None:
                    root = chain[0]
                    c = check_relocated(self.lm, root, qids, offset=relocate)
                    aid = root.key
                else:
                    c = exact_check(self.lm, chain, qids)
                    aid = row.id
            report.byte_equal += int(c.exact)
            report.max_kl = max(report.max_kl, c.kl)
            agree.append(c.argmax_agreement)
            report.rows.append({"artifact": aid, "query": q, **c.as_dict()})
            if on_progress:
                on_progress((i + 1) / samples, f"sample {i + 1}/{samples}")
        report.argmax_agreement = float(np.mean(agree))
        return report
