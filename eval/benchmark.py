"""The eval conditions on the third-party benchmark (eval/gsm.py): no graft and graft, on the GSM8K originals,
names-only variants and new-numbers variants, one prompt, one budget rule and one judge for every condition.

Talks to the product only through `services.Library`: `deposit_item` (the real gate, for each original's
worked solution) and `answer` (graft off, or the product's own retrieval + relevance stage choosing what to
graft: nothing is forced), both in the `cot` query form (graft_core.templates: lm-evaluation-harness
gsm8k-cot's eight exemplars, up to MAX_NEW_TOKENS new tokens, stopping before the next question). Answers
run `THREADS` at once through the product's StepGroup (graft_core.batch: each answer's own bytes).

Every output record carries `answer`, `question`, `verifier`, `reference`, the output token ids and their
hash, so a verdict is recomputed from the record alone by `verifiers.judge` (`score`), and `summarise` is pure:
replay recomputes every figure from the stored records.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import verifiers
from services import AnswerOptions

FORM = "cot"
MAX_NEW_TOKENS = 256  # per attempt, every condition (the budget rule)
THREADS = 8  # answers at once (KVGRAFT_DECODE_TOGETHER's default and bound)
CONDITIONS = ("no-graft", "graft")
OUTPUT_KEYS = (
    "id",
    "set",
    "condition",
    "form",
    "template",
    "id_orig",
    "seed",
    "question",
    "verifier",
    "reference",
    "answer",
    "output_token_ids",
    "output_sha256",
    "computed_tokens",
    "decode_tokens",
    "grafted_tokens",
    "artifact_ids",
    "retrieved",
    "note",
)


def ask(lib, item: dict, condition: str) -> dict:
    """One greedy answer to `item` in the cot form, graft off or through retrieval + relevance."""
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {condition!r}")
    t0 = time.perf_counter()
    form = item.get("form", FORM)
    options = AnswerOptions(graft=condition == "graft", max_new_tokens=MAX_NEW_TOKENS, record=False, form=form)
    r = lib.answer(item["question"], options)
    return {
        **{k: item[k] for k in ("id", "set", "template", "id_orig", "seed", "question", "verifier", "reference")},
        "condition": condition,
        "form": form,
        "answer": r.answer,
        "output_token_ids": list(r.output_token_ids),
        "output_sha256": r.output_sha256,
        "computed_tokens": r.computed_tokens,
        "decode_tokens": r.decode_tokens,
        "grafted_tokens": r.grafted_tokens,
        "artifact_ids": list(r.artifact_ids),
        "retrieved": [{"id": h.id, "score": h.score, "relevant": h.relevant, "reason": h.reason} for h in r.retrieved],
        "note": r.note,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_jsonl(path: Path, row: dict) -> None:
    """One record per line, flushed and fsynced: a run that stops resumes from what is on disk."""
    import os

    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def key(row: dict) -> tuple[str, str]:
    return row["condition"], row["id"]


def run(lib, items: list[dict], condition: str, out: Path, log: Callable[[str], None] = print) -> list[dict]:
    """Answer every item not yet in `out` (THREADS at once), appending each record as it finishes."""

    done = {key(r) for r in read_jsonl(out)}
    todo = [it for it in items if (condition, it["id"]) not in done]
    return together(lib, todo, lambda it: [ask(lib, it, condition)], out, log)


def _answered(it: dict, row: dict) -> str:
    return (
        f"{row['condition']} {it['id']}: {'ok' if score(row)['ok'] else 'wrong'} ({row['decode_tokens']} decode, "
        f"{row['computed_tokens']} computed, {row['grafted_tokens']} grafted, {row['seconds']} s) {row['note']}"
    )


def together(
    lib,
    todo: list[dict],
    records: Callable[[dict], list[dict]],
    out: Path,
    log: Callable[[str], None],
    line: Callable[[dict, dict], str] = _answered,
) -> list[dict]:
    """`records(item)` for every item, THREADS at once through the product's StepGroup, each record appended to
    `out` and logged (`line(item, record)`: an answer's with the judge's verdict) as it finishes."""
    import threading

    lock, rows = threading.Lock(), []

    def one(it: dict) -> None:
        got = records(it)
        with lock:
            for row in got:
                append_jsonl(out, row)
                rows.append(row)
                log(line(it, row))

    lib.start_decoding_together()
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(one, todo))
    return rows


def latest_deposits(rows: list[dict]) -> list[dict]:
    """One record per offered item, its last: an item refused under an older judge is offered again (gsm_run
    deposit), and the gate's verdict under the current judge supersedes the earlier record."""
    last = {r["id"]: r for r in rows}
    return [r for r in rows if last[r["id"]] is r]


