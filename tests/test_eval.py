"""The evaluation harness on the tiny model: the results file carries what replay needs, replay
passes on an untouched file and fails (non-zero) when a token id or a data hash is altered."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from cli import evaluation as eval_cli
from eval import harness, recheck
from retrieval.embedder import HashEmbedder

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def data(tmp_path) -> tuple[Path, Path]:
    """Two facts from the dataset and two short problems of one template (one deposited, one
    held-out), as files: the tiny model's byte-level tokenizer and 512 positions need short items."""
    ks = harness.read_jsonl(ROOT / "datasets" / "knowledge.jsonl")[:2]
    dep = {
        "id": "p9001",
        "template": "add",
        "question": "What is 2 + 3?",
        "solution": "2 + 3 = 5.\nAnswer: 5",
        "answer": "5",
        "verifier": "numeric",
        "reference": "5",
        "split": "deposited",
    }
    held = dep | {
        "id": "p9002",
        "question": "What is 4 + 3?",
        "solution": "4 + 3 = 7.\nAnswer: 7",
        "answer": "7",
        "reference": "7",
        "split": "heldout",
    }
    kp, pp = tmp_path / "knowledge.jsonl", tmp_path / "problems.jsonl"
    kp.write_text("".join(json.dumps(r) + "\n" for r in ks))
    pp.write_text("".join(json.dumps(r) + "\n" for r in (dep, held)))
    return kp, pp


@pytest.fixture
def results_file(tiny_gemma, data, tmp_path) -> Path:
    import services

    cfg = harness.EvalConfig(knowledge_n=2, deposited_n=1, heldout_n=1, paraphrases=1, max_new_tokens=4, torch_threads=1)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    results = harness.evaluate(lib, cfg, data[0], data[1], log=lambda m: None)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    return path


def _cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    eval_cli.register(p.add_subparsers())
    args = p.parse_args(["replay-eval", *argv])
    return args.func(args)


def test_results_file_fields(results_file, tiny_gemma):
    r = json.loads(results_file.read_text())
    assert {"data", "model", "determinism", "config", "sample", "outputs", "scores", "counts", "cost"} <= set(r)
    assert "grafted_accuracy_recurring" in r["scores"]
    assert r["determinism"] == tiny_gemma.config.as_dict()
    assert r["model"]["fingerprint"] == tiny_gemma.fingerprint
    assert all(len(sha) == 64 for sha in r["data"].values())
    conds = {(o["set"], o["condition"]) for o in r["outputs"]}
    assert conds == set(harness.CONDITIONS)
    for o in r["outputs"]:
        assert isinstance(o["token_ids"], list) and o["output_sha256"]
    rec = [o for o in r["outputs"] if o["condition"] == "graft_recurring"]
    assert all(o["tier"] == "exact" and o["baseline"] is not None for o in rec)
    assert r["cost"]["baseline_measured"] == len(rec) == 3


def test_replay_passes_untouched(results_file):
    rep = recheck.recheck(results_file)
    assert rep.ok, rep.problems
    assert rep.checks["output_sha256"] == rep.outputs > 0
    assert rep.checks["decoded_text"] == rep.outputs  # decoded with the tokenizer files alone
    assert _cli([str(results_file)]) == 0


def test_replay_fails_on_altered_token_id(results_file, capsys):
    r = json.loads(results_file.read_text())
    r["outputs"][1]["token_ids"][0] += 1
    results_file.write_text(json.dumps(r))
    assert _cli([str(results_file)]) == 1
    assert "token ids hash to" in capsys.readouterr().out


def test_replay_fails_on_altered_data_hash(results_file, capsys):
    r = json.loads(results_file.read_text())
    path = next(iter(r["data"]))
    r["data"][path] = "0" * 64
    results_file.write_text(json.dumps(r))
    assert _cli([str(results_file)]) == 1
    assert f"data file {path}: sha256" in capsys.readouterr().out


def test_replay_fails_on_altered_score(results_file):
    r = json.loads(results_file.read_text())
    r["scores"]["grafted_accuracy_recurring"] = 1.5
    results_file.write_text(json.dumps(r))
    rep = recheck.recheck(results_file)
    assert not rep.ok and any("grafted_accuracy_recurring" in p for p in rep.problems)


