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


def test_the_windowed_curve_and_its_chart_come_from_the_records():
    rows = [{"position": i, "first_ok": i % 4 == 0 or i >= 6, "tokens": 10} for i in range(8)]
    assert flywheel.windowed(rows, width=4) == [
        {"problems": 4, "accuracy": 0.25},
        {"problems": 5, "accuracy": 0.25},
        {"problems": 6, "accuracy": 0.25},
        {"problems": 7, "accuracy": 0.5},
        {"problems": 8, "accuracy": 0.75},
    ]
    chart = flywheel.svg({"flywheel": flywheel.windowed(rows, 4), "alone": flywheel.windowed(rows[::-1], 4)}, title="t")
    assert chart.startswith("<svg") and chart.count("<path") == 2 and ">flywheel</text>" in chart
    # the last point of the flywheel line (problem 8, 0.75) sits at the right edge, three quarters up the axis
    assert "L592.0,104.0" in chart
    with pytest.raises(ValueError, match="no points"):
        flywheel.svg({"alone": []})


def test_a_window_of_problems_is_answered_at_once_and_recorded_in_stream_order(two_libs, monkeypatch, tmp_path):
    monkeypatch.setattr(flywheel, "MAX_NEW_TOKENS", 3)
    monkeypatch.setattr(flywheel, "BUDGET", 200)
    items = [
        {"id": f"p{i}", "template": i, "seed": 1, "question": f"How many pears are in basket {i}?"}
        | {"verifier": "numeric", "reference": "4"}
        for i in range(5)
    ]
    fly, alone = two_libs
    out = tmp_path / "flywheel-alone.jsonl"
    flywheel.run(alone, items[:3], out, flywheel=False, together=2, log=lambda m: None)
    flywheel.run(alone, items, out, flywheel=False, together=2, log=lambda m: None)  # resumes: only p3, p4
    rows = flywheel.benchmark.read_jsonl(out)
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "p3", "p4"] and [r["position"] for r in rows] == [0, 1, 2, 3, 4]
    one = flywheel.record(fly, items[3], 3, flywheel=False)  # a problem answered alone: the bytes of the window's
    assert one["first_answer"] == rows[3]["first_answer"]
