"""replay-eval on the benchmark results file (eval/gsm_report.py writes it, eval/gsm_recheck.py re-checks it):
an untouched file passes; a tampered token id, verdict, figure or attempt record is caught; a file scored by
another judge is reported as such and re-scored. No model (the token ids are not decoded here)."""

from __future__ import annotations

import json

import pytest

from eval import gsm_recheck, gsm_recurring, gsm_report
from eval.recheck import RecheckReport
from graft_core.generate import tokens_sha256


def _out(i: int, cond: str, answer: str, ids: list[int], s: str = "original") -> dict:
    return {
        "id": f"gsm{i:04d}-{s}",
        "set": s,
        "condition": cond,
        "template": i,
        "id_orig": 100 + i,
        "seed": None,
        "question": f"Ann has {i} apples and buys 2 more. How many apples does she have?",
        "verifier": "numeric",
        "reference": str(i + 2),
        "answer": answer,
        "output_token_ids": ids,
        "output_sha256": tokens_sha256(ids),
        "computed_tokens": 750,
        "decode_tokens": len(ids),
        "grafted_tokens": 120 if cond == "graft" else 0,
        "artifact_ids": ["a" * 64] if cond == "graft" else [],
        "retrieved": [],
        "note": "",
        "seconds": 1.0,
    }


@pytest.fixture
def work(tmp_path):
    w = tmp_path / "run"
    w.mkdir()
    rows = []
    for i in range(4):
        rows.append(_out(i, "no-graft", f"{i} + 2 = {i + 3}", [5, 6, i]))
        rows.append(_out(i, "graft", f"{i + 2}", [7, i, 8, 9]))
    (w / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    deps = [
        {"id": f"gsm{i:04d}-original", "verdict": "accepted", "artifact": "a" * 64, "gate_tokens": 300, "prefill_tokens": 120}
        for i in range(4)
    ]
    (w / "deposits.jsonl").write_text("".join(json.dumps(d) + "\n" for d in deps))
    (w / "model.json").write_text(json.dumps({"model": "m", "model_fingerprint": "f", "torch_threads": 2}))
    cfg = gsm_recurring.CaseConfig(budget=2500).as_dict()
    probs = []
    for i in (1, 3):
        atts = [
            {"mode": "greedy", "seed": None, "tokens": 753, "prompt_tokens": 750, "decode_tokens": 3,
             "output_sha256": tokens_sha256([5, 6, i]), "answer": f"{i} + 2 = {i + 3}", "passed": False},
            {"mode": "sampled", "seed": 0, "tokens": 760, "prompt_tokens": 750, "decode_tokens": 10,
             "output_sha256": "0" * 64, "answer": "no idea", "passed": False},
        ]  # fmt: skip
        p = {"id": f"gsm{i:04d}-original", "question": rows[2 * i]["question"], "verifier": "numeric"}
        p |= {"reference": str(i + 2), "budget": 2500, "baseline_tokens": 1513, "attempts_n": 2, "solved": False}
        p |= {"attempts": atts, "attempts_sha256": gsm_recurring.attempts_sha256(atts), "config": cfg}
        probs.append(p)
    (w / "recurring-b2500-s0.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probs))
    return w


def _check(results: dict) -> RecheckReport:
    rep = RecheckReport(path="x")
    gsm_recheck.check_offline(results, rep)
    return rep


def test_an_untouched_file_passes_and_its_figures_are_the_records(work):
    results = gsm_report.build(work, {"cot": 2500})
    text = gsm_report.dumps(results)
    assert json.loads(text) == results  # the compact layout is plain JSON
    rep = _check(json.loads(text))
    assert rep.ok, rep.problems
    assert rep.checks["output hashes"] == 8 and rep.checks["attempts re-judged"] == 4
    case = results["recurring"]["case"]
    assert case["case_problems"] == 2 and case["baseline_tokens_total"] == 2 * 1513
    # the paper's ratio over the recalls' decode tokens; all-in over everything they computed plus the deposits
    assert case["ratio"] == round(2 * 1513 / 8, 1)
    assert case["ratio_all_in"] == round(2 * 1513 / (2 * (750 + 4) + 2 * 420 / 10), 2)
    md = gsm_report.markdown(results)  # the README's figures are the file's
    assert f"| {case['baseline_tokens_total']:,} | 8 | {case['ratio']} |" in md
    assert "| GSM8K originals (recurring" in md and "| 4 | 0 (0.0%; 0.0% to 49.0%) | 4 (100.0%; 51.0% to 100.0%) |" in md


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda r: r["outputs"][0]["output_token_ids"].__setitem__(0, 99), "do not match their hash"),
        (lambda r: r["outputs"][1].__setitem__("ok", not r["outputs"][1]["ok"]), "differ from the judge"),
        (lambda r: r["scores"]["original"]["graft"].__setitem__("correct", 3), "not what the records give"),
        (lambda r: r["recurring"]["problems"][0]["attempts"][1].__setitem__("tokens", 10), "hash differently"),
        (lambda r: r["recurring"]["case"].__setitem__("ratio", 12490.0), "not what the records give"),
    ],
)
def test_a_tampered_record_is_caught(work, tamper, message):
    results = json.loads(gsm_report.dumps(gsm_report.build(work, {"cot": 2500})))
    tamper(results)
    rep = _check(results)
    assert not rep.ok and any(message in p for p in rep.problems), rep.problems


