"""`solve` (the flywheel) and the relevance stage in `answer`: seeded sampling is deterministic, every
token is counted against the budget, a passing attempt is deposited through the gate, a recurring
question is recalled from the library with no new deposit, and near misses are not grafted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import retrieval.embedder
import services
import verifiers
from errors import InvalidInput
from graft_core import sampling
from retrieval import HashEmbedder
from services import AnswerOptions

NEAR_MISS = Path(__file__).parent / "data" / "near_miss.jsonl"


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    yield lib
    lib.close()


def test_sampling_is_deterministic_given_the_seed(tiny_gemma):
    a = sampling.attempt(tiny_gemma, "Who built the Varnek lighthouse?", 12, temperature=1.5, seed=7)
    b = sampling.attempt(tiny_gemma, "Who built the Varnek lighthouse?", 12, temperature=1.5, seed=7)
    others = {
        sampling.attempt(tiny_gemma, "Who built the Varnek lighthouse?", 12, temperature=1.5, seed=s).token_ids for s in range(4)
    }
    assert a.token_ids == b.token_ids and (a.seed, a.temperature, a.mode) == (7, 1.5, "sampled")
    assert len(others) > 1, "four seeds drew the same 12 tokens: the seed does not reach the sampler"
    assert a.tokens_computed == a.prompt_tokens + len(a.token_ids)


def test_budget_of_a_few_tokens_ends_unsolved_with_every_token_counted(lib):
    q = "Who built the Varnek lighthouse?"
    prompt = sampling.prompt_tokens(lib.lm, q)
    r = lib.solve(q, "exact", "Osric Pellamy", budget=prompt + 3)
    j = r.to_json()
    assert set(j) == {"solved", "source", "id", "answer", "attempts", "tokens_spent", "budget"}
    assert (j["solved"], j["source"], j["id"], j["budget"]) == (False, "none", None, prompt + 3)
    assert j["tokens_spent"] == sum(a["tokens"] for a in j["attempts"]) <= prompt + 3
    assert j["attempts"] and j["attempts"][0]["tokens"] > prompt  # the prompt and at least one decoded token
    assert lib.count() == 0
    assert lib.solves()[-1]["tokens_spent"] == j["tokens_spent"]


def test_sampled_attempts_follow_greedy_with_recorded_seeds(lib):
    q = "Who built the Varnek lighthouse?"
    r = lib.solve(q, "exact", "Osric Pellamy", budget=100_000, attempts=4, seed=11, temperature=1.2, max_new_tokens=4)
    modes = [(a.mode, a.seed, a.temperature) for a in r.attempts]
    assert modes == [("greedy", None, 0.0), ("sampled", 11, 1.2), ("sampled", 12, 1.2), ("sampled", 13, 1.2)]
    assert not r.solved and r.tokens_spent == sum(a.tokens for a in r.attempts)


def _greedy_or_skip(lib, q: str):
    """The tiny model's greedy answer to `q`, the reference a solve of it will pass (skip when it is empty)."""
    greedy = sampling.attempt(lib.lm, q, 8)
    if not greedy.text:
        pytest.skip("the tiny model's greedy answer is empty; the real-model test covers deposit")
    return greedy


def test_a_passing_greedy_attempt_is_deposited_as_verified(lib):
    q = "Who built the Varnek lighthouse?"
    greedy = _greedy_or_skip(lib, q)
    r = lib.solve(q, "exact", greedy.text, budget=1000, max_new_tokens=8)
    assert (r.solved, r.source, r.answer) == (True, "model", greedy.text)
    shown = lib.show(r.id)
    assert shown.source.question == q and shown.source.answer == greedy.text
    assert shown.verifications[-1].verdict == "pass"


def test_solve_refuses_bad_arguments_before_any_work(lib):
    with pytest.raises(InvalidInput, match="unknown verifier"):
        lib.solve("What is 2 + 2?", "guess", "4")
    with pytest.raises(InvalidInput, match="budget"):
        lib.solve("What is 2 + 2?", "numeric", "4", budget=0)
    assert lib.solves() == []


