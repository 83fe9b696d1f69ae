"""The gate's judging measured on the eval's items (eval/gate_judging.py, docs/bench/gate-judging.json): the
committed figures are what the code computes from the committed generations, the judge accepts no answer that
does not assert its reference, and (integration) the generations replay token for token on the real model."""

from __future__ import annotations

import json

import pytest

from eval import gate_judging

RESULTS = gate_judging.OUT


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


@pytest.mark.real_gate
def test_the_committed_figures_are_recomputed_from_the_committed_generations(committed):
    again = gate_judging.judge(committed)
    assert again["summary"] == committed["summary"]
    assert again["verdicts"] == committed["verdicts"]


@pytest.mark.real_gate
def test_the_gate_accepts_no_answer_that_does_not_assert_its_reference(committed):
    for group, figures in committed["summary"].items():
        assert figures["after"]["accepted_not_asserting"] == [], group
    assert committed["summary"]["problems"]["after"]["accepted"] >= committed["summary"]["problems"]["before"]["accepted"]


@pytest.mark.real_gate
def test_an_edited_generation_or_label_is_caught(committed):
    edited = json.loads(json.dumps(committed))
    edited["candidates"][0]["fact_run"]["token_ids"][0] += 1
    with pytest.raises(ValueError, match=r"the token ids do not hash to the recorded sha256$"):
        gate_judging.judge(edited)
    key = next(iter(gate_judging.LABELS))
    item, form, run = key.split("/")
    row = next(r for r in committed["candidates"] if (r["item"], r["form"]) == (item, form))
    changed = {**row, run: {**row[run], "text": row[run]["text"] + " Or not."}}
    with pytest.raises(ValueError, match=rf"^{key}: the label is for "):
        gate_judging.label(changed, run)


@pytest.mark.integration
def test_the_first_generations_replay_on_the_real_model(committed):
    data = gate_judging.collect(limit=2, log=lambda m: None)
    assert data["model_fingerprint"] == committed["model_fingerprint"]
    for got, want in zip(data["candidates"], committed["candidates"], strict=False):
        for run in gate_judging.RUNS:
            assert got[run]["token_ids"] == want[run]["token_ids"], (got["item"], run)