def test_scores_on_accepted_items_and_gate_counts_are_replayed(results_file):
    r = json.loads(results_file.read_text())
    accepted = {d["item"] for d in r["deposits"]}
    rec = [o for o in r["outputs"] if o["condition"] == "graft_recurring" and o["item"] in accepted]
    assert r["scores"]["grafted_accuracy_recurring_accepted"] == sum(o["correct"] for o in rec) / len(rec)
    r["deposits"] = r["deposits"][1:]  # one accepted item silently dropped: the counts no longer add up
    results_file.write_text(json.dumps(r))
    rep = recheck.recheck(results_file)
    assert any(p.startswith("gate: ") for p in rep.problems), rep.problems
    assert any("recurring/graft_recurring/accepted" in p for p in rep.problems), rep.problems  # counts recomputed


def test_rerun_is_byte_exact_and_catches_a_changed_output(results_file, tiny_gemma, tmp_path):
    rep = recheck.recheck(results_file, rerun_model=True, lm=tiny_gemma)
    assert rep.ok, rep.problems
    assert rep.checks["rerun_token_ids"] == rep.outputs
    bad = tmp_path / "bad.json"
    shutil.copy(results_file, bad)
    r = json.loads(bad.read_text())
    o = r["outputs"][0]
    o["token_ids"] = o["token_ids"][:-1] + [o["token_ids"][-1] + 1] if o["token_ids"] else [1]
    from graft_core.generate import tokens_sha256

    o["output_sha256"] = tokens_sha256(o["token_ids"])  # consistent hash: only the rerun can catch it
    bad.write_text(json.dumps(r))
    rep = recheck.recheck(bad, rerun_model=True, lm=tiny_gemma)
    assert not rep.ok and any("rerun" in p for p in rep.problems)


def _recurring_rows() -> list[dict]:
    base = {"template": "ages", "verifier": "numeric", "split": "heldout"}
    return [
        base
        | {
            "id": f"p95{i:02d}",
            "question": f"How old is Ada if she is {i} + 1?",
            "solution": f"{i} + 1 = {i + 1}.",
            "answer": str(i + 1),
            "reference": str(i + 1),
        }
        for i in (11, 22, 33)
    ]


def test_recurring_case_counts_every_token_and_replays(tiny_gemma, tmp_path):
    import services
    from eval import recurring

    rows = _recurring_rows()
    cfg = recurring.RecurringConfig(problems=2, budget=240, max_candidates=3, max_new_tokens=4)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    case = recurring.run_case(lib, rows, cfg, log=lambda m: None)
    lib.close()
    rc = case["recurring_case"]
    assert set(rc) == {
        "problems",
        "budget_tokens_per_problem",
        "baseline_tokens_total",
        "baseline_solved",
        "failed_offered",
        "baseline_tokens_all_failed",
        "grafted_decode_tokens_total",
        "grafted_solved",
        "ratio",
    }
    failed = case["failed"]
    # the tiny model's gate verdict is the accepting test double: every failure's solution is accepted
    assert rc["problems"] == rc["failed_offered"] == len(failed) and rc["budget_tokens_per_problem"] == 240
    for rec in failed:
        assert sum(a["tokens"] for a in rec["attempts"]) == rec["baseline_tokens"] <= 240
        assert rec["baseline_tokens"] > 240 - len(rows[0]["question"]) - 8  # the budget was spent, not skipped
    assert rc["baseline_tokens_total"] == sum(r["baseline_tokens"] for r in failed)
    assert rc["grafted_decode_tokens_total"] == sum(r["grafted"]["decode_tokens"] for r in failed if "grafted" in r)
    grafted_base = sum(r["baseline_tokens"] for r in failed if "grafted" in r)  # like with like: grafted problems only
    assert rc["ratio"] == (
        round(grafted_base / rc["grafted_decode_tokens_total"], 1) if rc["grafted_decode_tokens_total"] else None
    )
    by_id = {r["id"]: r for r in rows}
    assert recurring.check_case(case, by_id)[0] == []
    bad = json.loads(json.dumps(case))
    bad["failed"][0]["attempts"][0]["tokens"] += 1
    problems, _ = recurring.check_case(bad, by_id)
    assert any("attempt" in p for p in problems)


