"""The deposit gate: a verified item is accepted only when the model, with the item grafted, answers
its question and the verifier accepts that generated answer against the reference.

Two runs, both through `generate.answer` with the template and greedy decoding of `ask`: the *fact
run* grafts the item's solution (a one-line fact alone, a worked solution below its question:
templates.fact_run_text; a scratch artifact, never stored) and never the answer the depositor typed, so
that answer cannot be copied back, and the *graft run* grafts the new artifact at its own
position and records the question and generated token ids that make the verdict replayable. Both runs
are judged by the one judge (`verifiers.judge`) on what the generated answer asserts, so "a plain saffron with
no emblem" passes for saffron and "not saffron" does not. This module knows nothing about the catalog: it
returns `GateRun`s and the pipelines record them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import verifiers
from db.rows import VerificationRow, token_ids_sha256
from errors import InvalidInput
from graft_core import templates

if TYPE_CHECKING:  # the engine (torch) loads at the first gate run, not with the web page
    from graft_core.artifact import KVArtifact
    from graft_core.model import LoadedModel

# The one judge itself (the same function object, not a wrapper), under the name the gate calls, so that the fast
# test tier can stand a double in for the gate's verdicts alone (tests/conftest.py); tests/test_one_judge.py checks
# that it is `verifiers.judge`.
judge = verifiers.judge
GATE_MAX_NEW_TOKENS = 24  # plain form: an item's answer is short; the decode stops at the template's newline before this
# Chat form: an instruct model answers in sentences and a model that reasons works a problem before its answer (a
# GSM8K solution takes Qwen2.5-Coder-1.5B 150-300 tokens), ending its turn where it is done: the budget lets it.
GATE_CHAT_MAX_NEW_TOKENS = 384


def budget(lm: LoadedModel, used: int = 0) -> int:
    """The gate's decode budget for this model: the plain form's or the chat form's (graft_core.templates.of), at
    most what the model's context leaves after `used` positions (the graft and the question; at least 1)."""
    want = GATE_CHAT_MAX_NEW_TOKENS if templates.of(lm.tokenizer).chat else GATE_MAX_NEW_TOKENS
    return max(1, min(want, lm.info.max_positions - used))


@dataclass(frozen=True)
class GateRun:
    """One gate run: what was asked and generated with the graft, and the verifier's verdict on it."""

    run: str  # "fact" (the solution grafted, never the typed answer) | "graft" (the new artifact grafted)
    question_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    answer: str  # the generated answer cut at the template's end of answer (fact run: the value it asserts)
    ok: bool
    detail: str
    seconds: float
    prefill_tokens: int  # tokens the run prefilled (the scratch fact artifact; 0 for the graft run)
    generated: str = ""  # the whole generated answer as decoded and cut

    @property
    def tokens(self) -> int:
        """Every token this run computed: prefill + prompt + generated."""
        return self.prefill_tokens + len(self.question_ids) + len(self.generated_ids)

    def refusal(self, reference: str) -> str:
        """The one line a refused deposit shows."""
        return f"the model answered {(self.generated or self.answer)!r} with the graft; the reference is {reference!r}; nothing deposited"


def claimed(answer: str, question: str, verifier: str, reference: str) -> str:
    """What an accepted answer asserts, as the deposited answer: the value the judge read ('Osric Pellamy' as
    written, 'saffron' from 'The flag ... is a plain saffron with no emblem.'); the answer itself when nothing is
    read (a test double's verdict)."""
    try:
        return verifiers.judge(answer, verifier, reference, question).value or answer.strip()
    except InvalidInput:
        return answer.strip()


def _run(
    lm: LoadedModel, chain: list[KVArtifact], run: str, item: tuple[str, str, str, str], prefill: int, steps=None
) -> GateRun:
    from graft_core import generate

    question, solution, verifier, reference = item
    t0 = time.perf_counter()
    used = (chain[-1].end if chain else 0) + len(generate.encode_prompt(lm, question, grafted=bool(chain)))
    ans = generate.answer(lm, chain, question, max_new_tokens=budget(lm, used), steps=steps)
    verdict = judge(ans.text, verifier, reference, question)  # the item was validated by the pipeline
    answer = claimed(ans.text, question, verifier, reference) if run == "fact" and verdict.ok else ans.text
    return GateRun(
        run=run,
        question_ids=ans.prompt_ids,
        generated_ids=ans.token_ids,
        answer=answer,
        generated=ans.text,
        ok=verdict.ok,
        detail=verdict.detail,
        seconds=time.perf_counter() - t0,
        prefill_tokens=prefill,
    )


def fact_run(lm: LoadedModel, question: str, solution: str, verifier: str, reference: str, steps=None) -> GateRun:
    """Graft the solution (templates.fact_run_text: a one-line fact alone, a worked solution below its question;
    never the typed answer; a scratch artifact) and judge the model's answer to the question. With `steps` (a
    graft_core.stepgroup.StepGroup) the answer decodes in shared passes with other work's: the same tokens."""
    from graft_core.capture import capture

    t0 = time.perf_counter()
    ids = templates.deposit_ids(lm.tokenizer, templates.fact_run_text(question, solution), root=True)
    if len(ids) + 64 > lm.info.max_positions:
        raise InvalidInput("the solution is too long for the model's context; shorten it")
    art, _ = capture(lm, list(ids))
    r = _run(lm, [art], "fact", (question, solution, verifier, reference), prefill=len(ids), steps=steps)
    return GateRun(**{**r.__dict__, "seconds": time.perf_counter() - t0})


def graft_run(
    lm: LoadedModel, chain: list[KVArtifact], question: str, solution: str, verifier: str, reference: str, steps=None
) -> GateRun:
    """Graft `chain` (the new artifact last, at its own position) and judge the model's answer (`steps`: as fact_run)."""
    return _run(lm, chain, "graft", (question, solution, verifier, reference), prefill=0, steps=steps)


def record(run: GateRun, item_sha256: str, verifier: str, reference: str, detail: str = "") -> VerificationRow:
    """The verification row of a gate run (verdict from the run; provenance 'verified')."""
    return VerificationRow(
        artifact_id=None,
        item_sha256=item_sha256,
        verifier=verifier,
        verdict="pass" if run.ok else "refused",
        reference=reference,
        detail=detail or f"{run.run} run: the model answered {run.generated!r}; {run.detail}",
        question_token_ids=run.question_ids,
        question_sha256=token_ids_sha256(run.question_ids),
        generated_token_ids=run.generated_ids,
        generated_sha256=token_ids_sha256(run.generated_ids),
        generated_answer=run.generated,
        provenance="verified",
    )
