"""The recurring case's batched sampler (eval/sampling.py) on the tiny model: each attempt decoded together
with others is the attempt `graft_core.sample.attempt` draws alone with its seed, token for token; every
computed token is counted once, where it is computed; the budget is never passed."""

from __future__ import annotations

import pytest

from eval import sampling

Q = "How many times does the Velmora bell ring at noon?"


@pytest.fixture(scope="module")
def batcher(tiny_gemma):
    from graft_core.batch import Batcher

    b = Batcher(tiny_gemma.model)
    assert b.most > 1, b.why  # otherwise this file would test one-at-a-time stepping only
    return b


def test_attempts_decoded_together_are_each_attempt_alone(tiny_gemma, batcher):
    from graft_core import sample

    got = sampling.sample_many(tiny_gemma, Q, 400, lambda t: False, together=5, max_new_tokens=6, seed=3, batcher=batcher)
    assert [a.seed for a in got.attempts[:5]] == [3, 4, 5, 6, 7] and len(got.rounds[0].attempts) == 5
    for a in got.attempts[:5]:
        alone = sample.attempt(tiny_gemma, Q, 6, temperature=0.8, seed=a.seed)
        assert (a.token_ids, a.text) == (alone.token_ids, alone.text), a.seed
    assert len({a.token_ids for a in got.attempts}) > 1  # the seeds draw different attempts


def test_every_computed_token_is_counted_and_the_budget_holds(tiny_gemma, batcher):
    from graft_core import sample

    prompt = sample.prompt_tokens(tiny_gemma, Q)
    budget = 3 * (prompt + 4 * 6) + prompt + 6  # three full rounds of four, then room for one attempt
    got = sampling.sample_many(tiny_gemma, Q, budget, lambda t: False, together=4, max_new_tokens=6, batcher=batcher)
    assert [len(r.attempts) for r in got.rounds] == [4, 4, 4, 1]
    assert got.tokens == sum(prompt + sum(len(a.token_ids) for a in r.attempts) for r in got.rounds) <= budget
    assert [a.seed for a in got.attempts] == list(range(13)) and not got.solved


def test_sampling_stops_at_the_round_with_a_passing_attempt(tiny_gemma, batcher):
    from graft_core import sample

    two_rounds = 2 * (sample.prompt_tokens(tiny_gemma, Q) + 4 * 6)
    first = sampling.sample_many(tiny_gemma, Q, two_rounds, lambda t: False, together=4, max_new_tokens=6, batcher=batcher)
    target = first.attempts[5].text  # the sixth attempt's answer (second round) passes
    assert target and target not in {a.text for a in first.attempts[:4]}
    got = sampling.sample_many(tiny_gemma, Q, 10_000, lambda t: t == target, together=4, max_new_tokens=6, batcher=batcher)
    assert len(got.rounds) == 2 and got.solved and got.attempts[5].passed


def test_a_budget_below_one_attempt_runs_nothing(tiny_gemma, batcher):
    from graft_core import sample

    prompt = sample.prompt_tokens(tiny_gemma, Q)
    got = sampling.sample_many(tiny_gemma, Q, prompt + 5, lambda t: False, max_new_tokens=6, batcher=batcher)
    assert got.rounds == () and got.tokens == 0 and not got.solved
