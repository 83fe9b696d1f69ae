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


def build(work: Path, budgets: dict[str, int] | None, seed: int = 0) -> dict:
    """The results from `work`'s records; `budgets` maps a recurring form (cot, qa) to the budget of its records
    file (a form left out is not reported)."""
    outs = benchmark.read_jsonl(work / "outputs.jsonl")
    for r in outs:
        r["ok"] = benchmark.score(r)["ok"]
        r.pop("seconds", None)  # wall time under a shared machine: not part of the replayable record
    outs.sort(key=lambda r: (r["set"], r["id"], r["condition"]))
    deposits = benchmark.latest_deposits(benchmark.read_jsonl(work / "deposits.jsonl"))
    answered = {s: sorted({r["template"] for r in outs if r["set"] == s}) for s in sorted({r["set"] for r in outs})}
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
            "prompt": "lm-evaluation-harness gsm8k-cot: 8 chain-of-thought exemplars (Wei et al. 2022), Q:/A: format "
            "(set original-qa: the same Q:/A: line without the exemplars; set original-steps: that line with the answer "
            'opened by "Let\'s think step by step.", zero-shot chain of thought, Kojima et al. 2022; both conditions)',
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
    if budgets:
        from eval.gsm_run import recurring_file

        for form, key in (("cot", "recurring"), ("qa", "recurring_qa")):
            if form not in budgets:
                continue
            case = _recurring(work / recurring_file(form, budgets[form], seed), outs, deposits, form)
            if case:
                results[key] = case
    return results


def _recurring(path: Path, outs: list[dict], deposits: list[dict], form: str) -> dict | None:
    problems = benchmark.read_jsonl(path)
    if not problems:
        return None
    for p in problems:
        cfg = p.pop("config")
        for a in p["attempts"]:
            a["passed"] = gsm_recheck._ok(p, a["answer"])
        p["solved"] = any(a["passed"] for a in p["attempts"])
        p["attempts_sha256"] = gsm_recurring.attempts_sha256(p["attempts"])
        p.pop("seconds", None)
    cfg.setdefault("form", form)
    recalls, dep = gsm_recheck.recalls(outs, cfg["form"]), gsm_recheck.deposits_by_problem(deposits, cfg["form"])
    out = {"config": cfg, "problems": problems, "case": gsm_recurring.summarise(problems, recalls, dep, cfg, gsm_recheck._ok)}
    if cfg["form"] == "cot":  # the same baseline, recalled in the product's zero-shot form (another prompt: said so)
        own = gsm_recheck.product_recalls(outs)
        out["case_product_recall"] = gsm_recurring.summarise(problems, own, dep, cfg, gsm_recheck._ok)
    return out


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
        elif k in gsm_recheck.RECURRING_KEYS:
            inner = {**v}
            probs = inner.pop("problems")
            body = ",\n".join("  " + json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in probs)
            head = json.dumps(inner, ensure_ascii=False, separators=(",", ":"))[:-1]
            lines.append(f'{json.dumps(k)}: {head},"problems":[\n{body}\n]}}{end}')
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


SET_LABELS = {
    "original": "GSM8K originals (recurring: the original's own worked solution is in the store)",
    "names": "names-only variants (every number kept; the original's solution in the store)",
    "numbers": "new numbers and names (held-out transfer: the store holds another instance's solution)",
    "original-qa": "GSM8K originals, zero-shot `Q:/A:` prompt (no exemplars: the graft sits right before the question)",
    "original-steps": "GSM8K originals, zero-shot chain of thought (`Q:/A: Let's think step by step.`: invited to "
    "reason, the graft right before the question)",
}


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ci(c) -> str:
    return "n/a" if c is None else f"{c[0]:.1%} to {c[1]:.1%}"


