"""`python -m eval.transfer_report WORK [--name NAME]`: the transfer eval's results file and page from a run's records
(eval/transfer_run.py), every verdict and figure computed here by the current judge; `recheck` re-checks a results
file offline (every verdict re-judged, every output hash and figure recomputed) or, with the model, re-asks a sample.

Pure over the records: `summarise` is what both the writer and the re-check compute.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path

from eval import benchmark, gsm, gsm_recheck, transfer

ROOT = Path(__file__).resolve().parent.parent
FORMAT = "kvgraft-transfer-eval/1"
# (name, condition, against): each difference reported with its Newcombe interval
DIFFERENCES = (
    ("transfer lift", "transfer", "zero-shot"),
    ("control lift", "control", "zero-shot"),
    ("transfer over control", "transfer", "control"),
    ("few-shot lift", "few-shot", "zero-shot"),
    ("grafted few-shot against prefilled", "few-shot-grafted", "few-shot"),
)


def _per_answer(rows: list[dict], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 1) if rows else 0.0


def summarise(outputs: list[dict], library: dict[int, str]) -> dict:
    """Per condition over the problems it answered: accuracy (Wilson 95%), tokens computed per answer (prompt
    prefill and decode), grafted tokens read, median seconds, answers cut at the budget; each difference over the
    problems both of its conditions answered (Newcombe 95%); how often the grafted few-shot answer is the prefilled
    one byte for byte; where the transfer condition's graft came from (`library`: template -> its accepted
    deposit's artifact)."""
    by = {benchmark.key(r): r for r in outputs}
    ok = {k: benchmark.score(r)["ok"] for k, r in by.items()}
    present = [c for c in transfer.CONDITIONS if any(r["condition"] == c for r in outputs)]
    answered = {c: sorted(i for (cc, i) in by if cc == c) for c in present}
    cells = {}
    for c in present:
        rows = [by[(c, i)] for i in answered[c]]
        k = sum(1 for i in answered[c] if ok[(c, i)])
        cells[c] = {
            "answered": len(rows),
            "correct": k,
            "accuracy": round(k / len(rows), 4),
            "wilson95": benchmark._listed(benchmark.wilson(k, len(rows))),
            "prompt_tokens_computed_per_answer": _per_answer(rows, "computed_tokens"),
            "decode_tokens_per_answer": _per_answer(rows, "decode_tokens"),
            "grafted_tokens_per_answer": _per_answer(rows, "grafted_tokens"),
            "median_seconds": round(statistics.median(r["seconds"] for r in rows), 2),
            "at_budget": sum(1 for r in rows if r["decode_tokens"] >= transfer.MAX_NEW_TOKENS),
        }
    diffs = {}
    for name, a, b in DIFFERENCES:
        both = sorted(set(answered.get(a, ())) & set(answered.get(b, ())))
        if both:
            ka, kb, n = sum(ok[(a, i)] for i in both), sum(ok[(b, i)] for i in both), len(both)
            ci = benchmark.newcombe(ka, n, kb, n)
            diffs[name] = {
                "of": [a, b],
                "problems": n,
                "correct": [ka, kb],
                "value": round((ka - kb) / n, 4),
                "newcombe95": benchmark._listed(ci),
                "interval_excludes_0": ci is not None and (ci[0] > 0 or ci[1] < 0),
            }
    out = {"problems": len(set().union(*answered.values())) if answered else 0, "conditions": cells, "differences": diffs}
    pairs = sorted(set(answered.get("few-shot", ())) & set(answered.get("few-shot-grafted", ())))
    if pairs:
        same = sum(1 for i in pairs if by[("few-shot", i)]["output_token_ids"] == by[("few-shot-grafted", i)]["output_token_ids"])
        out["few_shot_identical_outputs"] = [same, len(pairs)]
    if "transfer" in cells:
        routed = {"sibling": 0, "another": 0, "nothing": 0}
        for i in answered["transfer"]:
            r = by[("transfer", i)]
            grafted = r["artifact_ids"]
            routed["nothing" if not grafted else "sibling" if library.get(r["template"]) in grafted else "another"] += 1
        out["transfer_grafted"] = routed
    return out


def _library(deposits: list[dict]) -> dict[int, str]:
    return {d["template"]: d["artifact"] for d in deposits if d["verdict"] == "accepted"}


def _superseded(work: Path) -> list[dict]:
    """Records set aside in W/transfer-superseded-*.jsonl (not counted), each file with its count per condition:
    the transfer and control answers of templates asked before the library was whole (another store to retrieve
    from, other controls drawn) were asked again on the whole library."""
    out = []
    for f in sorted(work.glob("transfer-superseded-*.jsonl")):
        rows = benchmark.read_jsonl(f)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["condition"]] = counts.get(r["condition"], 0) + 1
        out.append(
            {"file": f.name, "outputs": len(rows), "by_condition": counts, "templates": sorted({r["template"] for r in rows})}
        )
    return out


