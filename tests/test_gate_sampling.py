"""The recurring case's batched sampler (eval/sampling.py) on the tiny model: each attempt decoded together
with others is the attempt `graft_core.sampling.attempt` draws alone with its seed, token for token; every
computed token is counted once, where it is computed; the budget is never passed."""

from __future__ import annotations

import pytest

from eval import sampling as batched

Q = "How many times does the Velmora bell ring at noon?"


@pytest.fixture(scope="module")
def batcher(tiny_gemma):
    from graft_core.batch import Batcher

    b = Batcher(tiny_gemma.model)
    assert b.most > 1, b.why  # otherwise this file would test one-at-a-time stepping only
    return b


def test_attempts_decoded_together_are_each_attempt_alone(tiny_gemma, batcher):
    from graft_core import sampling

    got = batched.sample_many(tiny_gemma, Q, 400, lambda t: False, together=5, max_new_tokens=6, seed=3, batcher=batcher)
    assert [a.seed for a in got.attempts[:5]] == [3, 4, 5, 6, 7] and len(got.rounds[0].attempts) == 5
    for a in got.attempts[:5]:
        alone = sampling.attempt(tiny_gemma, Q, 6, temperature=0.8, seed=a.seed)
        assert (a.token_ids, a.text) == (alone.token_ids, alone.text), a.seed
    assert len({a.token_ids for a in got.attempts}) > 1  # the seeds draw different attempts


def test_thirty_two_attempts_in_one_pass_are_each_attempt_alone(tiny_gemma):
    """The recurring case samples 32 at a time (eval/run.py --recurring-together 32): a Batcher asked for width
    32 keeps it only where each row is its own (fma16), and every attempt is then the one drawn alone."""
    from graft_core import sampling
    from graft_core.batch import Batcher

    wide = Batcher(tiny_gemma.model, widths=(4, 8, 16, 32))
    got = batched.sample_many(tiny_gemma, Q, 10_000, lambda t: False, together=32, max_new_tokens=5, seed=7, batcher=wide)
    first = got.rounds[0].attempts
    assert [a.seed for a in first] == list(range(7, 39))
    for a in first:
        alone = sampling.attempt(tiny_gemma, Q, 5, temperature=0.8, seed=a.seed)
        assert (a.token_ids, a.text) == (alone.token_ids, alone.text), a.seed
    if wide.fma16:
        assert wide.most == 32


def test_every_computed_token_is_counted_and_the_budget_holds(tiny_gemma, batcher):
    from graft_core import sampling

    prompt = sampling.prompt_tokens(tiny_gemma, Q)
    budget = 3 * (prompt + 4 * 6) + prompt + 6  # three full rounds of four, then room for one attempt
    got = batched.sample_many(tiny_gemma, Q, budget, lambda t: False, together=4, max_new_tokens=6, batcher=batcher)
    assert [len(r.attempts) for r in got.rounds] == [4, 4, 4, 1]
    assert got.tokens == sum(prompt + sum(len(a.token_ids) for a in r.attempts) for r in got.rounds) <= budget
    assert [a.seed for a in got.attempts] == list(range(13)) and not got.solved


def test_sampling_stops_at_the_round_with_a_passing_attempt(tiny_gemma, batcher):
    from graft_core import sampling

    two_rounds = 2 * (sampling.prompt_tokens(tiny_gemma, Q) + 4 * 6)
    first = batched.sample_many(tiny_gemma, Q, two_rounds, lambda t: False, together=4, max_new_tokens=6, batcher=batcher)
    target = first.attempts[5].text  # the sixth attempt's answer (second round) passes
    assert target and target not in {a.text for a in first.attempts[:4]}
    got = batched.sample_many(tiny_gemma, Q, 10_000, lambda t: t == target, together=4, max_new_tokens=6, batcher=batcher)
    assert len(got.rounds) == 2 and got.solved and got.attempts[5].passed


def test_a_budget_below_one_attempt_runs_nothing(tiny_gemma, batcher):
    from graft_core import sampling

    prompt = sampling.prompt_tokens(tiny_gemma, Q)
    got = batched.sample_many(tiny_gemma, Q, prompt + 5, lambda t: False, max_new_tokens=6, batcher=batcher)
    assert got.rounds == () and got.tokens == 0 and not got.solved


