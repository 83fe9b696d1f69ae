"""Every verdict comes from one judge (`verifiers.judge`): no code path outside verifiers/ reaches a verifier
kind or the claim reader another way (read from the source), and the gate, `solve`, the eval's scoring, the
recurring case and replay give the judge's verdict for the same answer (the judge replaced: every path follows)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verifiers
from eval import harness, recurring
from services import gate, solve

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".venv", "tests", "node_modules", ".git", "verifiers"}
# Names of the verifiers package that score an answer without the judge: the kinds and their registry, the
# kinds' own item check, the claim reader's modules.
FORBIDDEN = frozenset(
    {
        "VERIFIERS",
        "ExactVerifier",
        "NumericVerifier",
        "SympyVerifier",
        "AttestedVerifier",
        "check",
        "claims",
        "judges",
        "quantities",
        "sentences",
        "symbolic",
    }
)
# Inside verifiers/, only these modules call a kind's `.check`: the judge, the kinds' own `check(item)`, and the
# solution checker (it compares a solution's steps with each other through the sympy kind, not an answer).
CHECK_CALLERS = frozenset({"judging.py", "judges.py", "solutions.py"})
# The one allowed exception, with its reason: eval/gate_judging.py measures the span heuristic the claim reader
# replaced ("before"); its verdicts are reported beside the judge's and decide nothing.
ALLOWED = frozenset({("eval/gate_judging.py", "_old_judge")})


def findings(source: str, path: str) -> list[str]:
    """Where `source` (the file at `path`, relative to the root) scores an answer other than through the judge."""
    tree = ast.parse(source)
    out: list[str] = []
    inside_verifiers = path.startswith("verifiers/")

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            if (path, name) not in ALLOWED:
                out.extend(_bad(child, path, inside_verifiers))
            visit(child, name)

    visit(tree, "")
    return out


def _bad(node: ast.AST, path: str, inside_verifiers: bool) -> list[str]:
    at = f"{path}:{getattr(node, 'lineno', '?')}"
    if inside_verifiers:
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "check"
        return [f"{at}: calls a kind's .check outside the judge"] if called and Path(path).name not in CHECK_CALLERS else []
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "verifiers":
        return [f"{at}: verifiers.{node.attr}"] if node.attr in FORBIDDEN else []
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "verifiers":
        if node.module != "verifiers":
            return [f"{at}: from {node.module} import ..."]
        return [f"{at}: from verifiers import {a.name}" for a in node.names if a.name in FORBIDDEN]
    if isinstance(node, ast.Import):
        return [f"{at}: import {a.name}" for a in node.names if a.name.startswith("verifiers.")]
    return []


def _sources() -> list[tuple[str, str]]:
    files = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in SKIP - {"verifiers"} or any(part.startswith(".") for part in rel.parts):
            continue
        files.append((rel.as_posix(), p.read_text(encoding="utf-8")))
    return files


def test_no_code_path_scores_an_answer_but_through_the_judge():
    sources = _sources()
    assert any(p == "services/gate.py" for p, _ in sources) and any(p == "verifiers/judging.py" for p, _ in sources)
    bad = [f for path, src in sources for f in findings(src, path)]
    assert bad == []


@pytest.mark.parametrize(
    ("source", "path"),
    [
        ("import verifiers\nv = verifiers.VERIFIERS['numeric'].check(a, r)\n", "eval/x.py"),
        ("import verifiers\nv = verifiers.check(item)\n", "services/x.py"),
        ("from verifiers import NumericVerifier\n", "cli/x.py"),
        ("from verifiers.claims import read\n", "web/x.py"),
        ("import verifiers.quantities\n", "eval/x.py"),
        ("def f(kind, a, r):\n    return kind.check(a, r)\n", "verifiers/claims.py"),
        ("import verifiers\ndef other():\n    return verifiers.check(item)\n", "eval/gate_judging.py"),
    ],
)
def test_the_source_check_finds_another_way_of_scoring(source, path):
    assert findings(source, path), source


def test_the_allowed_exception_is_only_the_measured_old_heuristic():
    source = "import verifiers\ndef _old_judge(t):\n    return verifiers.check(t)\n"
    assert findings(source, "eval/gate_judging.py") == []
    assert findings(source, "eval/harness.py")


# ---- behaviour: every path gives the judge's verdict --------------------------------------------------

Q_AGES = "Priya is 4 times as old as Wen. In 11 years, Priya will be 3 times as old as Wen. How old is Priya now?"
CASES = [
    ("84 minutes", "numeric", "84", "How many minutes after the first train departs do the trains meet?"),
    ("Priya is 44 years old now.", "numeric", "44", Q_AGES),
    ("Priya's age = (4x22) / 2 =", "numeric", "44", Q_AGES),
    ("Wen = 40 + 4 * 4", "numeric", "56", Q_AGES),
    ("42 km/h", "sympy", "2*127/(127/30 + 127/70)", "What is the average speed, in km/h?"),
    ("She sold 48/2 = <<48/2=24>>24.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72", "numeric", "72", "How many clips?"),
    ("It is probably 42.", "numeric", "42", "How many?"),
    ("The flag is a plain saffron with no emblem.", "exact", "saffron", "What colour is the flag?"),
    ("", "numeric", "42", "How many?"),
]


@pytest.mark.real_gate
@pytest.mark.parametrize(("answer", "verifier", "reference", "question"), CASES, ids=[c[0][:30] for c in CASES])
def test_the_gate_solve_and_the_eval_give_the_judges_verdict(answer, verifier, reference, question):
    v = verifiers.judge(answer, verifier, reference, question)
    assert solve.judge(verifier, answer, reference, question) == (v.ok, v.detail)
    assert harness.score_answer(answer, verifier, reference, question) == (v.ok, v.detail)
    assert recurring.judge(verifier, answer, reference, question) == (v.ok, v.detail)
    g = gate.judge(answer, question, "A worked solution.", verifier, reference)
    assert g.ok is v.ok and (g == v or not answer.strip())


def _replaced_judge(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []

    def fake(answer, verifier, reference, question=""):
        calls.append((answer, verifier, reference, question))
        return verifiers.Verdict(answer == "yes", verifier, f"fake judge on {answer!r}", answer)

    monkeypatch.setattr(verifiers, "judge", fake)
    return calls


@pytest.mark.real_gate
def test_replacing_the_judge_changes_every_paths_verdict(monkeypatch):
    calls = _replaced_judge(monkeypatch)
    for answer in ("yes", "no"):
        ok = answer == "yes"
        assert solve.judge("numeric", answer, "42", "q?") == (ok, f"fake judge on {answer!r}")
        assert harness.score_answer(answer, "numeric", "42", "q?")[0] is ok
        assert recurring.judge("numeric", answer, "42", "q?")[0] is ok
        assert gate.judge(answer, "q?", "s.", "numeric", "42").ok is ok
    assert gate.claimed("yes", "q?", "numeric", "42") == "yes"
    assert len(calls) == 9 and all(c[3] == "q?" for c in calls)