def build(work: Path, seed: int = 0) -> dict:
    outputs = benchmark.read_jsonl(work / "transfer.jsonl")
    outputs.sort(key=lambda r: (r["id"], transfer.CONDITIONS.index(r["condition"])))
    deposits = benchmark.latest_deposits(benchmark.read_jsonl(work / "deposits.jsonl"))
    meta = json.loads((work / "model.json").read_text(encoding="utf-8"))
    library = _library(deposits)
    return {
        "format": FORMAT,
        "benchmark": {
            "package": gsm.PACKAGE,
            "version": gsm.version(),
            "license": "MIT",
            "seed": seed,
            "library": "each template's original GSM8K problem and worked solution, offered to the real deposit gate",
            "held_out": "a new instance of each template (new names and numbers, the package's generator, seeded), never deposited",
        },
        "model": meta,
        "judge": {"sha256": gsm_recheck.judge_sha256(), "function": "verifiers.judge"},
        "config": {
            "form": transfer.FORM,
            "prompt": "the model's chat template; the question as the user turn; the assistant's turn opened by "
            "\"Let's think step by step.\"; few-shot: gsm8k-cot's eight exemplars as a system turn before it",
            "max_new_tokens": transfer.MAX_NEW_TOKENS,
            "greedy": True,
            "exemplars_sha256": hashlib.sha256(transfer.exemplars_text().encode()).hexdigest(),
        },
        "deposits": deposits,
        "superseded": _superseded(work),
        "summary": summarise(outputs, library),
        "outputs": outputs,
    }


def recheck(results: dict, report) -> None:
    """Offline: every output's hash from its token ids, every verdict re-judged and every figure recomputed."""
    from graft_core.generate import tokens_sha256

    if results.get("format") != FORMAT:
        report.fail(f"format is {results.get('format')!r}, expected {FORMAT!r}")
        return
    report.outputs = len(results["outputs"])
    for r in results["outputs"]:
        if tokens_sha256(r["output_token_ids"]) != r["output_sha256"]:
            report.fail(f"{r['condition']} {r['id']}: output_sha256 is not the hash of its token ids")
        report.count("output hashes")
    if results["judge"]["sha256"] != gsm_recheck.judge_sha256():
        report.notes.append("scored by another judge than the current one: the figures below are the current judge's")
    again = summarise(results["outputs"], _library(results["deposits"]))
    report.count("figures re-derived", 1)
    if json.dumps(again, sort_keys=True) != json.dumps(results["summary"], sort_keys=True):
        report.fail("the summary recomputed from the stored outputs differs from the stored summary")


def rerun(results: dict, report, sample: int) -> None:
    """With the model the results name: the first `sample` problems of each condition asked again in a fresh store
    (the exemplars deposited again; a transfer or control graft's original deposited again through the gate from the
    installed package), every output's token ids compared byte for byte with the record."""
    import tempfile

    import services
    from eval import gsm

    by_template = {t.id_shuffled: t for t in gsm.templates()}
    wanted = results["model"]["model_fingerprint"]
    with tempfile.TemporaryDirectory(prefix="kvgraft-transfer-rerun-") as home:
        lib = services.Library(home=Path(home) / "store", model_name=results["model"]["model"])
        if lib.lm.fingerprint != wanted:
            report.fail(f"the model here has fingerprint {lib.lm.fingerprint[:12]}, the results' is {wanted[:12]}")
            lib.close()
            return
        deposited: dict[str, str] = {}  # the results' artifact id -> the id deposited here (the same bytes: the same id)

        def again(artifact: str, template: int) -> str | None:
            if artifact not in deposited:
                o = gsm.original(by_template[template])
                try:
                    deposited[artifact] = lib.deposit_item(
                        o["question"], o["solution"], o["reference"], "numeric", o["reference"]
                    ).id
                except Exception as e:  # the gate refuses here what it accepted there: a mismatch, said once
                    report.fail(f"template {template}'s original is not deposited again here: {e}")
                    deposited[artifact] = ""
            return deposited[artifact] or None

        exemplars = lib.deposit_text(transfer.exemplars_text(), title="gsm8k-cot exemplars", admin=True).id
        library = _library(results["deposits"])
        by_artifact = {a: t for t, a in library.items()}
        for c in ("zero-shot", "few-shot", "transfer", "control"):
            rows = [r for r in results["outputs"] if r["condition"] == c][:sample]
            for r in rows:
                artifact = None
                if c == "few-shot":
                    artifact = exemplars
                elif c == "control":
                    artifact = again(r["artifact_ids"][-1], by_artifact[r["artifact_ids"][-1]])
                elif c == "transfer":
                    for a in r["artifact_ids"]:
                        if a in by_artifact:
                            again(a, by_artifact[a])
                got = transfer.ask(lib, r, c, artifact)
                stored = {(x["condition"]): x for x in results["outputs"] if x["id"] == r["id"]}
                for g in got:
                    if g["output_token_ids"] != stored[g["condition"]]["output_token_ids"]:
                        report.fail(f"{g['condition']} {r['id']}: the model gives other token ids than the record")
                    report.count("outputs recomputed")
        lib.close()