def markdown(results: dict) -> str:
    """docs/eval/README.md: every figure from the results file (no prose number typed by hand)."""
    b, cfg, sc = results["benchmark"], results["config"], results["scores"]
    deps = results["deposits"]
    acc = sum(1 for d in deps if d["verdict"] == "accepted")
    lines = [
        "# Evaluation on GSM8K (GSM-Symbolic templates): no graft vs graft",
        "",
        "Generated by `python -m eval.gsm_report` from [`gsm-results.json`](gsm-results.json); do not edit by hand. "
        "The project's own invented-facts set is reported apart in [own-set.md](own-set.md), and on SmolLM2-135M-Instruct "
        "(through its chat template) in [own-set-smollm2.md](own-set-smollm2.md).",
        "",
        f"Benchmark: `{b['package']}=={b['version']}` ({b['license']}), English templates: "
        f"{b['source']}. Items answered: "
        + ", ".join(f"{n} {k}" for k, n in b["items"].items())
        + " (templates "
        + ", ".join(f"{k} {v[0]}-{v[-1]}" for k, v in b["templates"].items() if v)
        + f" of the package's 100, seed {b['seed']}). Model "
        f"`{results['model']['model']}` (fingerprint `{results['model']['model_fingerprint'][:16]}…`, "
        f"{results['model']['torch_threads']} threads), greedy.",
        f"Prompt: {cfg['prompt']}; up to {cfg['max_new_tokens']} new tokens an answer, stopping {cfg['stop']}; "
        f"the same prompt and budget in every condition. Retrieval: {cfg['retrieval']}. "
        f"Judge: `{results['judge']['function']}` (source sha256 `{results['judge']['sha256'][:16]}…`, commit "
        f"`{results['judge']['commit'][:12]}`); every verdict below is recomputed from the stored answers.",
        "",
        f"Deposits: each original's worked solution (its `<<..>>` annotations and `#### N` line, as the package ships "
        f"it) offered to the real deposit gate: {acc} of {len(deps)} accepted; a refused one is not in the store, so "
        "its questions are answered without it." + _stale_refusals(deps),
        "",
        "| set | items | no graft correct (Wilson 95%) | graft correct (Wilson 95%) | answers grafted | lift (Newcombe 95%) | lift there? |",
        "|---|---:|---|---|---:|---|---|",
    ]
    for k in SET_LABELS:
        c = sc.get(k)
        if not c or not c["items"]:
            continue
        ng, g, lift = c["no-graft"], c["graft"], c["lift"]
        lines.append(
            f"| {SET_LABELS[k]} | {c['items']} | {ng['correct']} ({_pct(ng['accuracy'])}; {_ci(ng['wilson95'])}) | "
            f"{g['correct']} ({_pct(g['accuracy'])}; {_ci(g['wilson95'])}) | {g['grafted']} | "
            f"{_pct(lift['value'])} ({_ci(lift['newcombe95'])}) | {lift['there']} |"
        )
    lines += ["", *recurring_md(results.get("recurring"), "## The recurring case, gsm8k-cot prompt")]
    if results.get("recurring_qa"):
        lines += recurring_md(results["recurring_qa"], "## The recurring case, zero-shot `Q:/A:` prompt")
    lines += commands_md(results)
    return "\n".join(lines) + "\n"


def _stale_refusals(deps: list[dict]) -> str:
    """Refusals whose quoted answer the current judge accepts (the gate ran under an earlier judge)."""
    import re

    stale = []
    for d in deps:
        m = re.search(r"the model answered '(.*)' with the graft", d.get("detail", ""))
        if d["verdict"] == "refused" and m and gsm_recheck._ok(d, m.group(1)):
            stale.append(f"{d['id']} ('{m.group(1)}' against {d['reference']})")
    if not stale:
        return ""
    return (
        f" The gate ran under an earlier judge: {len(stale)} refusal(s) quote an answer the current judge accepts: "
        + ", ".join(stale)
        + "; they were not re-run."
    )


TARGET_BUDGET = 50_000  # the budget a problem for the recurring case
FORM_WORDS = {
    "cot": "gsm8k-cot's 8-shot prompt (the exemplars invite working; they sit between a graft and the question)",
    "qa": "the zero-shot `Q:/A:` prompt (no exemplars; a graft sits right before the question)",
    "steps": "zero-shot chain of thought (`Q:/A: Let's think step by step.`; a graft sits right before the question)",
}


