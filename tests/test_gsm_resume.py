"""The recurring case's resume (eval/gsm_recurring.baseline with `earlier`): a run stopped by a judge that
accepted an attempt the current judge refuses goes on from the next seed with what is left of the budget, and
its attempts are then exactly an uninterrupted run's under the current judge (same seeds, same round sizes,
same token ids). On the tiny model: the bytes, not the answers, are what is compared."""

from __future__ import annotations

import pytest

from eval import gsm_recurring


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    import services
    from retrieval.embedder import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    yield lib
    lib.close()


def _greedy(lib) -> dict:
    from graft_core import generate

    q = "How many apples are in the basket?"
    ids = generate.encode_prompt(lib.lm, q, grafted=False, form="qa")
    return {"id": "gsm0001-original-qa", "question": q, "verifier": "numeric", "reference": "16",
            "computed_tokens": len(ids), "decode_tokens": 3, "output_sha256": "0" * 64, "answer": "no"}  # fmt: skip


def test_a_resumed_run_is_the_uninterrupted_run_under_the_current_judge(lib, monkeypatch):
    from graft_core.batch import Batcher

    batcher = Batcher(lib.lm.model, widths=(4,))
    cfg = gsm_recurring.CaseConfig(budget=900, together=4, max_new_tokens=8, form="qa")
    greedy = _greedy(lib)
    whole = gsm_recurring.baseline(lib, greedy, cfg, batcher)  # the current judge: nothing passes on a tiny model
    assert not whole["solved"] and gsm_recurring.exhausted(whole, cfg.as_dict())
    seeds = [a["seed"] for a in whole["attempts"] if a["mode"] == "sampled"]
    stop = seeds[5]  # the second round's second attempt: a run whose judge accepted it stops after its round
    real = gsm_recurring._passes
    lenient = {a["answer"] for a in whole["attempts"] if a["seed"] == stop}
    monkeypatch.setattr(gsm_recurring, "_passes", lambda row: lambda text: text in lenient)
    stopped = gsm_recurring.baseline(lib, greedy, cfg, batcher)
    assert stopped["solved"] and stopped["attempts_n"] < whole["attempts_n"]
    monkeypatch.setattr(gsm_recurring, "_passes", real)
    assert not gsm_recurring.exhausted(stopped, cfg.as_dict())  # undecided under the current judge
    resumed = gsm_recurring.baseline(lib, greedy, cfg, batcher, earlier=stopped)
    assert resumed["attempts_sha256"] == whole["attempts_sha256"]
    assert resumed["baseline_tokens"] == whole["baseline_tokens"] and not resumed["solved"]
    assert resumed["resumed_after"]["attempts"] == stopped["attempts_n"]
