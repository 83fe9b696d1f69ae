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

import verifiers
from errors import VerificationFailed
from services import AnswerOptions

# Templates whose answers are short integers: a recalled answer is " NN\n" (4 decode tokens).
TEMPLATES = ("ages", "trains_meeting", "inventory_week", "round_trip_speed")


@dataclass(frozen=True)
class RecurringConfig:
    problems: int = 8  # failed problems answered from a gate-accepted verified solution, wanted
    budget: int = 4096  # sampling budget per problem (prompt + decode tokens, every attempt)
    max_candidates: int = 40  # problems tried at most (the model solves some; the gate refuses some solutions)
    max_digits: int = 2  # answers of at most this many digits (recall in <= max_digits + 2 tokens)
    temperature: float = 0.8
    seed: int = 0
    max_new_tokens: int = 16  # per attempt: one answer line
    batched: bool = False  # sample in rounds through the batched decode passes (eval/sampling.py), not via solve
    together: int = 8  # batched: attempts per round (one prompt computation, their steps in one pass)
    gate_first: bool = False  # offer each candidate's verified solution to the gate before sampling it: a refused
    # one is never sampled (the gate costs about a second, the paper's budget many minutes)

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
    res = lib.answer(row["question"], AnswerOptions(max_new_tokens=8, record=False))
    v = verifiers.judge(res.answer, row["verifier"], row["reference"], row["question"])
    ok, detail = v.ok, v.detail
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


BASELINE_KEYS = (
    "id",
    "template",
    "reference",
    "verifier",
    "baseline_tokens",
    "baseline_attempts",
    "baseline_solved",
    "baseline_answer",
    "attempts_sha256",
    "attempts",
)


def _baseline(lib, row: dict, cfg: RecurringConfig, batcher=None) -> dict:
    """The no-graft model on one problem: greedy, then seeded samples, until solved or the budget is spent."""
    if cfg.batched:
        return _record(row, _batched_attempts(lib, row, cfg, batcher))
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
    return _record(row, [a.to_json() for a in s.attempts])


def _record(row: dict, atts: list[dict]) -> dict:
    return {
        "id": row["id"],
        "template": row["template"],
        "reference": row["reference"],
        "verifier": row["verifier"],
        "baseline_tokens": sum(a["tokens"] for a in atts),
        "baseline_attempts": len(atts),
        "baseline_solved": any(a["passed"] for a in atts),
        "baseline_answer": next((a["answer"] for a in atts if a["passed"]), ""),
        "judge": verifiers.JUDGE,
        "attempts_sha256": attempts_sha256(atts),
        "attempts": atts,
    }


def _batched_attempts(lib, row: dict, cfg: RecurringConfig, batcher) -> list[dict]:
    """Greedy alone (as solve starts), then seeded rounds of `cfg.together` attempts decoded together
    (eval/sampling.py) within what is left of the budget. A round's prompt is computed once: its tokens are
    counted on the round's first attempt (`prompt_tokens`), every attempt's decode tokens on the attempt."""
    from eval import sampling as batched
    from graft_core import sampling
    from graft_core.generate import tokens_sha256

    q, verifier, reference = row["question"], row["verifier"], row["reference"]
    g = sampling.attempt(lib.lm, q, min(cfg.max_new_tokens, cfg.budget - sampling.prompt_tokens(lib.lm, q)))
    v = verifiers.judge(g.text, verifier, reference, q)
    ok, detail = v.ok, v.detail
    first = {"mode": "greedy", "seed": None, "temperature": 0.0, "tokens": g.tokens_computed, "prompt_tokens": g.prompt_tokens}
    atts = [{**first, "output_sha256": tokens_sha256(g.token_ids), "answer": g.text, "passed": ok, "detail": detail}]
    if ok:
        return atts
    run = batched.sample_many(
        lib.lm,
        q,
        cfg.budget - g.tokens_computed,
        lambda text: verifiers.judge(text, verifier, reference, q).ok,
        together=cfg.together,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        batcher=batcher,
    )
    for r in run.rounds:
        for k, a in enumerate(r.attempts):
            prompt = r.prompt_tokens if k == 0 else 0
            atts.append(
                {
                    "mode": "sampled",
                    "seed": a.seed,
                    "temperature": cfg.temperature,
                    "tokens": prompt + a.decode_tokens,
                    "prompt_tokens": prompt,
                    "output_sha256": tokens_sha256(a.token_ids),
                    "answer": a.text,
                    "passed": a.passed,
                    "detail": verifiers.judge(a.text, verifier, reference, q).detail,
                }
            )
    return atts