def test_near_misses_are_retrieved_but_not_grafted(lib):
    rows = [json.loads(x) for x in NEAR_MISS.read_text(encoding="utf-8").splitlines() if x.strip()]
    misses = [r for r in rows if r["expect"] == "refuse"][:8]
    assert misses, "tests/data/near_miss.jsonl holds no near misses"
    for item in dict.fromkeys(r["item"] for r in misses):
        lib.deposit_item(item, "A stored fact.", "x", "exact", "x")
    for r in misses:
        res = lib.answer(r["question"], AnswerOptions(k=3, threshold=0.0, max_new_tokens=2, record=False))
        own = [h for h in res.retrieved if lib.show(h.id).source.question == r["item"]]
        assert own and not own[0].relevant and own[0].reason, r
        assert not any(h.id in res.artifact_ids for h in own), f"near miss grafted: {r['question']!r} -> {r['item']!r}"


@pytest.mark.integration
def test_solve_learns_then_recalls_on_the_real_model(tmp_path, real_lm):
    lib = services.Library(home=tmp_path / "real", lm=real_lm)
    q = "What is 2 + 2?"
    first = lib.solve(q, "numeric", "4", budget=2000)
    assert (first.solved, first.source) == (True, "model"), first.to_json()
    assert lib.count() == 1 and lib.show(first.id).source.answer == first.answer
    para = lib.answer("What do you get when you add 2 and 2?")
    assert para.artifact_ids and para.artifact_ids[-1] == first.id, para.to_json()
    assert verifiers.judge(para.answer, "numeric", "4", q).ok, para.to_json()  # the same judge as the solve's
    again = lib.solve(q, "numeric", "4", budget=2000)
    assert (again.solved, again.source, again.id) == (True, "library", first.id)
    assert [a.mode for a in again.attempts] == ["library"] and lib.count() == 1
    lib.close()


def test_flywheel_counts_discovery_against_each_recall(lib):
    from web import views

    q = "Who built the Varnek lighthouse?"
    greedy = _greedy_or_skip(lib, q)
    r = lib.solve(q, "exact", greedy.text, budget=1000, max_new_tokens=8)
    recall = lib.answer(q, AnswerOptions(max_new_tokens=4, threshold=0.0))
    assert recall.artifact_ids[-1] == r.id
    f = lib.flywheel()
    assert [n for _, n in f.growth] == [lib.count()] == [1]
    (item,) = f.items
    assert item == (r.id, r.tokens_spent, float(recall.computed_tokens + recall.decode_tokens), 1)
    assert f.cumulative_saved[-1][1] == max(0, r.tokens_spent - recall.computed_tokens - recall.decode_tokens)
    assert len(views.flywheel_plot(f).axes) == 3
    head, rows = views.solve_summary(r)
    assert "deposited" in head and len(rows) == len(r.attempts)


def test_cli_solve_json_and_exit_codes(tiny_dirs, kvgraft_home, capsys, monkeypatch):
    import cli

    monkeypatch.setattr(retrieval.embedder, "SentenceEmbedder", HashEmbedder)  # what Library.embedder makes
    base = ["--home", str(kvgraft_home), "--model", str(tiny_dirs["gemma3"]), "solve", "Who built the Varnek lighthouse?"]
    code = cli.main([*base, "--verifier", "exact", "--reference", "Osric Pellamy", "--budget", "120", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and set(out) == {"solved", "source", "id", "answer", "attempts", "tokens_spent", "budget"}
    assert out["solved"] is False and 0 < out["tokens_spent"] <= 120 == out["budget"]
    code = cli.main([*base, "--verifier", "exact", "--reference", "x", "--budget", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: budget must be between 1") and "Traceback" not in err


def test_free_text_is_kept_only_when_it_names_what_is_asked():
    from retrieval import relevance

    sheet = "Zorblat is the capital of Quendia. Its tallest bridge is the Ivory Span."
    assert relevance.decide_document("What is the capital of Quendia?", sheet, 0.5).relevant
    no = relevance.decide_document("What is the capital of Spain?", sheet, 0.5)
    assert not no.relevant and no.missing == ("spain",)