def test_a_file_scored_by_another_judge_is_reported_and_rescored(work):
    results = json.loads(gsm_report.dumps(gsm_report.build(work, {"cot": 2500})))
    results["judge"]["sha256"] = "f" * 64
    results["outputs"][1]["ok"] = not results["outputs"][1]["ok"]
    rep = _check(results)
    assert rep.ok  # not a mismatch: the verdicts are recomputed with the current judge
    assert any(n.startswith("scored by another judge") and "1 verdicts differ" in n for n in rep.notes), rep.notes


def test_a_wrong_recall_counts_in_no_ratio(work):
    results = gsm_report.build(work, {"cot": 2500})
    rc = results["recurring"]
    recalls = {r["id"]: r for r in results["outputs"] if r["condition"] == "graft"}
    recalls["gsm0003-original"] = {**recalls["gsm0003-original"], "answer": "41"}  # wrong: the reference is 5
    deps = {d["id"]: d for d in results["deposits"]}
    case = gsm_recurring.summarise(rc["problems"], recalls, deps, rc["config"], gsm_recheck._ok)
    assert case["case_problems"] == 2 and case["recalled_correctly"] == 1
    assert case["baseline_tokens_total"] == 1513 and case["ratio"] == round(1513 / 4, 1)
    recalls["gsm0001-original"] = {**recalls["gsm0001-original"], "answer": "41"}
    none = gsm_recurring.summarise(rc["problems"], recalls, deps, rc["config"], gsm_recheck._ok)
    assert none["recalled_correctly"] == 0 and none["ratio"] is None and none["ratio_all_in"] is None


def test_the_recurring_sections_words_follow_the_records(work):
    """The markdown's sentences are derived: a budget below the issue's target says so, one at it does not; a case
    with no right recall says there is no saving, one with right recalls does not."""
    results = gsm_report.build(work, {"cot": 2500})
    md = gsm_report.markdown(results)
    assert "this budget is below it" in md and "no saving to claim" not in md
    rc = results["recurring"]
    at_target = {**rc, "config": {**rc["config"], "budget": gsm_report.TARGET_BUDGET}}
    none_right = {**rc, "case": {**rc["case"], "recalled_correctly": 0}}
    assert "below it" not in "\n".join(gsm_report.recurring_md(at_target))
    assert "no saving to claim" in "\n".join(gsm_report.recurring_md(none_right))


