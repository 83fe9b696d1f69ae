"""The answer pipeline of a Library: retrieve, choose the chain to graft, generate with token
accounting and the cheap proof of the served state (and, when asked, the full recomputation of the
served rows and the measured no-graft baseline), record the answer in the ledger.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from db.rows import LedgerRow
from errors import IntegrityError, InvalidInput, quarantine_message
from files import write_faults
from graft_core import templates

from .door import DEFAULT_ANSWER, AnswerOptions
from .limits import MAX_K, MAX_QUESTION_CHARS, MAX_SEED, bounded, prompt_bounded, whole
from .results import AnswerResult, Retrieved

if TYPE_CHECKING:  # the engine (torch) and retrieval (faiss) load at first use, not with the web page
    from graft_core import generate
    from graft_core.artifact import KVArtifact
    from graft_core.exactness import ExactnessCheck
    from graft_core.model import LoadedModel
    from graft_core.proof import Proof, ProvenState
    from graft_core.sampling import Sampling
    from retrieval import Embedder, Hit

    from .artifacts import Artifacts
    from .store import Store
    from .turns import ModelTurns


MAX_STOPS = 4  # stop strings one answer may name (OpenAI's own bound)
MAX_STOP_CHARS = 64


def _sampling(o: AnswerOptions) -> Sampling | None:
    """The options' sampling (None: greedy), checked before any work; a missing seed is drawn here and reported."""
    if not isinstance(o.stop, tuple) or len(o.stop) > MAX_STOPS or not all(isinstance(s, str) for s in o.stop):
        raise InvalidInput(f"stop must be at most {MAX_STOPS} strings")
    if not all(0 < len(s) <= MAX_STOP_CHARS and "\x00" not in s for s in o.stop):
        raise InvalidInput(f"each stop string must be 1 to {MAX_STOP_CHARS} characters of text")
    if isinstance(o.temperature, bool) or not isinstance(o.temperature, int | float) or not 0 <= o.temperature <= 2:
        raise InvalidInput(f"temperature must be a number between 0 and 2, got {str(o.temperature)[:40]!r}")
    if isinstance(o.top_p, bool) or not isinstance(o.top_p, int | float) or not 0 < o.top_p <= 1:
        raise InvalidInput(f"top_p must be a number above 0 and at most 1, got {str(o.top_p)[:40]!r}")
    if o.seed is not None:
        whole("seed", o.seed, 0, MAX_SEED)
    if o.temperature == 0:
        return None
    from graft_core.sampling import Sampling

    seed = secrets.randbelow(MAX_SEED + 1) if o.seed is None else int(o.seed)
    return Sampling(temperature=float(o.temperature), seed=seed, top_p=float(o.top_p))


def _given_ids(o: AnswerOptions, vocab: int) -> list[int] | None:
    """The prompt's token ids when the options give them (raw only, each a token of the model's vocabulary), else
    None; InvalidInput saying what to send otherwise."""
    if not o.prompt_ids:
        return None
    if not o.raw:
        raise InvalidInput("a prompt given as token ids is a raw prompt: set raw (the completions route does)")
    bad = [i for i in o.prompt_ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab]
    if bad:
        raise InvalidInput(f"prompt token ids must be integers from 0 to {vocab - 1} (the model's vocabulary), got {bad[0]!r}")
    return list(o.prompt_ids)


def _logprobs(tokenizer, ans, echo: bool) -> dict:
    """The answer's log-probabilities as `AnswerResult` fields (none unless asked), each token with its text."""
    from .results import Logprob

    if not ans.output_logprobs and not ans.prompt_logprobs:
        return {}
    texts: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in texts:
            texts[i] = tokenizer.decode([i])
        return texts[i]

    def one(lp) -> Logprob:
        return Logprob(lp.token_id, text(lp.token_id), lp.logprob, tuple((i, text(i), v) for i, v in lp.top))

    out = {"output_logprobs": tuple(one(x) for x in ans.output_logprobs)}
    if echo:
        out |= {
            "prompt_logprobs": tuple(one(x) for x in ans.prompt_logprobs),
            "prompt_token_ids": tuple(ans.prompt_ids),
            "prompt_text": tokenizer.decode(list(ans.prompt_ids)),
        }
    return out


