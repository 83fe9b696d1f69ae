"""The paper's recurring case at our scale: problems the no-graft model fails within a stated sampling
budget (every token counted), then answered from the verified library for a handful of decode tokens;
and, for problems the model does solve by sampling, the discovery cost against the recall cost.

Talks to the product only through `services.Library` (solve, deposit_item, answer). `summarise_case`
is pure so that replay recomputes every total and the ratio from the stored per-problem rows.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from errors import VerificationFailed
from services.solve import judge

# Templates whose answers are short integers: a recalled answer is " NN\n" (4 decode tokens).
TEMPLATES = ("ages", "trains_meeting", "inventory_week", "round_trip_speed")


@dataclass(frozen=True)
class RecurringConfig:
    problems: int = 8  # failed problems wanted
    budget: int = 4096  # sampling budget per problem (prompt + decode tokens, every attempt)
    max_candidates: int = 14  # problems tried at most (the model solves some)
    max_digits: int = 2  # answers of at most this many digits (recall in <= max_digits + 2 tokens)
    temperature: float = 0.8
    seed: int = 0
    max_new_tokens: int = 16  # per attempt: one answer line

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def candidates(problems: list[dict], cfg: RecurringConfig) -> list[dict]:
    """Integer-answer problems of the short-answer templates, in a seeded order."""
    rows = [p for p in problems if p["template"] in TEMPLATES and p["answer"].isdigit() and len(p["answer"]) <= cfg.max_digits]
    rows.sort(key=lambda p: p["id"])
    random.Random(cfg.seed).shuffle(rows)
    return rows[: cfg.max_candidates]


def attempts_sha256(attempts: list[dict]) -> str:
    """SHA-256 of the canonical JSON of the attempt records (mode, seed, temperature, tokens, output hash)."""
    keep = [{k: a[k] for k in ("mode", "seed", "temperature", "tokens", "output_sha256", "answer", "passed")} for a in attempts]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _recall(lib, row: dict) -> dict:
    res = lib.answer(row["question"], max_new_tokens=8, record=False)
    ok, detail = judge(row["verifier"], res.answer, row["reference"])
    return {
        "answer": res.answer,
        "correct": ok,
        "detail": detail,
        "artifact_ids": list(res.artifact_ids),
        "decode_tokens": res.decode_tokens,
        "computed_tokens": res.computed_tokens,
        "output_token_ids": list(res.output_token_ids),
        "output_sha256": res.output_sha256,
    }


def run_case(lib, problems: list[dict], cfg: RecurringConfig, log: Callable[[str], None] = print) -> dict:
    """Baseline every candidate with nothing grafted (until `cfg.problems` failures), then deposit the
    failed ones' verified solutions through the gate and recall each; recall the solved ones too."""
    failed, solved = [], []
    for row in candidates(problems, cfg):
        if len(failed) >= cfg.problems:
            break
        s = lib.solve(
            row["question"],
            row["verifier"],
            row["reference"],
            budget=cfg.budget,
            seed=cfg.seed,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            library=False,
        )
        atts = [a.to_json() for a in s.attempts]
        rec = {
            "id": row["id"],
            "template": row["template"],
            "reference": row["reference"],
            "verifier": row["verifier"],
            "baseline_tokens": s.tokens_spent,
            "baseline_attempts": len(atts),
            "baseline_solved": s.solved,
            "baseline_answer": s.answer,
            "attempts_sha256": attempts_sha256(atts),
            "attempts": atts,
        }
        (solved if s.solved else failed).append(rec)
        log(f"recurring: {row['id']} {'solved' if s.solved else 'failed'} after {len(atts)} attempts, {s.tokens_spent} tokens")
    accepted = 0
    for rec, row in [(r, _row(problems, r["id"])) for r in failed]:
        try:
            lib.deposit_item(row["question"], row["solution"], row["answer"], row["verifier"], row["reference"])
            rec["deposit"] = "accepted"
            accepted += 1
        except VerificationFailed as e:
            rec["deposit"] = f"refused: {e}"
            continue
        rec["grafted"] = _recall(lib, row)
    for rec in solved:
        rec["grafted"] = _recall(lib, _row(problems, rec["id"]))
    return {"config": cfg.as_dict(), "failed": failed, "solved_by_sampling": solved, **summarise_case(failed, solved, cfg.budget)}