def test_the_sceptics_charges_are_computed_from_the_records(work):
    """Every deposit offered is charged (a refused one's gate runs too), and the paper's ratio is recomputed at
    each smaller budget from the attempts that fit in it."""
    deps = [json.loads(x) for x in (work / "deposits.jsonl").read_text().splitlines()]
    deps.append({"id": "gsm0009-original", "verdict": "refused", "gate_tokens": 580, "reference": "1"})
    deps.append({"id": "gsm0010-original", "verdict": "refused", "reference": "1"})  # cost not recorded
    (work / "deposits.jsonl").write_text("".join(json.dumps(d) + "\n" for d in deps))
    case = gsm_report.build(work, {"cot": 2500})["recurring"]["case"]
    assert case["deposits_offered"] == 6 and case["deposits_cost_unrecorded"] == 1
    assert case["deposit_tokens_offered_total"] == 4 * 420 + 580
    assert case["ratio_all_in_offered"] == round(2 * 1513 / (2 * (750 + 4) + (4 * 420 + 580) / 10), 2)
    assert case["ratio_at_budget"] == {}  # a 2,500-token budget is below every budget it is recomputed at
    md = gsm_report.markdown(gsm_report.build(work, {"cot": 2500}))
    assert "1 without a recorded cost, counted 0" in md


def _problem(pid: str, budget: int, tokens: list[int], passed_at: int | None = None) -> dict:
    atts = [
        {"mode": "greedy" if i == 0 else "sampled", "seed": None if i == 0 else i - 1, "tokens": t,
         "prompt_tokens": 100 if i < 2 else 0, "decode_tokens": t - (100 if i < 2 else 0), "output_sha256": "0" * 64,
         "answer": "16" if i == passed_at else "no idea", "passed": i == passed_at}
        for i, t in enumerate(tokens)
    ]  # fmt: skip
    return {"id": pid, "question": "q?", "verifier": "numeric", "reference": "16", "budget": budget,
            "baseline_tokens": sum(tokens), "attempts_n": len(tokens), "attempts": atts}  # fmt: skip


def test_the_ratio_at_smaller_budgets_and_undecided_problems_come_from_the_attempts():
    """A never-solved problem's baseline is its budget: the paper's ratio recomputed at each smaller budget from
    the attempts that fit; a problem whose attempts stop short of its budget without a pass is undecided."""
    cfg = gsm_recurring.CaseConfig(budget=10_000, max_new_tokens=256).as_dict()
    spent = _problem("gsm0001-original", 10_000, [300] + [250] * 38)  # 9,800: no further round fits
    short = _problem("gsm0002-original", 10_000, [300, 250, 250])  # stopped at 800 tokens, nothing passed
    solved = _problem("gsm0003-original", 10_000, [300, 250, 250], passed_at=2)
    recall = {"answer": "16", "verifier": "numeric", "reference": "16", "question": "q?", "artifact_ids": ["a"]}
    recalls = {p["id"]: recall | {"decode_tokens": 5, "computed_tokens": 40} for p in (spent, short, solved)}
    deps = {p["id"]: {"verdict": "accepted", "gate_tokens": 300, "prefill_tokens": 100} for p in (spent, short, solved)}
    case = gsm_recurring.summarise([spent, short, solved], recalls, deps, cfg, gsm_recheck._ok)
    assert case["never_solved"] == 1 and case["undecided"] == ["gsm0002-original"] and case["solved_within_budget"] == 1
    assert case["baseline_tokens_total"] == 9_800 and case["ratio"] == round(9_800 / 5, 1)
    assert case["ratio_at_budget"] == {"4000": round((300 + 250 * 14) / 5, 1), "10000": round(9_800 / 5, 1)}


def test_the_cot_baseline_beside_the_products_own_recall_is_computed_and_replayed(work):
    """The cot case's baseline set beside the zero-shot graft record of the same problem (the product's own
    recall): its figures come from the records, and replay catches a tampered one."""
    rows = [json.loads(x) for x in (work / "outputs.jsonl").read_text().splitlines()]
    rows += [_out(i, "graft", f"{i + 2}", [3, i], s="original-qa") for i in (1, 3)]
    (work / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = json.loads(gsm_report.dumps(gsm_report.build(work, {"cot": 2500})))
    pr = results["recurring"]["case_product_recall"]
    assert pr["recalled_correctly"] == 2 and pr["ratio"] == round(2 * 1513 / 4, 1)
    assert "against the product's own recall" in gsm_report.markdown(results)
    assert _check(results).ok
    results["recurring"]["case_product_recall"]["ratio"] = 99999.0
    assert not _check(results).ok