def test_recurring_concluding_line_and_reuse_of_hash_checked_baselines(tiny_gemma, tmp_path):
    import services
    from eval import recurring

    assert recurring.concluding_line("a = 1.\nIn total: 84 minutes.\nAnswer: 84") == "In total: 84 minutes."
    assert recurring.concluding_line("2 + 3 = 5.") is None
    rows = _recurring_rows()
    cfg = recurring.RecurringConfig(problems=2, budget=240, max_candidates=3, max_new_tokens=4)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    first = recurring.run_case(lib, rows, cfg, log=lambda m: None)
    reuse = recurring.reusable(first, cfg)
    assert set(reuse) == {r["id"] for r in first["failed"] + first["solved_by_sampling"]}
    tampered = json.loads(json.dumps(first))
    tampered["failed"][0]["attempts"][0]["tokens"] += 1
    assert tampered["failed"][0]["id"] not in recurring.reusable(tampered, cfg)  # a record that no longer hash-checks
    assert recurring.reusable(first, recurring.RecurringConfig(problems=2, budget=241)) == {}  # another configuration
    lib2 = services.Library(home=tmp_path / "store2", embedder=HashEmbedder(), lm=tiny_gemma)
    again = recurring.run_case(lib2, rows, cfg, log=lambda m: None, reuse=reuse)
    lib.close()
    lib2.close()
    assert again["baseline_reused"] == [r["id"] for r in first["failed"] + first["solved_by_sampling"]]
    assert [r["attempts_sha256"] for r in again["failed"]] == [r["attempts_sha256"] for r in first["failed"]]
    assert again["recurring_case"] == first["recurring_case"]


def test_recurring_run_that_stops_resumes_from_its_checkpoint(tiny_gemma, tmp_path):
    """`progress` gets the records after each problem (eval.run --checkpoint writes them): a run stopped after its
    first problem resumes from what it saved, samples only the rest, and ends with the uninterrupted run's case."""
    import services
    from eval import recurring

    rows = _recurring_rows()
    cfg = recurring.RecurringConfig(problems=2, budget=240, max_candidates=3, max_new_tokens=4)

    def library(name):
        return services.Library(home=tmp_path / name, embedder=HashEmbedder(), lm=tiny_gemma)

    whole = recurring.run_case(library("whole"), rows, cfg, log=lambda m: None)
    saved = []

    class Stopped(Exception):
        pass

    def progress(partial):
        saved.append(json.loads(json.dumps(partial)))  # as the checkpoint file holds it
        raise Stopped

    with pytest.raises(Stopped):
        recurring.run_case(library("stopped"), rows, cfg, log=lambda m: None, progress=progress)
    reuse = recurring.reusable(saved[-1], cfg)
    first = (whole["failed"] + whole["solved_by_sampling"])[0]["id"]
    assert set(reuse) == {first}
    again = recurring.run_case(library("resumed"), rows, cfg, log=lambda m: None, reuse=reuse)
    assert again["baseline_reused"] == [first]
    assert [r["attempts_sha256"] for r in again["failed"]] == [r["attempts_sha256"] for r in whole["failed"]]
    assert again["recurring_case"] == whole["recurring_case"]


def test_recurring_problems_are_the_failures_with_an_accepted_solution(tiny_gemma, tmp_path, monkeypatch):
    """A failure whose verified solution the gate refuses is offered and counted, never a case problem;
    the case goes on to further candidates until it has its problems or runs out of candidates."""
    import services
    import verifiers
    from eval import recurring
    from services import gate

    monkeypatch.setattr(gate, "judge", lambda answer, v, r, q="": verifiers.Verdict(False, v, f"test double refused {answer!r}"))
    rows = _recurring_rows()
    cfg = recurring.RecurringConfig(problems=2, budget=240, max_candidates=3, max_new_tokens=4)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    case = recurring.run_case(lib, rows, cfg, log=lambda m: None)
    lib.close()
    rc, acc = case["recurring_case"], case["acceptance"]
    assert len(case["failed"]) == 3  # every candidate tried: none gave an accepted solution
    assert (rc["problems"], rc["failed_offered"], rc["grafted_decode_tokens_total"], rc["ratio"]) == (0, 3, 0, None)
    assert (acc["accepted"], acc["offered"]) == (0, 3) and rc["baseline_tokens_total"] == 0
    assert all(r["deposit"].startswith("refused: ") and "grafted" not in r for r in case["failed"])