def reusable(previous: dict | None, cfg: RecurringConfig) -> dict[str, dict]:
    """Baseline records of an earlier run of the same configuration whose attempt records still hash to
    their `attempts_sha256` and sum to their token count (the sampling is seeded, so a re-run computes
    the same records; `replay-eval --rerun` re-checks that). Anything else is computed again."""
    same = ("budget", "temperature", "seed", "max_new_tokens", "max_digits", "batched", "together")  # a record depends on these
    defaults = {"batched": False, "together": 8}  # records from before batching was a setting
    if not previous or any(previous.get("config", {}).get(k, defaults.get(k)) != getattr(cfg, k) for k in same):
        return {}
    return {  # with the wall time the sampling took then, where recorded (not part of the hashed records)
        rec["id"]: {k: rec[k] for k in (*BASELINE_KEYS, "baseline_s") if k in rec}
        for rec in [*previous["failed"], *previous["solved_by_sampling"]]
        if not baseline_problems(rec, cfg.budget)
    }


def baseline_problems(rec: dict, budget: int) -> list[str]:
    """What is wrong with one stored baseline record: attempts that no longer hash to `attempts_sha256`,
    tokens that do not sum to `baseline_tokens`, a spend over the budget (empty: the record stands)."""
    where, bad = f"recurring {rec['id']}", []
    if attempts_sha256(rec["attempts"]) != rec["attempts_sha256"]:
        bad.append(f"{where}: attempt records hash differently from the recorded attempts_sha256")
    if sum(a["tokens"] for a in rec["attempts"]) != rec["baseline_tokens"]:
        bad.append(f"{where}: attempt tokens do not sum to the recorded baseline_tokens")
    if rec["baseline_tokens"] > budget:
        bad.append(f"{where}: {rec['baseline_tokens']} tokens spent exceed the {budget}-token budget")
    return bad


def concluding_line(solution: str) -> str | None:
    """The last line of a worked solution that states its result ("In total: 36 + 48 = 84 minutes ..."),
    skipping a bare "Answer: N" line; None for a one-line solution (nothing shorter to offer)."""
    lines = [x.strip() for x in solution.strip().splitlines() if x.strip() and not x.strip().lower().startswith("answer:")]
    return lines[-1] if len(lines) > 1 else None


def deposit_verified(lib, row: dict) -> tuple[list[dict], bool]:
    """The problem's verified solution through the deposit gate: the worked solution first; when the model
    cannot answer from it (refused), its concluding line, which states the result. Every try is recorded."""
    tries = []
    for form, solution in (("worked solution", row["solution"]), ("concluding line", concluding_line(row["solution"]))):
        if solution is None:
            continue
        try:
            d = lib.deposit_item(row["question"], solution, row["answer"], row["verifier"], row["reference"])
        except VerificationFailed as e:
            tries.append({"form": form, "verdict": "refused", "detail": str(e)})
            continue
        tries.append({"form": form, "verdict": "accepted", "artifact": d.id})
        return tries, True
    return tries, False


