"""The checked-in evaluation data: regenerates byte-identically, has the promised shape, and every item verifies."""

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import verifiers
from verifiers import judges

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT / "datasets"
FILES = ("knowledge.jsonl", "problems.jsonl", "README.md")
KNOWLEDGE_FIELDS = ["id", "template", "entity", "fact", "question", "paraphrases", "answer", "verifier"]
PROBLEM_FIELDS = ["id", "template", "question", "solution", "answer", "verifier", "reference", "split"]


def _load(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATASETS / name).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def knowledge() -> list[dict]:
    return _load("knowledge.jsonl")


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return _load("problems.jsonl")


def test_regenerating_gives_identical_bytes(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "scripts.make_datasets", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    for name in FILES:
        fresh, checked_in = (tmp_path / name).read_bytes(), (DATASETS / name).read_bytes()
        assert fresh == checked_in, (
            f"{name}: fresh sha256 {hashlib.sha256(fresh).hexdigest()} != checked-in {hashlib.sha256(checked_in).hexdigest()}; "
            "regenerate with: .venv/bin/python -m scripts.make_datasets"
        )
    check = subprocess.run([sys.executable, "-m", "scripts.make_datasets", "--check"], cwd=ROOT, capture_output=True, timeout=120)
    assert check.returncode == 0


def test_readme_records_each_files_sha256():
    readme = (DATASETS / "README.md").read_text(encoding="utf-8")
    for name in ("knowledge.jsonl", "problems.jsonl"):
        assert f"| `{name}` | `{hashlib.sha256((DATASETS / name).read_bytes()).hexdigest()}` |" in readme
    assert "python -m scripts.make_datasets" in readme


def test_knowledge_shape(knowledge):
    assert len(knowledge) >= 500
    assert all(list(it) == KNOWLEDGE_FIELDS for it in knowledge)
    assert len({it["id"] for it in knowledge}) == len(knowledge)
    templates = Counter(it["template"] for it in knowledge)
    assert len(templates) >= 10 and min(templates.values()) >= 20
    assert {it["verifier"] for it in knowledge} == {"exact", "numeric"}
    for it in knowledge:
        assert it["fact"].endswith(".") and it["fact"].count(". ") == 0, it["id"]
        assert it["answer"] in it["fact"], it["id"]
        assert it["answer"].casefold() not in it["question"].casefold(), it["id"]
        assert len(it["answer"]) <= 40, it["id"]


def test_paraphrases_are_two_distinct_rewordings(knowledge):
    for it in knowledge:
        texts = [it["question"], *it["paraphrases"]]
        assert len(it["paraphrases"]) == 2 and len({t.casefold() for t in texts}) == 3, it["id"]
        assert all(t.endswith("?") or t.endswith(".") for t in texts), it["id"]


def test_knowledge_names_and_questions_are_unique(knowledge):
    for field in ("entity", "question"):
        counts = Counter(it[field].casefold() for it in knowledge)
        assert [k for k, n in counts.items() if n > 1] == []
    deposited = {it["fact"].casefold() for it in knowledge}
    assert not any(p.casefold() in deposited for it in knowledge for p in it["paraphrases"])


def test_problems_shape(problems):
    assert len(problems) >= 200
    assert all(list(it) == PROBLEM_FIELDS for it in problems)
    assert len({it["id"] for it in problems}) == len(problems)
    by_template = Counter((it["template"], it["split"]) for it in problems)
    templates = {t for t, _ in by_template}
    assert len(templates) >= 8
    for template in templates:
        assert by_template[(template, "deposited")] >= 1 and by_template[(template, "heldout")] >= 5, template
    assert {it["split"] for it in problems} == {"deposited", "heldout"}
    assert {it["verifier"] for it in problems} <= {"numeric", "sympy"}
    for it in problems:
        assert it["solution"].count("\n") >= 2, it["id"]
        assert it["solution"].endswith(f"Answer: {it['answer']}"), it["id"]


def test_no_duplicate_questions(knowledge, problems):
    questions = [it["question"] for it in knowledge + problems]
    assert len(set(questions)) == len(questions)


def test_every_knowledge_item_passes_its_verifier(knowledge):
    for it in knowledge:
        verdict = verifiers.judge(it["answer"], it["verifier"], it["answer"], it["question"])
        assert verdict.ok, f"{it['id']}: {verdict.detail}"


def test_every_problem_passes_its_verifier(problems):
    for it in problems:
        verdict = verifiers.judge(it["answer"], it["verifier"], it["reference"], it["question"])
        assert verdict.ok, f"{it['id']}: {verdict.detail}"


def test_a_wrong_answer_is_refused(problems):
    """The references carry weight: nudging each answer makes its verifier refuse."""
    for it in problems[::13]:
        wrong = f"{it['answer']}+1" if it["verifier"] == "sympy" else str(judges._parse_number(it["answer"])[0] + 1)
        verdict = verifiers.judge(wrong, it["verifier"], it["reference"], it["question"])
        assert not verdict.ok, it["id"]
