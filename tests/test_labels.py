"""The judge against the labelled set (eval/labels.py, docs/eval/labels/): the committed report is what the
judge computes from the committed labels, the evaluation split agrees at least 98% with no false accept, every
drawn output is labelled with a reason and is the record its source holds, and the splits are the seeded ones."""

from __future__ import annotations

import hashlib
import json

import pytest

from eval import labels


@pytest.fixture(scope="module")
def labelled() -> list[dict]:
    return labels.read_labels()


@pytest.fixture(scope="module")
def again(labelled) -> dict:
    return labels.report(labelled)


def test_the_committed_report_is_the_judges_on_the_committed_labels(again):
    committed = json.loads(labels.REPORT.read_text(encoding="utf-8"))
    assert again == committed


def test_the_evaluation_split_meets_the_target(again):
    ev = again["splits"]["evaluation"]
    assert again["labels"] >= 300 and ev["outputs"] >= 100
    assert ev["false_accepts"] == 0, ev["false_accept_items"]
    assert ev["agreement"] >= 0.98, (ev["false_accept_items"], ev["false_refusal_items"])
    assert 0 < ev["labelled_right"] < ev["outputs"]  # both labels occur: agreement is not one-sided


def test_the_splits_are_the_seeded_ones(labelled):
    for r in labelled:
        rnd = labels.ROUNDS[r["round"] - 1]
        if r["stratum"] == "named in the issue":
            assert r["split"] == "development"
        elif r["round"] == 1 or (r["round"] == 2 and r["stratum"].startswith("gsm")):
            assert r["split"] == labels.split_of(rnd["seed"], r["id"]), r["id"]
        else:
            assert r["split"] == "evaluation"
        assert r["role"] == ("development" if r["round"] == 1 or r["id"] in labels.WRITTEN_ON else r["split"])
    assert len({r["id"] for r in labelled}) == len(labelled)


def _source_record(r: dict, doc: dict) -> str | None:
    """The answer the drawn output names in its source file (`doc`, loaded)."""
    results = gate = doc
    kind, *rest = r["id"].split("/")
    if kind == "recurring":
        rec = next(
            x for x in [*results["recurring"]["failed"], *results["recurring"]["solved_by_sampling"]] if x["id"] == rest[0]
        )
        return rec["grafted"]["answer"] if rest[1] == "recall" else rec["attempts"][int(rest[2])]["answer"]
    if kind == "outputs":
        return results["outputs"][int(rest[0])]["answer"]
    if kind == "gsm3":  # the GSM-Symbolic results file: a recurring attempt (problem, seed) or an output
        pid, what = rest[0], rest[1:]
        if what[0] == "seed":
            cases = [results[k] for k in ("recurring", "recurring_qa", "recurring_steps") if k in results]
            p = next(p for c in cases for p in c["problems"] if p["id"] == pid)
            return next(a["answer"] for a in p["attempts"] if str(a["seed"]) == what[1])
        return next(o["answer"] for o in results["outputs"] if o["id"] == pid and o["condition"] == what[0])
    if kind == "gate":
        item, form, run = rest
        row = next(x for x in gate["candidates"] if x["item"] == item and x["form"].replace(" ", "-") == form)
        return row[run]["text"]
    return None  # GSM outputs: the file is the eval's scratch output, recorded by its sha256 in sources.json


def test_each_drawn_output_is_its_sources_record(labelled):
    """Where a source file is still the one the round was drawn from (its sha256 in sources.json), each drawn
    answer is the record it names; a source since replaced (a new eval run) is reported, not compared."""
    sources = json.loads(labels.SOURCES.read_text(encoding="utf-8"))
    files = {"docs/eval/results.json": labels.RESULTS, "docs/bench/gate-judging.json": labels.GATE_JUDGING}
    files["docs/eval/gsm-results.json"] = labels.GSM_RESULTS
    now = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items()}
    loaded = {k: json.loads(p.read_text(encoding="utf-8")) for k, p in files.items()}
    compared = 0
    for r in labelled:
        drawn_from = sources[str(r["round"])]
        kind = r["id"].split("/")[0]
        path = {"gate": "docs/bench/gate-judging.json", "gsm3": "docs/eval/gsm-results.json"}.get(kind, "docs/eval/results.json")
        if kind in ("gsm", "gsm-graft") or drawn_from.get(path) != now[path]:  # round 2: scratch files
            continue
        doc = loaded[path]
        assert _source_record(r, doc) == r["answer"], r["id"]
        compared += 1
    if compared == 0:
        pytest.skip("every source was replaced since the draw: the drawn records stand as committed")


def test_a_wrong_label_or_a_missing_reason_is_caught(tmp_path, monkeypatch):
    drawn = [json.loads(x) for x in labels.ROUNDS[0]["drawn"].read_text(encoding="utf-8").splitlines()[:2]]
    d, r = tmp_path / "drawn.jsonl", tmp_path / "readings.jsonl"
    d.write_text("".join(json.dumps(x) + "\n" for x in drawn))
    r.write_text(json.dumps({"id": drawn[0]["id"], "label": "right", "reason": "x"}) + "\n")
    monkeypatch.setattr(labels, "ROUNDS", ({"seed": 40, "strata": {}, "drawn": d, "readings": r},))
    with pytest.raises(ValueError, match="every drawn output needs a label"):
        labels.read_labels()
    flipped = {"id": drawn[0]["id"], "label": "wrong", "reason": "x"}
    r.write_text("".join(json.dumps(x) + "\n" for x in (flipped, {"id": drawn[1]["id"], "label": "right", "reason": "y"})))
    rep = labels.report(labels.read_labels())
    named = drawn[0]["answer"]  # '84 minutes', the first named output, labelled wrong here
    assert rep["splits"]["development"]["false_accepts"] == 1
    assert rep["splits"]["development"]["false_accept_items"][0]["answer"] == named
