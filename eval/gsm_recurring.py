"""The paper's recurring case on the benchmark's originals, honestly counted: problems the model does not solve
within a stated budget of cot attempts (greedy, then seeded sampled rounds), then answered from the library.

The baseline of a problem is its greedy no-graft record of the eval (eval/benchmark.py) followed by rounds of
`together` sampled attempts (eval/sampling.sample_many: one prompt computation per round, every attempt's own
seeded draws) until one passes the one judge or the budget is spent; every token computed is counted. The
recall is the eval's graft-condition record of the same original (retrieval + relevance chose the artifact;
nothing forced). The case takes the originals the greedy attempt failed and whose worked solution the gate
accepted (nothing else can be recalled), in a seeded order, never chosen by the length of their answers; the
recalls' decode tokens are reported one by one.

`summarise` is pure: replay recomputes every total and both ratios from the stored records. Each record carries
`question`, `verifier`, `reference` and every attempt's `answer`, so the current judge re-scores it.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass

import verifiers
from eval import benchmark


@dataclass(frozen=True)
class CaseConfig:
    budget: int  # tokens per problem: every prompt and decode token of every attempt, the greedy one included
    together: int = 8  # sampled attempts per round (one prompt computation)
    temperature: float = 0.8
    seed: int = 0
    max_new_tokens: int = benchmark.MAX_NEW_TOKENS
    recalls: int = 10  # the deposit's cost is amortised over this many recalls in ratio_all_in
    form: str = benchmark.FORM  # the query form of every attempt and of the recall (graft_core.templates.FORMS)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


ATTEMPT_KEYS = ("mode", "seed", "tokens", "prompt_tokens", "decode_tokens", "output_sha256", "answer", "passed")


def attempts_sha256(attempts: list[dict]) -> str:
    keep = [{k: a[k] for k in ATTEMPT_KEYS} for a in attempts]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def order(failed_ids: list[str], seed: int) -> list[str]:
    """The greedy failures in a seeded order (sorted first, so the order depends on the seed alone)."""
    ids = sorted(failed_ids)
    random.Random(seed).shuffle(ids)
    return ids


def _passes(row: dict):
    return lambda text: bool(verifiers.judge(text, row["verifier"], row["reference"], row["question"]).ok)


def baseline(lib, greedy: dict, cfg: CaseConfig, batcher, earlier: dict | None = None) -> dict:
    """The greedy record, then seeded sampled rounds within what is left of the budget. With `earlier` (a record
    of the same problem whose attempts no longer pass the current judge and stop short of the budget: its run's
    judge accepted one the current one refuses), its attempts are kept, re-judged, and sampling goes on from the
    next seed with what is left: the rounds an uninterrupted run would have computed next (same seeds, same
    round sizes: `sample_many` sizes a round by what is left of the budget)."""
    from eval import sampling
    from graft_core.generate import tokens_sha256

    t0 = time.perf_counter()
    passes = _passes(greedy)
    if earlier is not None:
        atts = [{**a, "passed": passes(a["answer"])} for a in earlier["attempts"]]
        seeds = [a["seed"] for a in atts if a["mode"] == "sampled"]
        start = max(seeds) + 1 if seeds else cfg.seed
    else:
        g_tokens = greedy["computed_tokens"] + greedy["decode_tokens"]
        atts = [
            {
                "mode": "greedy",
                "seed": None,
                "tokens": g_tokens,
                "prompt_tokens": greedy["computed_tokens"],
                "decode_tokens": greedy["decode_tokens"],
                "output_sha256": greedy["output_sha256"],
                "answer": greedy["answer"],
                "passed": passes(greedy["answer"]),
            }
        ]
        start = cfg.seed
    if not any(a["passed"] for a in atts):
        run = sampling.sample_many(
            lib.lm,
            greedy["question"],
            cfg.budget - sum(a["tokens"] for a in atts),
            passes,
            together=cfg.together,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=start,
            batcher=batcher,
            form=cfg.form,
        )
        for r in run.rounds:
            for k, a in enumerate(r.attempts):
                prompt = r.prompt_tokens if k == 0 else 0
                atts.append(
                    {
                        "mode": "sampled",
                        "seed": a.seed,
                        "tokens": prompt + a.decode_tokens,
                        "prompt_tokens": prompt,
                        "decode_tokens": a.decode_tokens,
                        "output_sha256": tokens_sha256(a.token_ids),
                        "answer": a.text,
                        "passed": a.passed,
                    }
                )
    out = {
        **{k: greedy[k] for k in ("id", "question", "verifier", "reference")},
        "budget": cfg.budget,
        "baseline_tokens": sum(a["tokens"] for a in atts),
        "attempts_n": len(atts),
        "solved": any(a["passed"] for a in atts),
        "attempts": atts,
        "attempts_sha256": attempts_sha256(atts),
        "judge": verifiers.JUDGE,  # the rule set that decided when sampling stopped
        "seconds": round(time.perf_counter() - t0 + (earlier or {}).get("seconds", 0), 1),
    }
    if earlier is not None:  # where the first run stopped, and under which judge it did
        out["resumed_after"] = {"attempts": len(earlier["attempts"]), "judge": earlier.get("judge")}
    return out


def summarise(problems: list[dict], recalls: dict[str, dict], deposits: dict[str, dict], cfg: dict, judge_ok) -> dict:
    """Both ratios over the never-solved problems whose original's solution the gate accepted and whose recall
    the judge accepts (the totals are theirs; every case problem is listed in `rows`). `judge_ok(row,
    answer)` is the one judge (recomputed: a stored `passed` is not trusted); `recalls` maps id -> the graft
    record, `deposits` id -> the gate's record."""
    unsolved = [p for p in problems if not any(judge_ok(p, a["answer"]) for a in p["attempts"])]
    # never solved = no attempt passes AND the budget was spent (no further round fitted); a run that stopped at
    # an attempt its judge accepted and the current judge refuses is undecided: listed, in no total
    never = [p for p in unsolved if exhausted(p, cfg)]
    undecided = [p["id"] for p in unsolved if not exhausted(p, cfg)]
    rows = []
    for p in never:
        r, d = recalls.get(p["id"]), deposits.get(p["id"])
        if r is None or d is None or d.get("verdict") != "accepted":
            continue
        deposit_cost = d["gate_tokens"] + d["prefill_tokens"]
        rows.append(
            {
                "id": p["id"],
                "baseline_tokens": p["baseline_tokens"],
                "attempts": p["attempts_n"],
                "recall_correct": judge_ok(r, r["answer"]),
                "recall_grafted": bool(r["artifact_ids"]),
                "recall_decode_tokens": r["decode_tokens"],
                "recall_prompt_tokens": r["computed_tokens"],
                "deposit_tokens": deposit_cost,
            }
        )
    right = [x for x in rows if x["recall_correct"]]  # a ratio counts only what the recall got right
    base = sum(x["baseline_tokens"] for x in right)
    dec = sum(x["recall_decode_tokens"] for x in right)
    every = sum(x["recall_prompt_tokens"] + x["recall_decode_tokens"] for x in right)
    dep = sum(x["deposit_tokens"] for x in right)
    all_in = every + dep / cfg["recalls"]
    # a sceptic's charge: every deposit offered (the refused ones' gate runs too) laid on the problems recalled
    offered = sum(d.get("gate_tokens", 0) + d.get("prefill_tokens", 0) for d in deposits.values())
    unrecorded = sum(1 for d in deposits.values() if "gate_tokens" not in d)
    all_in_offered = every + offered / cfg["recalls"]
    return {
        "problems_tried": len(problems),
        "solved_within_budget": len(problems) - len(unsolved),
        "never_solved": len(never),
        "undecided": undecided,
        "case_problems": len(rows),
        "recalled_correctly": sum(1 for x in rows if x["recall_correct"]),
        "baseline_tokens_total": base,
        "recall_decode_tokens_total": dec,
        "recall_tokens_total": every,
        "deposit_tokens_total": dep,
        "amortised_over_recalls": cfg["recalls"],
        "ratio": round(base / dec, 1) if dec else None,
        "ratio_all_in": round(base / all_in, 2) if all_in else None,
        "deposits_offered": len(deposits),
        "deposits_cost_unrecorded": unrecorded,
        "deposit_tokens_offered_total": offered,
        "ratio_all_in_offered": round(base / all_in_offered, 2) if right and all_in_offered else None,
        "ratio_at_budget": {
            str(b): round(sum(_within(p, b) for p in never if p["id"] in {x["id"] for x in right}) / dec, 1)
            for b in BUDGETS
            if dec and b <= cfg["budget"]
        },
        "rows": rows,
    }


def exhausted(problem: dict, cfg: dict) -> bool:
    """Whether the problem's attempts spent its budget: the next round (its prompt and one attempt of
    `max_new_tokens`) would not have fitted, as `eval.sampling.sample_many` decides."""
    sampled = [a for a in problem["attempts"] if a["mode"] == "sampled"]
    prompt = sampled[0]["prompt_tokens"] if sampled else 0
    return problem["budget"] - problem["baseline_tokens"] - prompt < cfg["max_new_tokens"]


BUDGETS = (4_000, 10_000, 25_000, 50_000)  # the paper's ratio recomputed as if the budget had been each of these


def _within(problem: dict, budget: int) -> int:
    """The baseline tokens of a never-solved problem's attempts that fit in `budget`, in their order: a
    never-solved problem's baseline is its budget, so the ratio is set by the budget chosen."""
    spent = 0
    for a in problem["attempts"]:
        if spent + a["tokens"] > budget:
            break
        spent += a["tokens"]
    return spent
