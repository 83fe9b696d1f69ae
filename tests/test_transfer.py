"""The held-out transfer eval's machinery (eval/transfer.py, eval/transfer_report.py): the control is an unrelated
example used once, the few-shot conditions count what each computes and the grafted one is the prefilled one byte
for byte, and every figure is recomputed from the stored records (a changed answer changes it)."""

from __future__ import annotations

import copy

import pytest

from eval import transfer, transfer_report


def test_the_control_is_another_templates_accepted_deposit_for_every_problem():
    accepted = {t: f"art{t}" for t in (1, 2, 3, 5, 8, 13)}
    got = transfer.controls(accepted, list(range(15)), seed=0)
    assert sorted(got) == list(range(15)) and all(got[t] != accepted.get(t) for t in got)
    assert set(got.values()) <= set(accepted.values())
    assert got == transfer.controls(accepted, list(reversed(range(15))), seed=0)  # the order asked does not matter
    assert got != transfer.controls(accepted, list(range(15)), seed=1)
    assert transfer.controls({4: "only"}, [4, 5], seed=0) == {5: "only"}


def _row(i: int, condition: str, answer: str, ids: list[int], artifacts: list[str], computed: int, decode: int) -> dict:
    from graft_core.generate import tokens_sha256

    return {
        "id": f"gsm{i:04d}-numbers-s{i}",
        "set": "numbers",
        "template": i,
        "question": "How many?",
        "verifier": "numeric",
        "reference": "7",
        "condition": condition,
        "answer": answer,
        "output_token_ids": ids,
        "output_sha256": tokens_sha256(ids),
        "computed_tokens": computed,
        "decode_tokens": decode,
        "grafted_tokens": 40 if artifacts else 0,
        "artifact_ids": artifacts,
        "seconds": 1.0,
    }


def _records() -> list[dict]:
    rows = []
    for i in range(4):
        rows.append(_row(i, "zero-shot", "The answer is 7." if i == 0 else "The answer is 3.", [1, 2], [], 30, 10))
        rows.append(_row(i, "few-shot", "The answer is 7.", [5, 6], [], 930, 10))
        rows.append(_row(i, "few-shot-grafted", "The answer is 7.", [5, 6] if i else [5, 9], ["ex"], 30, 10))
        rows.append(_row(i, "transfer", "The answer is 7.", [7], [f"lib{i}"] if i < 3 else ["lib0"], 30, 10))
        rows.append(_row(i, "control", "The answer is 3.", [8], ["lib9"], 30, 10))
    return rows


def test_the_summary_is_computed_from_the_records():
    library = {i: f"lib{i}" for i in range(4)}
    s = transfer_report.summarise(_records(), library)
    assert s["problems"] == 4
    assert [s["conditions"][c]["correct"] for c in transfer.CONDITIONS] == [1, 4, 4, 4, 0]
    assert s["conditions"]["few-shot"]["prompt_tokens_computed_per_answer"] == 930.0
    assert s["conditions"]["few-shot-grafted"]["grafted_tokens_per_answer"] == 40.0
    assert s["differences"]["transfer lift"]["value"] == 0.75 and s["differences"]["control lift"]["value"] == -0.25
    assert s["few_shot_identical_outputs"] == [3, 4]
    assert s["transfer_grafted"] == {"sibling": 3, "another": 1, "nothing": 0}
    changed = copy.deepcopy(_records())
    changed[0]["answer"] = "The answer is 3."  # zero-shot on problem 0 now wrong: the figures follow the answer
    assert transfer_report.summarise(changed, library)["conditions"]["zero-shot"]["correct"] == 0
    partial = [r for r in _records() if not (r["condition"] == "control" and r["template"] > 1)]
    p = transfer_report.summarise(partial, library)  # a condition still running: each figure over what it answered
    assert p["conditions"]["control"]["answered"] == 2 and p["conditions"]["transfer"]["answered"] == 4
    assert p["differences"]["transfer over control"]["problems"] == 2 and p["differences"]["transfer lift"]["problems"] == 4


def test_the_offline_recheck_finds_an_edited_figure_and_a_forged_hash():
    from eval.recheck import RecheckReport

    rows = _records()
    results = {
        "format": transfer_report.FORMAT,
        "judge": {"sha256": "x"},
        "deposits": [{"template": i, "verdict": "accepted", "artifact": f"lib{i}"} for i in range(4)],
        "outputs": rows,
        "summary": transfer_report.summarise(rows, {i: f"lib{i}" for i in range(4)}),
    }
    rep = RecheckReport(path="t")
    transfer_report.recheck(results, rep)
    assert rep.ok, rep.problems
    page = transfer_report.page(
        results
        | {
            "model": {"model": "m"},
            "benchmark": {"package": "p", "version": "v", "library": "l", "held_out": "h"},
            "config": {"prompt": "q", "max_new_tokens": 4},
        },
        "m",
    )
    assert "| transfer lift (transfer - zero-shot) | 4 | 4 vs 1 | 0.75 |" in page
    assert "Grafted few-shot answers byte-identical to the prefilled ones: 3 of 4." in page
    results["summary"]["conditions"]["transfer"]["correct"] = 1
    results["outputs"][1]["output_sha256"] = "0" * 64
    rep = RecheckReport(path="t")
    transfer_report.recheck(results, rep)
    assert rep.problems == [
        "few-shot gsm0000-numbers-s0: output_sha256 is not the hash of its token ids",
        "the summary recomputed from the stored outputs differs from the stored summary",
    ]


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    yield lib
    lib.close()