def run_case(
    lib,
    problems: list[dict],
    cfg: RecurringConfig,
    log: Callable[[str], None] = print,
    reuse: dict[str, dict] | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Baseline each candidate with nothing grafted (records in `reuse` are taken instead of recomputed);
    offer each failed one's verified solution to the deposit gate, until `cfg.problems` failed problems
    have an accepted solution (the refused ones are kept and counted: the acceptance rate); then recall
    every accepted one from the library, and the ones the model solved by sampling too. With `cfg.gate_first`
    the gate comes first: a candidate whose solution it refuses is recorded in `gate_refused` and not sampled.
    `progress` gets the baseline records so far after each one (`reusable` reads them: a long run resumes)."""
    import time

    failed, solved, reused, refused = [], [], [], []
    batcher = None
    if cfg.batched:
        from graft_core.batch import WIDTHS, Batcher

        # Batcher keeps only the widths it checks (under fma16 every row is its own: any width)
        batcher = Batcher(lib.lm.model, widths=tuple(sorted({*WIDTHS, cfg.together})))
    for row in candidates(problems, cfg):
        if sum(1 for r in failed if r["deposit"] == "accepted") >= cfg.problems:
            break
        tries = None
        if cfg.gate_first:
            tries, ok = deposit_verified(lib, row)
            if not ok:
                refused.append(
                    {k: row[k] for k in ("id", "template", "reference", "verifier")}
                    | {"deposit_tries": tries, "deposit": f"refused: {tries[-1]['detail']}"}
                )
                log(f"recurring: {row['id']} gate refused its verified solution; not sampled")
                continue
        t0 = time.perf_counter()
        rec = (reuse or {}).get(row["id"])
        if rec is not None:
            reused.append(row["id"])
        else:
            rec = _baseline(lib, row, cfg, batcher)
        seconds = rec["baseline_s"] if row["id"] in reused and "baseline_s" in rec else time.perf_counter() - t0
        rec["baseline_s"] = round(seconds, 1)
        (solved if rec["baseline_solved"] else failed).append(rec)
        if progress is not None:
            progress({"config": cfg.as_dict(), "failed": failed, "solved_by_sampling": solved})
        if tries is not None:
            rec["deposit_tries"], rec["deposit"] = tries, "accepted"
        elif not rec["baseline_solved"]:
            rec["deposit_tries"], ok = deposit_verified(lib, row)
            rec["deposit"] = "accepted" if ok else f"refused: {rec['deposit_tries'][-1]['detail']}"
        log(
            f"recurring: {row['id']} {'solved' if rec['baseline_solved'] else 'failed'} after {rec['baseline_attempts']} "
            f"attempts, {rec['baseline_tokens']} tokens{' (reused, hash-checked)' if rec['id'] in reused else ''}, "
            f"{seconds:.0f} s ({rec['baseline_tokens'] / max(seconds, 1e-9):.0f} tok/s); "
            f"{sum(1 for r in failed if r['deposit'] == 'accepted')}/{cfg.problems} problems"
        )
    for rec in failed:  # recalled once the whole library is deposited: the recurring questions come later
        if rec["deposit"] == "accepted":
            rec["grafted"] = _recall(lib, _row(problems, rec["id"]))
    for rec in solved:
        row = _row(problems, rec["id"])
        if "deposit_tries" not in rec and (rec["id"] in reused or cfg.batched):
            # `solve` deposited the passing answer; these records do it here (gate first: the verified solution is in)
            passing = next(a for a in rec["attempts"] if a["passed"])
            try:
                lib.deposit_item(row["question"], passing["answer"], passing["answer"], row["verifier"], row["reference"])
            except VerificationFailed as e:
                rec["deposit"] = f"refused: {e}"
        rec["grafted"] = _recall(lib, row)
    return {
        "config": cfg.as_dict(),
        "baseline_reused": reused,
        "failed": failed,
        "solved_by_sampling": solved,
        "gate_refused": refused,
        "sampling_s": round(sum(r.get("baseline_s", 0.0) for r in [*failed, *solved]), 1),
        **summarise_case(failed, solved, cfg.budget, refused),
    }


def _row(problems: list[dict], pid: str) -> dict:
    return next(p for p in problems if p["id"] == pid)


def summarise_case(failed: list[dict], solved: list[dict], budget: int, refused: list[dict] = ()) -> dict:
    """The `recurring_case` object and the payback rows, from the per-problem records alone."""
    # The case's problems: failed within the budget, verified solution accepted by the gate, asked again.
    # The failures whose solution the gate refused are counted in `failed_offered` and the acceptance.
    cases = [r for r in failed if "grafted" in r]
    dec = sum(r["grafted"]["decode_tokens"] for r in cases)
    base = sum(r["baseline_tokens"] for r in cases)
    case = {
        "problems": len(cases),
        "budget_tokens_per_problem": budget,
        "baseline_tokens_total": base,
        "baseline_solved": sum(1 for r in cases if r["baseline_solved"]),
        "grafted_decode_tokens_total": dec,
        "grafted_solved": sum(1 for r in cases if r["grafted"]["correct"]),
        "ratio": round(base / dec, 1) if dec else None,
        "failed_offered": len(failed),
        "baseline_tokens_all_failed": sum(r["baseline_tokens"] for r in failed),
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
    # Offered: every problem whose verified solution went to the gate (the failures; with the gate first, every
    # candidate: the refused ones were never sampled, the accepted ones solved by sampling count too).
    offered = [r for r in [*failed, *solved, *refused] if "deposit_tries" in r]
    accepted = sum(1 for r in offered if r.get("deposit") == "accepted")
    first = sum(1 for r in offered if r["deposit_tries"][0].get("verdict") == "accepted")
    return {
        "recurring_case": case,
        "payback": payback,
        "acceptance": {
            "accepted": accepted,
            "offered": len(offered),
            "rate": round(accepted / len(offered), 4) if offered else None,
            "accepted_as_worked_solution": first,
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
        bad.extend(baseline_problems(rec, case["config"]["budget"]))
        row = rows.get(rec["id"])
        if row is None:
            bad.append(f"{where}: not in the data file")
            continue
        same_judge = rec.get("judge") == verifiers.JUDGE  # another judge's verdicts: eval/rejudge.py reports them
        for a in rec["attempts"]:
            if (
                same_judge
                and verifiers.judge(a["answer"], row["verifier"], row["reference"], row["question"]).ok != a["passed"]
                and "gate refused" not in a["detail"]
            ):
                bad.append(f"{where}: attempt answer {a['answer']!r} re-scores differently")
        g = rec.get("grafted")
        if g is None:
            continue
        if tokens_sha256(g["output_token_ids"]) != g["output_sha256"] or len(g["output_token_ids"]) != g["decode_tokens"]:
            bad.append(f"{where}: grafted output token ids do not match their hash or decode count")
        if same_judge and verifiers.judge(g["answer"], row["verifier"], row["reference"], row["question"]).ok != g["correct"]:
            bad.append(f"{where}: grafted answer {g['answer']!r} re-scores differently")
    again = summarise_case(case["failed"], case["solved_by_sampling"], case["config"]["budget"], case.get("gate_refused", []))
    for k in ("recurring_case", "payback", "acceptance"):
        if json.dumps(again[k], sort_keys=True) != json.dumps(case[k], sort_keys=True):
            bad.append(f"recurring case: {k} recomputed from the rows differs from the recorded one")
    return bad, n
