"""`cli.py judge`: the one judge from the command line (one answer, or a JSON-lines file), its output, its exit
codes (0 accepted / every line judged, 1 refused, 2 an input error) and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli
import verifiers

ROOT = Path(__file__).resolve().parent.parent
TRAINS = "How many minutes after the first train departs do they meet?"


def test_one_answer_prints_the_verdict_the_value_and_why(capsys):
    assert cli.main(["judge", "84 minutes", "--verifier", "numeric", "--reference", "84", "--question", TRAINS]) == 0
    assert capsys.readouterr().out == (
        "accepted: read from '84 minutes': it asserts '84 minutes'; answer '84' matches reference '84' (numeric, rel tol 1e-09)\n"
        "value read: '84'\n"
    )
    assert cli.main(["judge", "Wen = 40 + 4 * 4", "--verifier", "numeric", "--reference", "56"]) == 1
    assert capsys.readouterr().out == (
        "refused: answer 'Wen = 40 + 4 * 4': it writes '40 + 4 * 4' without working it out: it asserts no value; "
        "nothing is asserted that numeric can accept\nvalue read: none\n"
    )


def test_one_answer_as_json_is_the_judges_verdict(capsys):
    answer = "48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72 in all.\n#### 72"
    assert cli.main(["judge", answer, "--verifier", "numeric", "--reference", "72", "--json"]) == 0
    v = verifiers.judge(answer, "numeric", "72")
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "value": "72",
        "why": v.detail,
        "verifier": "numeric",
        "judge": verifiers.JUDGE,
    }


def test_jsonl_prints_one_verdict_per_line_in_order(tmp_path, capsys):
    rows = [
        {"answer": "Priya is 44 years old now.", "verifier": "numeric", "reference": "44", "question": "In 11 years ..."},
        {"answer": "Priya's age = (4x22) / 2 =", "verifier": "numeric", "reference": "44"},
        {"answer": "The flag is saffron.", "verifier": "exact", "reference": "saffron"},
    ]
    f = tmp_path / "outputs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n", encoding="utf-8")
    assert cli.main(["judge", "--jsonl", str(f)]) == 0
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(g["line"], g["ok"], g["value"]) for g in got] == [(1, True, "44"), (2, False, None), (3, True, "saffron")]
    for g, r in zip(got, rows, strict=True):
        assert g["why"] == verifiers.judge(r["answer"], r["verifier"], r["reference"], r.get("question", "")).detail


def test_jsonl_reports_a_line_it_cannot_judge_and_goes_on(tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text(
        '{"answer": "42", "verifier": "numeric", "reference": "forty-two"}\n[1]\n{"answer": 42}\n'
        '{"answer": "42", "verifier": "numeric", "reference": "42"}\n',
        encoding="utf-8",
    )
    assert cli.main(["judge", "--jsonl", str(f)]) == 2
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [g["line"] for g in got] == [1, 2, 3, 4]
    assert got[0]["error"].startswith("reference 'forty-two' is not a number; write e.g. ")
    assert got[1]["error"] == "not a JSON object"
    assert got[2]["error"] == "answer, verifier, reference must be text"
    assert got[3]["ok"] is True and "error" not in got[3]


def test_missing_arguments_and_input_errors_are_one_line(capsys):
    with pytest.raises(SystemExit, match=r"^error: judge needs --reference \(or --jsonl FILE\)$"):
        cli.main(["judge", "42", "--verifier", "numeric"])
    assert cli.main(["judge", "42", "--verifier", "fuzzy", "--reference", "42"]) == 2
    assert capsys.readouterr().err == "error: unknown verifier 'fuzzy'; valid kinds are: attested, exact, numeric, sympy\n"


def test_python_cli_py_judge_runs_as_a_user_runs_it(tmp_path):
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps({"answer": "It is probably 42.", "verifier": "numeric", "reference": "42"}) + "\n")
    run = subprocess.run(
        [sys.executable, "cli.py", "judge", "--jsonl", str(f)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    assert json.loads(line) == {
        "line": 1,
        "ok": False,
        "value": None,
        "why": "answer 'It is probably 42.': it hedges '42' ('probably'); nothing is asserted that numeric can accept",
        "verifier": "numeric",
        "judge": verifiers.JUDGE,
    }
