"""The flywheel-from-an-empty-store eval (eval/flywheel.py): on an empty store its first answer is the model alone's,
byte for byte (like with like), a passing attempt is deposited for later problems, and the curve is computed from
the records alone."""

from __future__ import annotations

import pytest

from eval import flywheel


def test_the_curve_is_cumulative_in_stream_order():
    rows = [
        {"position": 2, "first_ok": True, "tokens": 30},
        {"position": 0, "first_ok": False, "tokens": 100},
        {"position": 1, "first_ok": True, "tokens": 50},
    ]
    assert flywheel.curve(rows) == [
        {"problems": 1, "accuracy": 0.0, "tokens_per_problem": 100.0},
        {"problems": 2, "accuracy": 0.5, "tokens_per_problem": 75.0},
        {"problems": 3, "accuracy": 0.6667, "tokens_per_problem": 60.0},
    ]


@pytest.fixture
def two_libs(tmp_path, tiny_gemma):
    import services
    from retrieval import HashEmbedder

    libs = [services.Library(home=tmp_path / n, lm=tiny_gemma, embedder=HashEmbedder()) for n in ("a", "b")]
    yield libs
    for lib in libs:
        lib.close()


def test_on_an_empty_store_the_first_answer_is_the_model_alones_and_a_pass_is_deposited(two_libs, monkeypatch):
    monkeypatch.setattr(flywheel, "MAX_NEW_TOKENS", 3)
    monkeypatch.setattr(flywheel, "BUDGET", 200)
    item = {"id": "p", "template": 1, "seed": 1, "question": "How many pears?", "verifier": "numeric", "reference": "4"}
    fly, alone = two_libs
    a = flywheel.record(fly, item, 0, flywheel=True)
    b = flywheel.record(alone, item, 0, flywheel=False)
    assert a["first_answer"] == b["first_answer"] and a["first_artifacts"] == [] and b["attempts"] == 1
    assert (a["stream"], b["stream"]) == ("flywheel", "alone") and b["deposited"] is None