def _row(problems: list[dict], pid: str) -> dict:
    return next(p for p in problems if p["id"] == pid)


def summarise_case(failed: list[dict], solved: list[dict], budget: int) -> dict:
    """The `recurring_case` object and the payback rows, from the per-problem records alone."""
    grafted = [r["grafted"] for r in failed if "grafted" in r]
    base = sum(r["baseline_tokens"] for r in failed)
    dec = sum(g["decode_tokens"] for g in grafted)
    case = {
        "problems": len(failed),
        "budget_tokens_per_problem": budget,
        "baseline_tokens_total": base,
        "baseline_solved": sum(1 for r in failed if r["baseline_solved"]),
        "grafted_decode_tokens_total": dec,
        "grafted_solved": sum(1 for g in grafted if g["correct"]),
        "ratio": round(base / dec, 1) if dec else None,
    }
    payback = [
        {
            "id": r["id"],
            "discovery_tokens": r["baseline_tokens"],
            "discovery_attempts": r["baseline_attempts"],
            "recall_tokens": r["grafted"]["computed_tokens"] + r["grafted"]["decode_tokens"],
            "recall_decode_tokens": r["grafted"]["decode_tokens"],
            "recall_correct": r["grafted"]["correct"],
        }
        for r in solved
        if "grafted" in r
    ]
    accepted = sum(1 for r in failed if r.get("deposit") == "accepted")
    return {
        "recurring_case": case,
        "payback": payback,
        "acceptance": {
            "accepted": accepted,
            "offered": len(failed),
            "rate": round(accepted / len(failed), 4) if failed else None,
        },
    }


def check_case(case: dict, rows: dict[str, dict]) -> tuple[list[str], int]:
    """Offline re-check of a stored case (replay-eval): attempt hashes and token sums, grafted output
    hashes and decode counts, verdicts re-scored against the data file, and every total and the ratio
    recomputed. Returns (problems found, items checked)."""
    from graft_core.generate import tokens_sha256

    bad, n = [], 0
    for rec in [*case["failed"], *case["solved_by_sampling"]]:
        where = f"recurring {rec['id']}"
        n += 1
        if attempts_sha256(rec["attempts"]) != rec["attempts_sha256"]:
            bad.append(f"{where}: attempt records hash differently from the recorded attempts_sha256")
        if sum(a["tokens"] for a in rec["attempts"]) != rec["baseline_tokens"]:
            bad.append(f"{where}: attempt tokens do not sum to the recorded baseline_tokens")
        if rec["baseline_tokens"] > case["config"]["budget"]:
            bad.append(f"{where}: {rec['baseline_tokens']} tokens spent exceed the {case['config']['budget']}-token budget")
        row = rows.get(rec["id"])
        if row is None:
            bad.append(f"{where}: not in the data file")
            continue
        for a in rec["attempts"]:
            if judge(row["verifier"], a["answer"], row["reference"])[0] != a["passed"] and "gate refused" not in a["detail"]:
                bad.append(f"{where}: attempt answer {a['answer']!r} re-scores differently")
        g = rec.get("grafted")
        if g is None:
            continue
        if tokens_sha256(g["output_token_ids"]) != g["output_sha256"] or len(g["output_token_ids"]) != g["decode_tokens"]:
            bad.append(f"{where}: grafted output token ids do not match their hash or decode count")
        if judge(row["verifier"], g["answer"], row["reference"])[0] != g["correct"]:
            bad.append(f"{where}: grafted answer {g['answer']!r} re-scores differently")
    again = summarise_case(case["failed"], case["solved_by_sampling"], case["config"]["budget"])
    for k in ("recurring_case", "payback", "acceptance"):
        if json.dumps(again[k], sort_keys=True) != json.dumps(case[k], sort_keys=True):
            bad.append(f"recurring case: {k} recomputed from the rows differs from the recorded one")
    return bad, n
