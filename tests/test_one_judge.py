"""Every verdict comes from one judge (`verifiers.judge`): no code path outside verifiers/ reaches a verifier
kind or the claim reader another way (read from the source), and the gate, `solve`, the eval's scoring, the
recurring case and replay give the judge's verdict for the same answer (the judge replaced: every path follows)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import services
import verifiers
from eval import benchmark, gsm_recheck
from services import gate

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
# Inside verifiers/, only these modules call a kind's `.compare`: the judge, the kinds' own `check(item)`, and the
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
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compare"
        return [f"{at}: calls a kind's .compare outside the judge"] if called and Path(path).name not in CHECK_CALLERS else []
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
        ("import verifiers\nv = verifiers.VERIFIERS['numeric'].compare(a, r)\n", "eval/x.py"),
        ("import verifiers\nv = verifiers.check(item)\n", "services/x.py"),
        ("from verifiers import NumericVerifier\n", "cli/x.py"),
        ("from verifiers.claims import read\n", "web/x.py"),
        ("import verifiers.quantities\n", "eval/x.py"),
        ("def f(kind, a, r):\n    return kind.compare(a, r)\n", "verifiers/claims.py"),
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


@pytest.mark.real_gate  # the fast tier stands its double in for the gate's verdicts
def test_the_gate_calls_the_one_judge_itself():
    """The gate's name for its verdict is the judge's own function object (the fast tier's seam), not a wrapper."""
    assert gate.judge is verifiers.judge


@pytest.mark.real_gate
@pytest.mark.parametrize(("answer", "verifier", "reference", "question"), CASES, ids=[c[0][:30] for c in CASES])
def test_the_eval_and_the_recurring_case_give_the_judges_verdict(answer, verifier, reference, question):
    v = verifiers.judge(answer, verifier, reference, question)
    row = {"answer": answer, "verifier": verifier, "reference": reference, "question": question}
    assert benchmark.score(row) == {"ok": v.ok, "value": v.value, "detail": v.detail}
    assert gsm_recheck._ok(row, answer) is v.ok
    assert gate.claimed(answer, question, verifier, reference) == (v.value or answer.strip())


def _replaced_judge(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []

    def fake(answer, verifier, reference, question=""):
        calls.append((answer, verifier, reference, question))
        return verifiers.Verdict(answer == "yes", verifier, f"fake judge on {answer!r}", answer)

    monkeypatch.setattr(verifiers, "judge", fake)
    return calls


@pytest.mark.real_gate
def test_replacing_the_judge_changes_every_paths_verdict(monkeypatch, tmp_path, tiny_gemma):
    """Each path reaches the judge through `verifiers.judge` at call time: a replaced judge decides them all,
    `solve` on a real (tiny) Library included."""
    from retrieval.embedder import HashEmbedder

    calls = _replaced_judge(monkeypatch)
    for answer in ("yes", "no"):
        row = {"answer": answer, "verifier": "numeric", "reference": "42", "question": "q?"}
        assert benchmark.score(row)["ok"] is (answer == "yes")
        assert gsm_recheck._ok(row, answer) is (answer == "yes")
    assert gate.claimed("yes", "q?", "numeric", "42") == "yes"
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    try:
        r = lib.solve("How many apples are in the basket?", "numeric", "42", budget=200, max_new_tokens=4, library=False)
    finally:
        lib.close()
    judged = [a for a in r.attempts if a.detail]
    assert judged and all(a.detail.startswith("fake judge on ") and not a.passed for a in judged)
    assert any(c[3] == "How many apples are in the basket?" for c in calls)