def recheck_file(path: str | Path, rerun_model: bool = False, sample: int = 1):
    """`cli.py replay-eval` on a transfer results file: `recheck`, and with `rerun_model` `rerun`."""
    from eval.recheck import RecheckReport

    path = Path(path)
    report = RecheckReport(path=str(path))
    results = json.loads(path.read_text(encoding="utf-8"))
    recheck(results, report)
    if rerun_model and report.ok:
        rerun(results, report, sample)
    return report


def page(results: dict, name: str) -> str:
    """The results page (markdown), generated from the results file alone."""
    s = results["summary"]
    lines = [
        f"# Held-out transfer on GSM-Symbolic: {results['model']['model']}",
        "",
        f"Generated by `python -m eval.transfer_report` from [transfer-{name}.json](transfer-{name}.json); re-check it with "
        f"`python cli.py replay-eval docs/eval/transfer-{name}.json` (offline) or `--rerun --sample K` (the model).",
        "",
        f"{results['benchmark']['package']} {results['benchmark']['version']}: library = {results['benchmark']['library']}; "
        f"held-out = {results['benchmark']['held_out']}. Prompt: {results['config']['prompt']}. Greedy, "
        f"{results['config']['max_new_tokens']} new tokens at most in every condition, one judge (`verifiers.judge`).",
        "",
        f"Held-out problems answered so far: **{s['problems']}** (each condition's count in its row). "
        f"Deposits accepted by the gate: {sum(1 for d in results['deposits'] if d['verdict'] == 'accepted')} of "
        f"{len(results['deposits'])} offered.",
        "",
        "| condition | correct | accuracy | Wilson 95% | prompt tokens computed / answer | decode / answer | grafted tokens read / answer | median s / answer | at budget |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c, cell in s["conditions"].items():
        lines.append(
            f"| {c} | {cell['correct']}/{cell['answered']} | {cell['accuracy']} | {cell['wilson95']} | "
            f"{cell['prompt_tokens_computed_per_answer']} | {cell['decode_tokens_per_answer']} | "
            f"{cell['grafted_tokens_per_answer']} | {cell['median_seconds']} | {cell['at_budget']} |"
        )
    lines += [
        "",
        "| difference | problems both answered | correct | value | Newcombe 95% | interval excludes 0 |",
        "|---|---:|---|---:|---|---|",
    ]
    for d, v in s["differences"].items():
        lines.append(
            f"| {d} ({v['of'][0]} - {v['of'][1]}) | {v['problems']} | {v['correct'][0]} vs {v['correct'][1]} | "
            f"{v['value']} | {v['newcombe95']} | {'yes' if v['interval_excludes_0'] else 'no'} |"
        )
    if "few_shot_identical_outputs" in s:
        same, n = s["few_shot_identical_outputs"]
        lines += ["", f"Grafted few-shot answers byte-identical to the prefilled ones: {same} of {n}."]
    if "transfer_grafted" in s:
        t = s["transfer_grafted"]
        lines += [
            "",
            f"What the product's retrieval grafted in the transfer condition: the sibling's verified solution "
            f"{t['sibling']}, another template's {t['another']}, nothing {t['nothing']}.",
        ]
    for x in results.get("superseded", []):
        lines += [
            "",
            f"Set aside and not counted: {x['outputs']} earlier answers ({x['by_condition']}) of templates "
            f"{x['templates']}, asked while the library held only the first templates' deposits (other stores to "
            f"retrieve from, other controls drawn); asked again on the whole library (`{x['file']}` in the work folder).",
        ]
    lines += [
        "",
        "Seconds are wall time on a shared 2-core machine with up to 8 answers decoded together; a few-shot-grafted "
        "answer's call first computes its prefilled baseline (the few-shot row), so its seconds include that wait: the "
        "cost to compare is the tokens computed. The run was also held (stopped, then continued) while benchmarks needed "
        "the machine quiet, and an answer in flight then counts the hold in its seconds. Answers cut at the budget are "
        "counted in the last column.",
        "",
        "A lift is claimed only where its interval excludes 0; every other difference is stated as measured.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("work", type=Path)
    p.add_argument("--name", default="qwen2.5-coder-1.5b-instruct", help="the suffix of docs/eval/transfer-NAME.json/.md")
    args = p.parse_args(argv)
    results = build(args.work)
    out = ROOT / "docs" / "eval" / f"transfer-{args.name}.json"
    out.write_text(json.dumps(results, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(page(results, args.name), encoding="utf-8")
    print(json.dumps(results["summary"], indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
