"""Stored verdicts re-judged with the current judge (eval/rejudge.py, what replay-eval reports): a record scored
by another judge is reported as such with the current verdict, a record scored by the current judge that
re-scores differently is a mismatch, and the recurring case's never-solved problems are re-judged attempt by
attempt with the tokens spent until the first pass."""

from __future__ import annotations

import copy

import verifiers
from eval import recurring, rejudge

TRAINS = {
    "id": "p0028",
    "question": "How many minutes after the first train departs do the trains meet?",
    "verifier": "numeric",
    "reference": "84",
}
ROWS = {"p0028": TRAINS}


def _attempt(answer: str, tokens: int, passed: bool) -> dict:
    return {"mode": "sampled", "seed": 1, "temperature": 0.8, "tokens": tokens, "output_sha256": "0" * 64, "answer": answer}


def _case(judge: str | None) -> dict:
    atts = [
        {**_attempt("10 minutes", 30, False), "passed": False, "detail": ""},
        {**_attempt("84 minutes", 20, False), "passed": False, "detail": ""},  # refused by the kinds' whole check
        {**_attempt("84", 10, False), "passed": False, "detail": ""},
    ]
    rec = {
        "id": "p0028",
        "template": "trains_meeting",
        "reference": "84",
        "verifier": "numeric",
        "baseline_tokens": 60,
        "baseline_attempts": 3,
        "baseline_solved": False,
        "baseline_answer": "",
        "attempts_sha256": recurring.attempts_sha256(atts),
        "attempts": atts,
    }
    if judge is not None:
        rec["judge"] = judge
    return {"config": {"budget": 100}, "failed": [rec], "solved_by_sampling": [], "gate_refused": []}


def test_a_never_solved_problem_is_re_judged_attempt_by_attempt():
    (p,) = rejudge.never_solved(_case(None), ROWS)
    assert p["scored_by"] == rejudge.UNNAMED and p["passing_now"] == 2
    assert p["first_passing"]["attempt"] == 1 and p["first_passing"]["tokens_spent"] == 50
    assert p["first_passing"]["why"] == verifiers.judge("84 minutes", "numeric", "84", TRAINS["question"]).detail


def test_another_judges_records_are_reported_not_failed():
    case = _case(None)
    results = {"outputs": [], "recurring": case}
    summary_case = recurring.summarise_case(case["failed"], [], 100)
    case.update(summary_case)
    bad, _ = recurring.check_case(case, ROWS)
    assert bad == []  # the stored verdicts are another judge's: not a mismatch
    lines, summary = rejudge.notes(results, ROWS)
    assert summary["never_solved_passing_now"] == ["p0028"]
    assert lines == [
        f"recurring p0028: recorded as never solved by {rejudge.UNNAMED}; {verifiers.JUDGE} accepts 2 of its 3 "
        "attempts, the first ('84 minutes', attempt 1) after 50 of its 60 tokens"
    ]


def test_the_current_judges_records_must_re_score_the_same():
    case = _case(verifiers.JUDGE)
    case.update(recurring.summarise_case(case["failed"], [], 100))
    bad, _ = recurring.check_case(case, ROWS)
    assert bad == [
        "recurring p0028: attempt answer '84 minutes' re-scores differently",
        "recurring p0028: attempt answer '84' re-scores differently",
    ]
    fixed = copy.deepcopy(case)
    for a in fixed["failed"][0]["attempts"]:
        a["passed"] = verifiers.judge(a["answer"], "numeric", "84", TRAINS["question"]).ok
    fixed["failed"][0]["attempts_sha256"] = recurring.attempts_sha256(fixed["failed"][0]["attempts"])
    assert recurring.check_case(fixed, ROWS)[0] == []


def test_an_output_scored_by_another_judge_is_listed_with_the_current_verdict():
    out = {
        "item": "p0028",
        "condition": "no_graft",
        "query": TRAINS["question"],
        "answer": "84 minutes",
        "verifier": "numeric",
        "reference": "84",
        "correct": False,
    }
    lines, summary = rejudge.notes({"outputs": [out, {**out, "judge": verifiers.JUDGE}]}, ROWS)
    assert summary["outputs_scored_by_another_judge"] == 1 and summary["outputs_changed"] == 1
    assert lines[0].startswith(f"output 0 (p0028 no_graft): scored wrong by {rejudge.UNNAMED}; {verifiers.JUDGE} says correct: ")
