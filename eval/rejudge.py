"""Stored verdicts re-judged with the current judge, from the records alone (what replay-eval reports).

A record carries its answer, its verifier and reference (and its question, or the data file gives it), and the
name of the judge that scored it (`judge`, `verifiers.JUDGE` at the time; absent on records written before
judges were named). A record scored by the current judge must re-score the same (recheck fails otherwise); a
record scored by another judge is not a mismatch: it is reported as scored by that judge, with what the current
judge says. Pure functions over the results dictionary; nothing here runs a model.
"""

from __future__ import annotations

import verifiers

UNNAMED = "an unnamed earlier judge"


def scored_by(record: dict) -> str:
    return record.get("judge") or UNNAMED


def current(record: dict) -> bool:
    """Was this record scored by the judge that runs now?"""
    return record.get("judge") == verifiers.JUDGE


def verdict(answer: str, row: dict, question: str | None = None) -> verifiers.Verdict:
    return verifiers.judge(answer, row["verifier"], row["reference"], row["question"] if question is None else question)


def never_solved(case: dict, rows: dict[str, dict]) -> list[dict]:
    """The recurring case's problems recorded as never solved (`failed`), each stored baseline attempt
    re-judged: how many pass now, and the first that does with the tokens spent up to and including it."""
    out = []
    for rec in case["failed"]:
        row = rows[rec["id"]]
        spent, first, passing = 0, None, 0
        for k, a in enumerate(rec["attempts"]):
            spent += a["tokens"]
            v = verdict(a["answer"], row)
            if v.ok:
                passing += 1
                if first is None:
                    first = {"attempt": k, "answer": a["answer"], "tokens_spent": spent, "why": v.detail}
        out.append(
            {
                "id": rec["id"],
                "scored_by": scored_by(rec),
                "attempts": len(rec["attempts"]),
                "baseline_tokens": rec["baseline_tokens"],
                "passing_now": passing,
                "first_passing": first,
            }
        )
    return out


def notes(results: dict, rows: dict[str, dict]) -> tuple[list[str], dict]:
    """(one line per record scored by another judge whose verdict the current judge changes, a summary)."""
    lines, changed, other = [], 0, 0
    for i, o in enumerate(results.get("outputs", [])):
        if current(o) or o["item"] not in rows:
            continue
        other += 1
        v = verifiers.judge(o["answer"], o["verifier"], o["reference"], o.get("query", ""))
        if v.ok != o["correct"]:
            changed += 1
            lines.append(
                f"output {i} ({o['item']} {o['condition']}): scored {'correct' if o['correct'] else 'wrong'} by "
                f"{scored_by(o)}; {verifiers.JUDGE} says {'correct' if v.ok else 'wrong'}: {v.detail}"
            )
    summary = {"judge": verifiers.JUDGE, "outputs_scored_by_another_judge": other, "outputs_changed": changed}
    case = results.get("recurring")
    if case is not None:
        records = [*case["failed"], *case["solved_by_sampling"]]
        summary["recurring_records_scored_by_another_judge"] = sum(1 for r in records if not current(r))
        unsolved = [p for p in never_solved(case, rows) if p["scored_by"] != verifiers.JUDGE]
        summary["never_solved_passing_now"] = [p["id"] for p in unsolved if p["passing_now"]]
        for p in unsolved:
            if p["first_passing"] is None:
                lines.append(f"recurring {p['id']}: never solved, scored by {p['scored_by']}; {verifiers.JUDGE} agrees")
                continue
            f = p["first_passing"]
            lines.append(
                f"recurring {p['id']}: recorded as never solved by {p['scored_by']}; {verifiers.JUDGE} accepts "
                f"{p['passing_now']} of its {p['attempts']:,} attempts, the first ({f['answer']!r}, attempt {f['attempt']}) "
                f"after {f['tokens_spent']:,} of its {p['baseline_tokens']:,} tokens"
            )
    return lines, summary