def test_the_recurring_case_batched_counts_every_token_within_a_small_budget_and_replays(tiny_gemma, tmp_path):
    """The recurring case with `batched`: greedy alone, then rounds decoded together; each round's prompt is
    counted once (on its first attempt), every decode token on its attempt; the records replay offline."""
    import json

    import services
    from eval import recurring
    from graft_core import sampling
    from retrieval.embedder import HashEmbedder

    rows = [
        {"id": f"p95{i:02d}", "template": "ages", "verifier": "numeric", "split": "heldout", "answer": str(i + 1)}
        | {"question": f"How old is Ada if she is {i} + 1?", "solution": f"{i} + 1 = {i + 1}.", "reference": str(i + 1)}
        for i in (11, 22)
    ]
    cfg = recurring.RecurringConfig(problems=2, budget=300, max_candidates=2, max_new_tokens=4, batched=True, together=4)
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    case = recurring.run_case(lib, rows, cfg, log=lambda m: None)
    lib.close()
    assert case["failed"], "the tiny model solved both: nothing was sampled to the budget"
    for rec in case["failed"]:
        prompt = sampling.prompt_tokens(tiny_gemma, _row(rows, rec["id"])["question"])
        greedy, *sampled = rec["attempts"]
        assert greedy["mode"] == "greedy" and greedy["prompt_tokens"] == prompt
        rounds = [a for a in sampled if a["prompt_tokens"]]
        assert all(a["prompt_tokens"] == prompt for a in rounds) and len(rounds) == -(-len(sampled) // 4)
        assert [a["seed"] for a in sampled] == list(range(len(sampled)))
        assert rec["baseline_tokens"] == sum(a["tokens"] for a in rec["attempts"]) <= 300
        assert rec["baseline_tokens"] > 300 - prompt - 4 * 4  # another round of four would not have fitted
    assert recurring.check_case(case, {r["id"]: r for r in rows})[0] == []
    bad = json.loads(json.dumps(case))
    bad["failed"][0]["attempts"][-1]["tokens"] += 1
    assert any("do not sum" in p for p in recurring.check_case(bad, {r["id"]: r for r in rows})[0])


def _row(rows: list[dict], pid: str) -> dict:
    return next(r for r in rows if r["id"] == pid)


def test_with_the_gate_first_a_refused_solution_is_never_sampled(tiny_gemma, tmp_path, monkeypatch):
    """`gate_first`: each candidate's verified solution goes to the gate before any sampling; a refused one is
    recorded in `gate_refused` with its tries, never sampled, and counted in the acceptance; the records replay."""
    import services
    import verifiers
    from eval import recurring
    from retrieval.embedder import HashEmbedder
    from services import gate

    rows = [
        {"id": f"p95{i:02d}", "template": "ages", "verifier": "numeric", "split": "heldout", "answer": str(i + 1)}
        | {"question": f"How old is Ada if she is {i} + 1?", "solution": f"{i} + 1 = {i + 1}.", "reference": str(i + 1)}
        for i in (11, 22, 33)
    ]
    refuse = rows[1]["question"]
    real = gate.judge

    def judge(answer, v, r, q=""):
        return verifiers.Verdict(False, v, "test double refused") if q == refuse else real(answer, v, r, q)

    monkeypatch.setattr(gate, "judge", judge)
    sampled = []
    real_baseline = recurring._baseline
    monkeypatch.setattr(recurring, "_baseline", lambda lib, row, *a: sampled.append(row["id"]) or real_baseline(lib, row, *a))
    cfg = recurring.RecurringConfig(
        problems=3, budget=200, max_candidates=3, max_new_tokens=4, batched=True, together=4, gate_first=True
    )
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder(), lm=tiny_gemma)
    case = recurring.run_case(lib, rows, cfg, log=lambda m: None)
    lib.close()
    assert [r["id"] for r in case["gate_refused"]] == [rows[1]["id"]] and rows[1]["id"] not in sampled
    assert sorted(sampled) == sorted(r["id"] for r in rows if r["question"] != refuse)
    acc = case["acceptance"]
    assert (acc["offered"], acc["accepted"]) == (3, 2)
    assert recurring.check_case(case, {r["id"]: r for r in rows})[0] == []