@pytest.fixture
def tiny_chat(tmp_path):
    """A tiny Llama whose tokenizer carries SmolLM2's chat template (an instruct model, as the packaged SmolLM2 is),
    its output head tilted so that its answers span lines: the newline byte's row is the row of the byte its
    greedy answers repeat ('C'), a hair longer, so the newline wins where 'C' did (a random model's answers
    rarely hold a newline, and only one inside an answer tells the chat cut from the plain one)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from graft_core import model, tiny
    from tests.test_templates import CHATML

    folder = tiny.build("llama", tmp_path / "tiny-chat")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHATML
    tok.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    newline, c = tok.convert_tokens_to_ids(["Ċ", "C"])  # the byte-level symbols of "\n" and "C"
    weights["lm_head.weight"][newline] = weights["lm_head.weight"][c] * 1.01
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return model.load(str(folder))


def test_an_instruct_model_is_evaluated_through_its_chat_template_and_replayed(tiny_chat, data, tmp_path):
    """The harness cuts each answer as Library.answer does under the model's own template (to its end of turn,
    newlines and all), records that template, and replay cuts under it: cut in the plain form (at the first
    newline) the run's own assertion fails, and replay reports every multi-line answer."""
    import services
    from graft_core import templates

    assert templates.of(tiny_chat.tokenizer).chat
    cfg = harness.EvalConfig(knowledge_n=2, deposited_n=1, heldout_n=1, paraphrases=1, max_new_tokens=8, torch_threads=1)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_chat)
    results = harness.evaluate(lib, cfg, data[0], data[1], log=lambda m: None)
    lib.close()
    assert harness.recorded_template(json.loads(json.dumps(results))) == templates.of(tiny_chat.tokenizer)
    multiline = [o for o in results["outputs"] if "\n" in o["completion"].strip()]
    assert multiline, "no answer spans lines: this test could not tell the chat cut from the plain one"
    for o in results["outputs"]:
        assert o["answer"] == o["completion"].strip(), o  # the assistant's turn, to the end of turn
    assert all(templates.cut_answer(o["completion"]) != o["answer"] for o in multiline)  # what the plain cut would give
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    rep = recheck.recheck(path)
    assert rep.ok, rep.problems
    assert rep.checks["decoded_text"] == rep.outputs and rep.checks["template"] == 1
    plain = json.loads(path.read_text()) | {"template": harness.template_record(templates.PLAIN)}
    path.write_text(json.dumps(plain))
    rep = recheck.recheck(path)
    assert any(p.startswith("the tokenizer's template differs from the recorded one") for p in rep.problems), rep.problems
    assert sum("answer cut from the completion" in p for p in rep.problems) == len(multiline), rep.problems


def test_another_models_run_gets_its_own_page_and_plots(results_file, tmp_path):
    """results-<name>.json writes own-set-<name>.md and its plots under the same suffix, never the packaged Gemma's
    own-set.md or plots; the page names its own file, plots and command, and says how the model was asked."""
    from eval import report

    results = json.loads(results_file.read_text())
    folder = tmp_path / "docs"
    written = report.write(results, folder, "results-other.json")
    assert sorted(p.name for p in written) == ["accuracy-other.png", "decode_tokens-other.png", "own-set-other.md"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in written)
    md = (folder / "own-set-other.md").read_text()
    assert "from `docs/eval/results-other.json`" in md and "](accuracy-other.png)" in md
    assert f"--model {results['model']['name']} --out docs/eval/results-other.json --no-recurring" in md
    assert "chat template" not in md and "the newline that ends the answer" in md  # the tiny Gemma has none
    chat = results | {"template": {**results["template"], "chat": True}}
    md = report.markdown(chat, "results-other.json")
    assert "Asked through the model's own chat template" in md and "the end of turn that ends the answer" in md
    assert "grafted recurring answers reached the budget of 4 decode tokens" in md  # an instruct answer runs long
    assert "reads the verified answer back" in md
    problems = set(results["sample"]["problems_deposited"])
    none = results | {"deposits": [d for d in results["deposits"] if d["item"] not in problems]}
    assert f"the gate deposited none of the {len(problems)}, so none was in the store" in report.markdown(none)
    assert report.markdown(results) != md and "from `docs/eval/results.json`" in report.markdown(results)
