"""`python -m eval.gsm_report WORK`: the benchmark results file (docs/eval/gsm-results.json) from a run's records
(eval/gsm_run.py), every verdict and figure computed here by the current judge; and the labelling exports.

The file is compact: one line per record. `replay-eval` re-checks it (eval/gsm_recheck.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from eval import benchmark, gsm, gsm_recheck, gsm_recurring

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "eval" / "gsm-results.json"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def build(work: Path, budget: int | None, seed: int = 0) -> dict:
    outs = benchmark.read_jsonl(work / "outputs.jsonl")
    for r in outs:
        r["ok"] = benchmark.score(r)["ok"]
        r.pop("seconds", None)  # wall time under a shared machine: not part of the replayable record
    outs.sort(key=lambda r: (r["set"], r["id"], r["condition"]))
    deposits = benchmark.read_jsonl(work / "deposits.jsonl")
    answered = {s: sorted({r["template"] for r in outs if r["set"] == s}) for s in gsm.SETS}
    meta = json.loads((work / "model.json").read_text(encoding="utf-8"))
    results = {
        "format": gsm_recheck.FORMAT,
        "benchmark": {
            "package": gsm.PACKAGE,
            "version": gsm.version(),
            "license": "MIT",
            "language": gsm.LANGUAGE,
            "seed": seed,
            "items": {s: len(t) for s, t in answered.items()},
            "templates": answered,
            "source": "GSM8K test problems (id_orig) through the GSM-Symbolic templates the package ships",
        },
        "model": meta,
        "judge": {"sha256": gsm_recheck.judge_sha256(), "commit": _commit(), "function": "verifiers.judge"},
        "config": {
            "prompt": "lm-evaluation-harness gsm8k-cot: 8 chain-of-thought exemplars (Wei et al. 2022), Q:/A: format",
            "form": benchmark.FORM,
            "max_new_tokens": benchmark.MAX_NEW_TOKENS,
            "stop": "before the next question ('Q:' or a blank line), or end of text",
            "decoding": "greedy",
            "answers_at_once": benchmark.THREADS,
            "retrieval": "the product's own (k=3, DEFAULT_THRESHOLD, relevance stage); nothing forced",
        },
        "deposits": deposits,
        "outputs": outs,
    }
    verdicts = {benchmark.key(r): r["ok"] for r in outs}
    results["scores"] = benchmark.summarise(outs, verdicts)
    if budget is not None:
        path = work / f"recurring-b{budget}-s{seed}.jsonl"
        problems = benchmark.read_jsonl(path)
        for p in problems:
            cfg = p.pop("config")
            for a in p["attempts"]:
                a["passed"] = gsm_recheck._ok(p, a["answer"])
            p["solved"] = any(a["passed"] for a in p["attempts"])
            p["attempts_sha256"] = gsm_recurring.attempts_sha256(p["attempts"])
            p.pop("seconds", None)
        if problems:
            recalls = {r["id"]: r for r in outs if r["condition"] == "graft" and r["set"] == "original"}
            dep = {d["id"]: d for d in deposits}
            results["recurring"] = {
                "config": cfg,
                "problems": problems,
                "case": gsm_recurring.summarise(problems, recalls, dep, cfg, gsm_recheck._ok),
            }
    return results


def dumps(results: dict) -> str:
    """Top-level keys one per line, lists of records one record per line."""
    lines = ["{"]
    keys = list(results)
    for i, k in enumerate(keys):
        v = results[k]
        end = "," if i < len(keys) - 1 else ""
        if isinstance(v, list):
            body = ",\n".join("  " + json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in v)
            lines.append(f"{json.dumps(k)}: [\n{body}\n]{end}")
        elif k == "recurring":
            inner = {**v}
            probs = inner.pop("problems")
            body = ",\n".join("  " + json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in probs)
            head = json.dumps(inner, ensure_ascii=False, separators=(",", ":"))[:-1]
            lines.append(f'{json.dumps(k)}: {head},"problems":[\n{body}\n]}}{end}')
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export(work: Path, scratch: Path) -> tuple[int, int]:
    """The labelling exports for the judge's labelled set: no-graft and grafted outputs, one JSON object a line."""
    outs = benchmark.read_jsonl(work / "outputs.jsonl")
    keep = ("answer", "question", "verifier", "reference", "id", "seed", "set", "condition", "output_sha256")
    n = {}
    for cond, name in (("no-graft", "gsm-cot-outputs.jsonl"), ("graft", "gsm-graft-outputs.jsonl")):
        rows = [{k: r[k] for k in keep} for r in outs if r["condition"] == cond]
        tmp = scratch / (name + ".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, scratch / name)
        n[cond] = len(rows)
    return n["no-graft"], n["graft"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("work", type=Path)
    p.add_argument("--budget", type=int, default=None, help="the recurring run's budget (its records file)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--export", type=Path, default=None, help="write the labelling exports into this folder only")
    args = p.parse_args(argv)
    if args.export is not None:
        print("exported (no-graft, graft):", export(args.work, args.export))
        return 0
    results = build(args.work, args.budget)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(dumps(results), encoding="utf-8")
    os.replace(tmp, args.out)
    print(json.dumps({"scores": results["scores"], "recurring": (results.get("recurring") or {}).get("case")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
