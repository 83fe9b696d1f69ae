"""No pickle, no eval on data: product code never deserialises with code execution.

The scan walks the syntax tree of every .py file outside `.venv/` and `tests/` (so comments,
docstrings and strings that mention `torch.load` do not trip it) and reports each offending call or
import with file:line. A planted snippet proves the scanner can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SKIP_DIRS = {".venv", "tests", ".git", "node_modules", "__pycache__", ".ruff_cache", ".pytest_cache"}
_PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "joblib", "marshal"}
_PICKLE_FUNCS = {"read_pickle", "to_pickle"}  # pandas


def _dotted(node: ast.AST) -> str:
    """`torch.load` for Attribute(Name('torch'), 'load'); '' for anything not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _is_const(node: ast.AST | None, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def scan_source(source: str, filename: str = "<snippet>") -> list[str]:
    """Every pickle-like load, pickle import, `weights_only=False`, `allow_pickle=True` or
    `eval`/`exec` call in `source`, as 'file:line: what'."""
    found = []
    tree = ast.parse(source, filename=filename)
    aliases: dict[str, str] = {}  # local name -> module it names (import numpy as np -> np: numpy)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in _PICKLE_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if mod in _PICKLE_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        where = f"{filename}:{node.lineno}"
        if full in ("eval", "exec", "builtins.eval", "builtins.exec"):
            found.append(f"{where}: {name}() executes code")
        elif full in ("torch.load", "torch.serialization.load"):
            found.append(f"{where}: {name}() unpickles (use safetensors via graft_core.codec)")
        elif full.split(".")[-1] == "sympify" and full.startswith(("sympy", "sympify")):
            found.append(f"{where}: {name}() evaluates strings")
        elif full.split(".")[0] in _PICKLE_MODULES:
            found.append(f"{where}: {name}()")
        elif full.split(".")[-1] in _PICKLE_FUNCS:
            found.append(f"{where}: {name}() reads pickles")
        if "weights_only" in kw and not _is_const(kw["weights_only"], True):
            found.append(f"{where}: weights_only not True")
        if "allow_pickle" in kw and not _is_const(kw["allow_pickle"], False):
            found.append(f"{where}: allow_pickle not False")
    return sorted(set(found))


def product_files() -> list[Path]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).parts
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel[:-1]):
            continue
        out.append(p)
    return out


def test_product_code_has_no_pickle_or_eval():
    files = product_files()
    assert any(p.name == "codec.py" for p in files), "the scan must cover graft_core/codec.py"
    assert len(files) >= 20, f"only {len(files)} files found under {ROOT}: the walk is broken"
    found = []
    for p in files:
        found += scan_source(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    assert found == [], "pickle/eval in product code:\n" + "\n".join(found)


PLANTED = """
import pickle
import numpy as np
import torch as T
from joblib import load as jl
from builtins import exec as run

def bad(path, text):
    a = T.load(path, weights_only=False)
    b = np.load(path, allow_pickle=True)
    c = jl(path)
    d = pickle.loads(text)
    e = eval(text)
    run(text)
    return torch.load(path)
"""


def test_the_scanner_catches_planted_offenders():
    found = scan_source(PLANTED, "planted.py")
    text = "\n".join(found)
    for needle in (
        ":2: import pickle",
        ":5: from joblib",
        ":9: T.load() unpickles",
        ":9: weights_only not True",
        ":10: allow_pickle not False",
        ":11: jl()",
        ":12: pickle.loads()",
        ":13: eval() executes code",
        ":14: run() executes code",
        ":15: torch.load() unpickles",
    ):
        assert needle in text, f"scanner missed {needle!r}; it found:\n{text}"


def test_the_scanner_ignores_comments_strings_and_safe_calls():
    clean = '''
"""We never call torch.load(path) or pickle.loads here; eval( is only a word."""
# torch.load(x, weights_only=False)
import numpy as np
import safetensors.torch
model = object()
msg = "np.load(f, allow_pickle=True)"

def ok(path, model):
    model.eval()
    a = np.load(path)
    b = np.load(path, allow_pickle=False)
    c = safetensors.torch.load_file(path)
    return a, b, c, msg
'''
    assert scan_source(clean) == []
