"""Re-check the benchmark results file (docs/eval/gsm-results.json): offline, every hash, every token count and
every verdict re-judged by the current judge; with `rerun`, the model recomputes every recall and the first
`sample` sampled rounds of every recurring problem and their token ids are compared with the records.

Knows the layout `eval/gsm_report.py` writes; nothing about grafting. A verdict the current judge gives
differently from the one stored is reported as a record scored by another judge (the figures are recomputed
with the current one); a stored figure that the records under the same judge do not give is a mismatch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eval import benchmark, gsm, gsm_recurring
from eval.recheck import RecheckReport

FORMAT = "kvgraft-gsm-eval/1"


def judge_sha256() -> str:
    """SHA-256 of the judge's source (every module of verifiers/, sorted by name): which judge scored a file."""
    root = Path(__file__).resolve().parent.parent / "verifiers"
    h = hashlib.sha256()
    for p in sorted(root.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _ok(row: dict, answer: str) -> bool:
    return bool(benchmark.score({**row, "answer": answer})["ok"])


RECURRING_KEYS = ("recurring", "recurring_qa")  # the case with the cot prompt, and in the qa form


def recalls(outs: list[dict], form: str) -> dict[str, dict]:
    """Problem id -> its recall: the graft-condition record of the original in the case's form."""
    want = "original" if form == "cot" else f"original-{form}"
    return {r["id"]: r for r in outs if r["condition"] == "graft" and r["set"] == want}


def product_recalls(outs: list[dict]) -> dict[str, dict]:
    """Problem id of the cot case -> the product's own zero-shot answer to it (the `original-qa` graft record):
    the recall as the product asks it, set beside a baseline that was invited to reason."""
    return {r["id"][: -len("-qa")]: r for r in outs if r["condition"] == "graft" and r["set"] == "original-qa"}


def deposits_by_problem(deposits: list[dict], form: str) -> dict[str, dict]:
    """Problem id (in the case's form) -> the gate's record of its original's deposit."""
    suffix = "" if form == "cot" else f"-{form}"
    return {d["id"] + suffix: d for d in deposits}


def _cases(results: dict) -> list[tuple[str, dict]]:
    return [(k, results[k]) for k in RECURRING_KEYS if results.get(k)]


def _problems(results: dict) -> list[dict]:
    return [p for _, rc in _cases(results) for p in rc["problems"]]


def rescore(results: dict) -> tuple[dict, dict]:
    """(scores, {key: recurring case}) recomputed from the records by the current judge."""
    outs = results["outputs"]
    verdicts = {benchmark.key(r): _ok(r, r["answer"]) for r in outs}
    scores = benchmark.summarise(outs, verdicts)
    cases = {}
    for k, rc in _cases(results):
        form = rc["config"].get("form", "cot")
        dep = deposits_by_problem(results["deposits"], form)
        cases[k] = gsm_recurring.summarise(rc["problems"], recalls(outs, form), dep, rc["config"], _ok)
        if form == "cot":  # the same baseline, recalled in the product's zero-shot form
            cases[f"{k}:product_recall"] = gsm_recurring.summarise(rc["problems"], product_recalls(outs), dep, rc["config"], _ok)
    return scores, cases


def check_offline(results: dict, report: RecheckReport, tokenizer=None) -> None:
    from graft_core import templates
    from graft_core.generate import tokens_sha256

    if results.get("format") != FORMAT:
        report.fail(f"format is {results.get('format')!r}, expected {FORMAT!r}")
        return
    report.outputs = len(results["outputs"])
    for r in results["outputs"]:
        where = f"{r['condition']} {r['id']}"
        ids = r["output_token_ids"]
        if tokens_sha256(ids) != r["output_sha256"] or len(ids) != r["decode_tokens"]:
            report.fail(f"{where}: output token ids do not match their hash or decode count")
        elif (
            tokenizer is not None
            and templates.cut_answer(tokenizer.decode(ids, skip_special_tokens=True), r.get("form", "cot")) != r["answer"]
        ):
            report.fail(f"{where}: the stored answer is not what its token ids decode to")
        report.count("output hashes")
        if tokenizer is not None:
            report.count("answers decoded from their token ids")
    for p in _problems(results):
        where = f"recurring {p['id']}"
        if gsm_recurring.attempts_sha256(p["attempts"]) != p["attempts_sha256"]:
            report.fail(f"{where}: attempt records hash differently from the recorded attempts_sha256")
        if sum(a["tokens"] for a in p["attempts"]) != p["baseline_tokens"]:
            report.fail(f"{where}: attempt tokens do not sum to the recorded baseline_tokens")
        if p["baseline_tokens"] > p["budget"]:
            report.fail(f"{where}: {p['baseline_tokens']} tokens spent exceed the {p['budget']}-token budget")
        report.count("recurring problems")
    _rejudge(results, report)


def _stored_case(results: dict, key: str) -> dict | None:
    k, _, part = key.partition(":")
    return results[k].get("case_" + part if part else "case")


def _rejudge(results: dict, report: RecheckReport) -> None:
    """Every stored verdict against the current judge's; every figure against the records."""
    stored = results["judge"]["sha256"]
    same = stored == judge_sha256()
    differ = 0
    for r in results["outputs"]:
        differ += _ok(r, r["answer"]) != r["ok"]
        report.count("outputs re-judged")
    for p in _problems(results):
        for a in p["attempts"]:
            differ += _ok(p, a["answer"]) != a["passed"]
            report.count("attempts re-judged")
    scores, cases = rescore(results)
    figures_differ = json.dumps(scores, sort_keys=True) != json.dumps(results["scores"], sort_keys=True) or any(
        json.dumps(c, sort_keys=True) != json.dumps(_stored_case(results, k), sort_keys=True) for k, c in cases.items()
    )
    if same:
        if differ:
            report.fail(f"{differ} stored verdicts differ from the judge that is recorded to have given them")
        if figures_differ:
            report.fail("the stored scores or recurring case are not what the records give under the recorded judge")
    elif differ or figures_differ:
        report.notes.append(
            f"scored by another judge (sha256 {stored[:12]}…, current {judge_sha256()[:12]}…): {differ} verdicts "
            "differ; figures recomputed with the current judge: " + json.dumps({"scores": scores, **cases})
        )


def rerun(results: dict, report: RecheckReport, sample: int, lm=None) -> None:
    """Recompute with the model: the deposits (same artifact ids), then for every recurring problem its greedy
    record, its recall and its first `sample` sampled rounds; token ids compared by hash."""
    import tempfile

    import services

    items = {benchmark.key(r): r for r in results["outputs"]}
    with tempfile.TemporaryDirectory(prefix="kvgraft-gsm-rerun-") as home:
        lib = services.Library(home=home, model_name=None if lm is not None else results["model"]["model"], lm=lm)
        solutions = {o["id"]: o["solution"] for o in gsm.load(results["benchmark"]["seed"], sets=("original",))["original"]}
        for d in results["deposits"]:  # the worked solutions from the installed package (never stored in the file)
            got = benchmark.deposit(lib, {**d, "solution": solutions[d["id"]]})
            if got["verdict"] != d["verdict"] or got.get("artifact") != d.get("artifact"):
                report.fail(f"deposit {d['id']}: re-run gives {got['verdict']}, recorded {d['verdict']}")
            report.count("deposits re-run")
        for _, rc in _cases(results):
            _rerun_case(lib, rc, items, report, sample)
        lib.close()


def _rounds(attempts: list[dict]) -> list[list[dict]]:
    """The sampled attempts grouped by round: a round's first attempt carries its prompt's tokens."""
    rounds: list[list[dict]] = []
    for a in attempts:
        if a["mode"] != "sampled":
            continue
        if a["prompt_tokens"] or not rounds:
            rounds.append([])
        rounds[-1].append(a)
    return rounds


def _rerun_case(lib, rc: dict, items: dict, report: RecheckReport, sample: int) -> None:
    from eval import sampling
    from graft_core import generate
    from graft_core.batch import WIDTHS, Batcher

    cfg = rc["config"]
    form = cfg.get("form", "cot")
    batcher = Batcher(lib.lm.model, widths=tuple(sorted({*WIDTHS, cfg.get("together", 8)})))
    for p in rc["problems"]:
        for cond in ("no-graft", "graft"):
            rec = items.get((cond, p["id"]))
            if rec is not None:
                if benchmark.ask(lib, rec, cond)["output_sha256"] != rec["output_sha256"]:
                    report.fail(f"{cond} {p['id']}: re-run token ids differ from the record")
                report.count("answers re-run")
        prompt_ids = generate.encode_prompt(lib.lm, p["question"], grafted=False, form=form)
        for rnd in _rounds(p["attempts"])[:sample]:
            seeds = [a["seed"] for a in rnd]
            r = sampling._round(
                lib.lm, batcher, prompt_ids, seeds, cfg["temperature"], cfg["max_new_tokens"], lambda t: False, form
            )
            for a, b in zip(rnd, r.attempts, strict=True):
                if generate.tokens_sha256(b.token_ids) != a["output_sha256"]:
                    report.fail(f"recurring {p['id']} seed {a['seed']}: re-run token ids differ from the record")
                report.count("sampled attempts re-run")


def recheck(path: str | Path, rerun_model: bool = False, sample: int = 0, lm=None) -> RecheckReport:
    path = Path(path)
    report = RecheckReport(path=str(path))
    results = json.loads(path.read_text(encoding="utf-8"))
    tok = None
    try:  # the packaged model's tokenizer from its GGUF's vocabulary (no weights read)
        from graft_core import model as model_mod
        from graft_core import packaged

        found = sorted((model_mod.model_cache_dir() / "gemma-3-270m-gguf").glob("*.gguf"))
        if found:
            tok = packaged.tokenizer(found[0])
        else:
            report.notes.append("the packaged model's GGUF is not in the model cache: token ids not decoded")
    except Exception as e:  # the offline check stands without the tokenizer; say why it was not used
        report.notes.append(f"tokenizer not loaded ({e}): token ids not decoded")
    check_offline(results, report, tok)
    if rerun_model:
        rerun(results, report, sample, lm)
    return report