def recurring_md(rc: dict | None, title: str = "## The recurring case") -> list[str]:
    """The case's section, every sentence from its records (the budget, the form, the counts, the ratios)."""
    if not rc:
        return [title, "", "Not run in this results file.", ""]
    c, cfg = rc["case"], rc["config"]
    form = cfg.get("form", "cot")
    below = (
        f" The issue's target is {TARGET_BUDGET:,} tokens a problem; this budget is below it."
        if cfg["budget"] < TARGET_BUDGET
        else ""
    )
    right = c["recalled_correctly"]
    totals = (
        f"The totals and ratios below are over the {right} problem(s) recalled correctly."
        if right
        else "No recall was right, so there is no saving to claim: both ratios are empty."
    )
    lines = [
        title,
        "",
        f"Prompt: {FORM_WORDS.get(form, form)}, the same for the baseline attempts and the recall. The originals the "
        f"greedy answer got wrong and whose worked solution the gate accepted, in a seeded order (seed {cfg['seed']}; "
        f"no selection by answer length), the first {c['problems_tried']} sampled with nothing grafted: the greedy "
        f"attempt, then rounds of {cfg['together']} attempts at temperature {cfg['temperature']} (seeds "
        f"{cfg['seed']}, {cfg['seed'] + 1}, …; up to {cfg['max_new_tokens']} tokens each) until the judge accepted "
        f"one or **{cfg['budget']:,} tokens a problem** (every prompt and decode token; a round's prompt is computed "
        f"once and counted once) were spent.{below} {c['problems_tried']} problems tried, "
        f"{c['solved_within_budget']} solved within the budget, {c['never_solved']} never solved" + _undecided(c) + "; "
        f"{c['case_problems']} of those were asked again through retrieval (the graft condition's record); "
        f"{right} recalled correctly. {totals}",
        "",
        "| baseline tokens | recalls' decode tokens | `ratio` (baseline / recall decode) | recalls' tokens computed "
        "(query prefill + decode) | deposits (gate runs + prefill) | `ratio_all_in` |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {c['baseline_tokens_total']:,} | {c['recall_decode_tokens_total']:,} | {_or_none(c['ratio'])} | "
        f"{c['recall_tokens_total']:,} | {c['deposit_tokens_total']:,} | {_or_none(c['ratio_all_in'])} |",
        "",
        f"`ratio` is the paper's (baseline tokens over the recalls' decode tokens); `ratio_all_in` = baseline tokens / "
        f"(every token the recalls computed, query prefill and decode, + the deposits' cost, gate runs and prefill, "
        f"amortised over {c['amortised_over_recalls']} recalls). The grafted tokens themselves are read, not "
        "computed." + _sceptic(c),
        "",
        "Per problem:",
        "",
        "| problem | baseline tokens (attempts) | solved within the budget | tokens to the first passing attempt | recall decode tokens | recall prompt tokens | grafted | recall correct |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    rows = {r["id"]: r for r in c["rows"]}
    for p in rc["problems"]:
        r = rows.get(p["id"])
        tail = (
            f"{r['recall_decode_tokens']} | {r['recall_prompt_tokens']} | {r['recall_grafted']} | {r['recall_correct']}"
            if r
            else "– | – | – | –"
        )
        first = _to_first_pass(p)
        lines.append(
            f"| {p['id']} | {p['baseline_tokens']:,} ({p['attempts_n']}) | {p['solved']} | "
            f"{'–' if first is None else f'{first:,}'} | {tail} |"
        )
    pr = rc.get("case_product_recall")
    if pr:
        lines += [
            "",
            f"The same baseline against the product's own recall: each never-solved problem asked zero-shot with "
            f"retrieval (its `original-qa` graft record; a prompt other than the baseline's, which was invited to "
            f"reason): {pr['recalled_correctly']} of {pr['case_problems']} recalled right; `ratio` {pr['ratio']}, "
            f"`ratio_all_in` {pr['ratio_all_in']}, charged with every deposit offered {pr['ratio_all_in_offered']}.",
        ]
    passed = [(p, a) for p in rc["problems"] for a in p["attempts"] if a["passed"]][:20]
    if passed:  # what "solved" rests on, for the reader to judge: the passing attempts as written
        lines += ["", "The attempts the judge passed (the first of each problem decides it), as the model wrote them:", ""]
        for p, a in passed:
            text = " ".join(a["answer"].split())
            lines.append(f"- {p['id']} (reference {p['reference']}), seed {a['seed']}: {text[:300]!r}")
    return [*lines, ""]


def _to_first_pass(problem: dict) -> int | None:
    """The tokens of a problem's attempts up to and including the first the current judge passes (a run sampled
    on past it when the judge of its moment refused it: its record keeps every attempt computed)."""
    spent = 0
    for a in problem["attempts"]:
        spent += a["tokens"]
        if a["passed"]:
            return spent
    return None


def _or_none(x) -> str:
    return "none (no recall right)" if x is None else str(x)


def _undecided(c: dict) -> str:
    u = c.get("undecided") or []
    if not u:
        return ""
    return (
        f", {len(u)} undecided ({', '.join(u)}: no attempt passes the current judge, yet the attempts stop short of "
        "the budget, where the run's judge accepted one; in no total)"
    )


def _sceptic(c: dict) -> str:
    """The charges a sceptic lays on the ratios, as the records give them."""
    if not c.get("recalled_correctly") or "deposits_offered" not in c:
        return ""
    unrec = c["deposits_cost_unrecorded"]
    out = (
        f" Charged with every deposit offered ({c['deposits_offered']}, accepted or refused: "
        f"{c['deposit_tokens_offered_total']:,} gate and prefill tokens"
        + (f"; {unrec} without a recorded cost, counted 0" if unrec else "")
        + f") amortised the same way: `ratio_all_in_offered` {c['ratio_all_in_offered']}."
    )
    at = c.get("ratio_at_budget") or {}
    if at:
        out += (
            " A never-solved problem's baseline is its budget, so the paper's ratio is set by the budget chosen: "
            + ", ".join(f"{int(b):,} tokens a problem give {r}" for b, r in at.items())
            + "."
        )
    return out


def commands_md(results: dict | None = None) -> list[str]:
    """The commands that make this file, with the recurring runs' own budgets and round sizes."""
    results = results or {}
    items = (results.get("benchmark") or {}).get("items", {})
    n = max(items.values(), default=30)
    rec, budgets = [], []
    for key, form in (("recurring", "cot"), ("recurring_qa", "qa")):
        rc = results.get(key)
        if not rc:
            continue
        cfg = rc["config"]
        flag = "" if form == "cot" else " --form qa"
        rec.append(
            f"python -m eval.gsm_run recurring --work W{flag} --budget {cfg['budget']} "
            f"--problems {rc['case']['problems_tried']} --together {cfg['together']}"
        )
        budgets.append(f"--budget{'' if form == 'cot' else '-qa'} {cfg['budget']}")
    return [
        "## Commands",
        "",
        "```",
        "make install-eval                                   # the benchmark package (requirements-eval.txt)",
        f"python -m eval.gsm_run no-graft --work W --sets original,numbers,original-qa,original-steps --n {n}",
        f"python -m eval.gsm_run no-graft --work W --sets names --n {items.get('names', n)}",
        f"python -m eval.gsm_run deposit  --work W --n {n}",
        f"python -m eval.gsm_run graft    --work W --sets original-qa,original,numbers,original-steps --n {n}",
        f"python -m eval.gsm_run graft    --work W --sets names --n {items.get('names', n)}",
        *rec,
        f"python -m eval.gsm_report W {' '.join(budgets)}   # this file and gsm-results.json",
        "python cli.py replay-eval docs/eval/gsm-results.json                   # offline: hashes, counts, re-judged",
        "python cli.py replay-eval docs/eval/gsm-results.json --rerun --sample 1 # with the model",
        "```",
        "",
    ]


def export(work: Path, scratch: Path) -> tuple[int, int]:
    """The labelling exports for the judge's labelled set: no-graft and grafted outputs, one JSON object a line."""
    outs = benchmark.read_jsonl(work / "outputs.jsonl")
    keep = ("answer", "question", "verifier", "reference", "id", "seed", "set", "condition", "output_sha256")
    n = {}
    for cond, name in (("no-graft", "gsm-cot-outputs.jsonl"), ("graft", "gsm-graft-outputs.jsonl")):
        rows = [{k: r[k] for k in keep} for r in outs if r["condition"] == cond]
        if cond == "no-graft":  # the recurring case's sampled attempts are no-graft outputs too
            for path in sorted(work.glob("recurring-*.jsonl")):
                for p in benchmark.read_jsonl(path):
                    for a in p["attempts"][1:]:
                        rows.append(
                            {k: p[k] for k in ("question", "verifier", "reference", "id")}
                            | {"answer": a["answer"], "seed": a["seed"], "set": "original", "condition": "sampled"}
                            | {"output_sha256": a["output_sha256"]}
                        )
        tmp = scratch / (name + ".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, scratch / name)
        n[cond] = len(rows)
    return n["no-graft"], n["graft"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("work", type=Path)
    p.add_argument("--budget", type=int, default=None, help="the cot recurring run's budget (its records file)")
    p.add_argument("--budget-qa", type=int, default=None, help="the qa recurring run's budget (its records file)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--export", type=Path, default=None, help="write the labelling exports into this folder only")
    args = p.parse_args(argv)
    if args.export is not None:
        print("exported (no-graft, graft):", export(args.work, args.export))
        return 0
    budgets = {f: b for f, b in (("cot", args.budget), ("qa", args.budget_qa)) if b is not None}
    results = build(args.work, budgets)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(dumps(results), encoding="utf-8")
    os.replace(tmp, args.out)
    (args.out.parent / "README.md").write_text(markdown(results), encoding="utf-8")
    cases = {k: results[k]["case"] for k in gsm_recheck.RECURRING_KEYS if k in results}
    print(json.dumps({"scores": results["scores"], **cases}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