def test_few_shot_grafted_is_the_prefilled_answer_at_the_cost_of_the_question(lib, monkeypatch):
    """The same exemplars and question both ways: the grafted answer's token ids are the prefilled one's; the
    prefilled side computes the exemplars' tokens on every question, the grafted side reads them."""
    monkeypatch.setattr(transfer, "MAX_NEW_TOKENS", 4)
    ex = lib.deposit_text("Q: Ann has 2 pears and buys 3. How many?\nA: 2 + 3 = 5. The answer is 5.", title="shots", admin=True)
    item = {"id": "p1", "set": "numbers", "template": 1, "id_orig": 1, "seed": 1, "question": "How many apples?"}
    item |= {"verifier": "numeric", "reference": "3"}
    prefilled, grafted = transfer.ask(lib, item, "few-shot", ex.id)
    assert (prefilled["condition"], grafted["condition"]) == ("few-shot", "few-shot-grafted")
    assert prefilled["output_token_ids"] == grafted["output_token_ids"] and grafted["output_token_ids"]
    assert grafted["grafted_tokens"] == ex.tokens and prefilled["grafted_tokens"] == 0
    assert prefilled["computed_tokens"] == grafted["computed_tokens"] + ex.tokens
    (zero,) = transfer.ask(lib, item, "zero-shot")
    assert zero["grafted_tokens"] == 0 and zero["artifact_ids"] == []


def test_replay_eval_rechecks_a_transfer_results_file_offline(tmp_path, capsys):
    import json

    import cli

    rows = _records()
    results = {
        "format": transfer_report.FORMAT,
        "judge": {"sha256": "x"},
        "deposits": [{"template": i, "verdict": "accepted", "artifact": f"lib{i}"} for i in range(4)],
        "summary": transfer_report.summarise(rows, {i: f"lib{i}" for i in range(4)}),
        "outputs": rows,
    }
    path = tmp_path / "transfer.json"
    path.write_text(json.dumps(results), encoding="utf-8")
    assert cli.main(["replay-eval", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"OK: {path}: 20 outputs; checked 20 output hashes, 1 figures re-derived")
    results["outputs"][3]["answer"] = "The answer is 3."  # transfer on problem 0 now wrong: the stored figures are not its
    path.write_text(json.dumps(results), encoding="utf-8")
    assert cli.main(["replay-eval", str(path)]) == 1


def test_the_library_phase_deposits_several_at_once(lib, tmp_path):
    """`eval.gsm_run deposit`'s loop: every item through the real gate, THREADS at once through the decode group, one
    record each (accepted or refused, as the gate said), and a second run over the same file deposits nothing new."""
    from eval import benchmark

    items = [
        {"id": f"t{i}", "set": "original", "template": i, "id_orig": i, "question": f"Who keeps lighthouse {i}?"}
        | {"solution": f"Lighthouse {i} is kept by Mira Tolland the {i}th.", "verifier": "exact"}
        | {"reference": f"Mira Tolland the {i}th"}
        for i in range(3)
    ]
    out, lines = tmp_path / "deposits.jsonl", []
    rows = benchmark.deposit_all(lib, items, out, lines.append)
    assert sorted(r["id"] for r in benchmark.read_jsonl(out)) == ["t0", "t1", "t2"] == sorted(r["id"] for r in rows)
    for r in rows:  # what the store says agrees with each record
        if r["verdict"] == "accepted":
            assert lib.store.catalog.get(r["artifact"]).id == r["artifact"]
        else:
            assert r["verdict"] == "refused" and "nothing deposited" in r["detail"]
    assert len(lines) == 3 and all(line.startswith("deposit t") for line in lines)
    assert lib.turns.decode_group() is not None or "one at a time" in lib.start_decoding_together()


def test_a_refusal_under_an_older_judge_is_superseded_by_the_item_offered_again():
    from eval import benchmark

    rows = [
        {"id": "a", "verdict": "refused", "judge": "kvgraft-judge/5"},
        {"id": "b", "verdict": "accepted", "judge": "kvgraft-judge/5"},
        {"id": "a", "verdict": "accepted", "judge": "kvgraft-judge/6"},
    ]
    assert benchmark.latest_deposits(rows) == rows[1:]


def test_the_rerun_loads_the_model_the_results_name_not_the_default(monkeypatch, tmp_path):
    """`replay-eval --rerun` on a results file of another model than the default asks for that model by name."""
    from types import SimpleNamespace

    import services
    from eval.recheck import RecheckReport

    asked = []

    class Loaded:  # stands in for services.Library: records what it was asked to load
        def __init__(self, home=None, model_name=None, **kw):
            asked.append(model_name)
            self.lm = SimpleNamespace(fingerprint="b" * 64)

        def close(self):
            pass

    monkeypatch.setattr(services, "Library", Loaded)
    results = {"model": {"model": "packaged:some-model", "model_fingerprint": "a" * 64}, "outputs": [], "deposits": []}
    rep = RecheckReport(path="t")
    transfer_report.rerun(results, rep, 1)
    assert asked == ["packaged:some-model"]
    assert rep.problems == [f"the model here has fingerprint {'b' * 12}, the results' is {'a' * 12}"]