def _threshold(threshold: float | None) -> float:
    from retrieval import DEFAULT_THRESHOLD

    return DEFAULT_THRESHOLD if threshold is None else threshold


class AnswerPipeline:
    """The answers of one store and one model. It is handed the store, the artifact reads and proofs, the
    model's turns, accessors of the model and the embedder (loaded at first use) and `compose` (the deposit
    pipeline's: an answer with `compose` deposits the retrieved items as one chain)."""

    def __init__(
        self,
        store: Store,
        artifacts: Artifacts,
        turns: ModelTurns,
        lm: Callable[[], LoadedModel],
        embedder: Callable[[], Embedder],
        compose: Callable[[list[str]], str],
    ):
        self._store = store
        self._artifacts = artifacts
        self._turns = turns
        self._lm = lm
        self._embedder = embedder
        self._compose = compose

    def _describe(self, hit: Hit, question: str, examples: bool = True) -> Retrieved:
        from retrieval import relevance

        row = self._store.catalog.get(hit.artifact_id)
        vs = self._store.catalog.verifications(row.id)
        last = vs[-1] if vs else None
        # A verified item is judged by its own question; free text (no question) by its words. A verified worked
        # solution the question does not match as a fact may still be a worked example of the question's shape.
        src = self._store.catalog.source(row.id)
        if src.question:
            rel = relevance.decide(question, src.question, float(hit.score))
            worked = bool(src.solution) and templates.is_worked_solution(src.solution)
            if not rel.relevant and examples and worked and last is not None and last.label == "verified":
                ex = relevance.decide_example(question, src.question)
                rel = ex if ex.relevant else rel
        else:
            rel = relevance.decide_document(question, src.text, float(hit.score))
        return Retrieved(
            id=row.id,
            title=row.title,
            score=round(float(hit.score), 4),
            tokens=row.end_pos,
            kind=row.kind,
            verifier=last.verifier if last else "none",
            verdict=last.label if last else "unverified",
            relevant=rel.relevant,
            reason=rel.reason,
            use=rel.use,
        )

    def retrieve(self, question: str, k: int = 3, threshold: float | None = None, examples: bool = True) -> list[Retrieved]:
        """The artifacts nearest to `question` (at most `k`, similarity at least `threshold`, default
        retrieval's DEFAULT_THRESHOLD), best first, each with the relevance stage's decision; only
        `relevant` ones are ever grafted (`examples`: a verified worked example of the question's shape counts)."""
        if not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be between 1 and {MAX_K}, got {k}")
        vec = self._embedder().embed(question)
        own = self._store.model_ids(self._lm().fingerprint)  # another model's artifacts are never candidates
        hits = self._store.index().search(vec, k=k, threshold=_threshold(threshold), allowed=own)
        return [self._describe(h, question, examples) for h in hits]

    def _choose(self, hits: list[Retrieved]) -> str:
        """The leaf to graft: the deepest hit whose chain contains the most other hits (exact composition)."""
        best, best_cover = hits[0].id, -1
        for h in hits:
            chain_ids = {r.id for r in self._store.catalog.chain(h.id)}
            cover = sum(1 for o in hits if o.id in chain_ids)
            if cover > best_cover:
                best, best_cover = h.id, cover
        return best

    def _plan(
        self,
        question: str,
        k: int,
        artifact: str | None,
        graft: bool,
        relocated: bool,
        threshold: float,
        compose: bool,
        examples: bool = True,
    ) -> tuple[list[Retrieved], list[str], str]:
        """(what was retrieved, the artifact ids to graft root first, a note saying why)."""
        if not graft:
            return [], [], "graft off: plain baseline"
        if artifact:
            return [], [r.id for r in self._store.catalog.chain(artifact)], "artifact chosen by the caller"
        retrieved = self.retrieve(question, k=k, threshold=threshold, examples=examples)
        if not retrieved:
            return retrieved, [], f"no artifact above similarity {threshold}: answered without graft"
        kept = [h for h in retrieved if h.relevant and h.use == "fact"] or [h for h in retrieved if h.relevant][:1]
        if not kept:
            return (
                retrieved,
                [],
                f"{len(retrieved)} hit(s) dropped as not relevant ({retrieved[0].reason}): answered without graft",
            )
        if relocated:
            roots = [h.id for h in kept if self._store.catalog.get(h.id).parent_id is None]
            return retrieved, roots, "relocated composition of independent roots (approximate, labelled)"
        leaf = self._choose(kept)
        chain_ids = [r.id for r in self._store.catalog.chain(leaf)]
        if kept[0].use == "example":  # one worked example, the nearest, grafted as a one-shot example
            return retrieved, chain_ids, f"a verified worked example of the question's shape: {kept[0].reason}"
        missing = [h.id for h in kept if h.id not in chain_ids]
        if missing and compose:
            leaf = self._compose([leaf, *missing])
            return (
                retrieved,
                [r.id for r in self._store.catalog.chain(leaf)],
                f"composed {len(missing) + 1} retrieved items into one exact chain",
            )
        if missing:
            return (
                retrieved,
                chain_ids,
                f"grafted the chain of the best hit; {len(missing)} other hit(s) not on it (use compose for an exact chain)",
            )
        return retrieved, chain_ids, ""

    def _token_callback(
        self, on_token: Callable[[str], None] | None, raw: bool, form: str = "answer", stop: tuple[str, ...] = ()
    ) -> Callable[[int], None] | None:
        """Turns generated token ids into the growing answer text for a streaming caller (the finished answer's
        text is the last one: `templates.answer_text` of everything decoded)."""
        if on_token is None:
            return None
        tokenizer, got = self._lm().tokenizer, []
        template = templates.of(tokenizer)

        def tok_cb(t: int) -> None:
            got.append(t)
            text = tokenizer.decode(got, skip_special_tokens=True)
            on_token(templates.answer_text(text, raw, form, stop, template))

        return tok_cb

    def _load_for_answer(
        self, ids: list[str], relocated: bool
    ) -> tuple[list[KVArtifact], ProvenState | None, Callable[[Proof], None] | None]:
        """The chain to graft, what this process proved about the leaf's restored state (None: not yet, the
        answer's own proof runs the probe), and the callback that remembers a passing probe and quarantines
        and refuses on a failed proof, before any token is chosen. Ancestors get `graftable`'s checks."""
        if not ids or relocated:
            return self._artifacts.graftable(ids), None, None
        leaf = self._store.catalog.get(ids[-1])
        arts = [self._artifacts.load(i) for i in ids]
        if leaf.probe_sha256 != arts[-1].probe_sha256:  # a catalog/file disagreement: the probe reports it
            self._artifacts.graftable(ids)
        else:
            self._artifacts.graftable(ids[:-1])
        return arts, self._artifacts.state(leaf.content_sha256), self._on_proof(leaf.id, leaf.content_sha256)

    def _on_proof(self, artifact_id: str, content_sha256: str) -> Callable[[Proof], None]:
        from graft_core.proof import proven

        def check(proof: Proof) -> None:
            if proof.passed:
                state = proven(proof)
                if state is not None:
                    self._artifacts.remember(content_sha256, state)
                return
            self._artifacts.forget(content_sha256)
            what = "probe check" if proof.kind == "probe" else "state proof"
            why = f"{what} failed: {proof.note} (expected {proof.expected[:16]}…, observed {proof.observed[:16]}…)"
            self._store.catalog.set_quarantine(artifact_id, why)
            raise IntegrityError(quarantine_message(artifact_id, why))

        return check

    def _record(
        self,
        question: str,
        ans: generate.Answer,
        base: generate.Baseline | None,
        check: ExactnessCheck | None,
        sampling: Sampling | None = None,
    ) -> int:
        from graft_core import generate

        checkd = check.as_dict() if check else None
        record = (checkd or {}) | ({"proof": ans.proof.as_dict()} if ans.proof else {})
        if sampling is not None:  # what replay needs to draw the same tokens again
            record["sampling"] = sampling.as_dict()
        row = LedgerRow(
            query_sha256=hashlib.sha256(question.encode()).hexdigest(),
            query=question,
            prompt_sha256=generate.tokens_sha256(ans.prompt_ids),
            artifact_ids=ans.artifact_ids,
            tier=ans.tier,
            model_fingerprint=self._lm().fingerprint,
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
            check_json=json.dumps(record) if record else None,
        )
        with write_faults(self._store.home, "ask again", needed_bytes=1 << 20, outcome="the answer was not recorded"):
            return self._store.catalog.add_ledger(row)

    def answer(
        self, question: str, options: AnswerOptions = DEFAULT_ANSWER, on_token: Callable[[str], None] | None = None
    ) -> AnswerResult:
        """LibraryDoor.answer (its contract): retrieval embeds and judges the question alone, whatever the
        query form (`options.form`, graft_core.templates.FORMS: `cot` lets the model reason first)."""
        from graft_core import generate
        from graft_core.exactness import check_composed

        o = options
        given = _given_ids(o, self._lm().info.vocab_size if o.prompt_ids else 0)
        if given and not question.strip():  # the ids' text names the prompt for retrieval and the ledger
            question = self._lm().tokenizer.decode(given)[:MAX_QUESTION_CHARS].strip() or f"({len(given)} token ids)"
        question = bounded("question", question, MAX_QUESTION_CHARS)
        if o.max_prompt_tokens is not None:  # before retrieval: a refused question costs one tokenisation
            n = len(given) if given else len(generate.encode_prompt(self._lm(), question, grafted=False, raw=o.raw, form=o.form))
            prompt_bounded(n, o.max_prompt_tokens)
        sampling = _sampling(o)
        retrieved, chain_ids, note = self._plan(
            question, o.k, o.artifact, o.graft, o.relocated, _threshold(o.threshold), o.compose, o.examples
        )
        with self._turns.answering() as steps:
            lm = self._lm()
            t0 = time.perf_counter()
            # probe-checked on first restore (a leaf by the answer's own probe chunk); quarantined ones refuse
            chain, known, on_proof = self._load_for_answer(chain_ids, o.relocated)
            read_s = time.perf_counter() - t0
            base = generate.baseline(lm, chain, question, o.max_new_tokens, o.raw, o.form) if (o.compare and chain) else None
            ans = generate.answer(
                lm,
                chain,
                question,
                max_new_tokens=o.max_new_tokens,
                raw=o.raw,
                run_check=o.check and not o.relocated,
                read_s=read_s,
                relocated=o.relocated and len(chain) > 0,
                on_token=self._token_callback(on_token, o.raw, o.form, o.stop),
                baseline_decode_tokens=base.decode_tokens if base else None,
                proven=known,
                on_proof=on_proof,
                steps=steps,
                form=o.form,
                sampling=sampling,
                stop=o.stop,
                given_ids=given,
                logprobs=o.logprobs,
                echo=o.echo,
            )
            exactness = ans.check
            if o.check and o.relocated and chain:
                exactness = check_composed(lm, chain, list(ans.prompt_ids))
        ledger_id = self._record(question, ans, base, exactness, sampling) if o.record else None
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
            savings=ans.savings,
            check=exactness,
            baseline=base,
            output_sha256=ans.output_sha256,
            logits_sha256=ans.logits_sha256,
            ledger_id=ledger_id,
            note=note,
            output_token_ids=ans.token_ids,
            proof=ans.proof,
            machine_bound=lm.machine_bound,
            model=lm.info.name,
            stopped=ans.stopped,
            **({} if sampling is None else sampling.as_dict()),
            **_logprobs(lm.tokenizer, ans, o.echo),
        )