def deposit_all(lib, todo: list[dict], out: Path, log: Callable[[str], None]) -> list[dict]:
    """`deposit` every item, THREADS at once: the gates' answers decode in shared passes (the same tokens as one at
    a time, services.deposit), each record appended to `out` as its deposit returns. A record's `seconds` is its
    own wall time, beside the others'."""
    return together(
        lib,
        todo,
        lambda it: [deposit(lib, it)],
        out,
        log,
        line=lambda it, row: f"deposit {it['id']}: {row['verdict']} ({row['seconds']} s) {row.get('detail', '')[:160]}",
    )


def deposit(lib, item: dict) -> dict:
    """The item's worked solution through the real gate (its reference as the typed answer); the record says
    whether the gate accepted it, why not, and what it computed (gate runs, the deposit's own prefill)."""
    from errors import VerificationFailed

    t0 = time.perf_counter()
    row = {k: item[k] for k in ("id", "set", "template", "id_orig", "question", "verifier", "reference")}
    row["judge"] = verifiers.JUDGE  # the gate's verdict is this judge's (a refusal under another is offered again)
    try:
        d = lib.deposit_item(item["question"], item["solution"], item["reference"], item["verifier"], item["reference"])
    except VerificationFailed as e:
        out = {"verdict": "refused", "detail": str(e), "gate_tokens": e.gate_tokens}
        return row | out | {"seconds": round(time.perf_counter() - t0, 1)}
    return row | {
        "verdict": "accepted",
        "artifact": d.id,
        "tokens": d.tokens,
        "gate_tokens": d.gate_tokens,
        "prefill_tokens": d.prefill_tokens,
        "seconds": round(time.perf_counter() - t0, 1),
    }


# ---- scoring (pure) ---------------------------------------------------------------------------


def score(row: dict) -> dict:
    """The one judge's verdict on a stored record, recomputed from its answer, verifier, reference, question."""
    v = verifiers.judge(row["answer"], row["verifier"], row["reference"], row.get("question", ""))
    return {"ok": bool(v.ok), "value": getattr(v, "value", None), "detail": v.detail}


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score 95% interval of k successes in n."""
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def newcombe(k1: int, n1: int, k0: int, n0: int) -> tuple[float, float] | None:
    """Newcombe's hybrid score 95% interval (his method 10) of p1 - p0 from the two Wilson intervals."""
    a, b = wilson(k1, n1), wilson(k0, n0)
    if a is None or b is None:
        return None
    p1, p0 = k1 / n1, k0 / n0
    d = p1 - p0
    lo = d - math.sqrt((p1 - a[0]) ** 2 + (b[1] - p0) ** 2)
    hi = d + math.sqrt((a[1] - p1) ** 2 + (p0 - b[0]) ** 2)
    return round(lo, 4), round(hi, 4)


def _listed(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else list(interval)  # as JSON reads it back


def summarise(rows: list[dict], verdicts: dict[tuple[str, str], bool]) -> dict:
    """Accuracy with its Wilson interval per (set, condition) over the items both conditions answered, and the
    lift (graft minus no graft) with Newcombe's interval; `verdicts` maps key(row) to the judge's ok."""
    by = {key(r): r for r in rows}
    out = {}
    for s in sorted({r["set"] for r in rows}):
        ids = sorted({r["id"] for r in rows if r["set"] == s})
        both = [i for i in ids if all((c, i) in by for c in CONDITIONS)]
        cell = {"items": len(both)}
        for c in CONDITIONS:
            k = sum(1 for i in both if verdicts[(c, i)])
            dec = [by[(c, i)]["decode_tokens"] for i in both]
            cell[c] = {
                "correct": k,
                "accuracy": round(k / len(both), 4) if both else None,
                "wilson95": _listed(wilson(k, len(both))),
                "decode_tokens_total": sum(dec),
                "computed_tokens_total": sum(by[(c, i)]["computed_tokens"] for i in both),
                "grafted": sum(1 for i in both if by[(c, i)]["artifact_ids"]),
            }
        g, n = cell["graft"]["correct"], cell["no-graft"]["correct"]
        diff = newcombe(g, len(both), n, len(both))
        cell["lift"] = {
            "value": round((g - n) / len(both), 4) if both else None,
            "newcombe95": _listed(diff),
            "there": None
            if diff is None
            else ("yes" if diff[0] > 0 else "no (the interval includes 0)" if diff[1] >= 0 else "negative"),
        }
        out[s] = cell
    return out
