"""Settings in one place: every KVGRAFT_* variable is declared in settings.py, read only through it, parsed by
one parser with one error shape, and listed in the README's configuration table."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

import settings
from errors import InvalidInput, InvalidSetting, KvgraftError

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"KVGRAFT_[A-Z0-9_]*[A-Z0-9]")
READERS = ("get", "getenv")  # os.environ.get, env.get, os.getenv


def _python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in listed.split()]


def _product_files() -> list[Path]:
    """Non-test code: everything but tests/ (and settings.py itself, the one reader)."""
    return [p for p in _python_files() if p.parts[len(ROOT.parts)] != "tests" and p.name != "settings.py"]


def _name_constants(trees: dict[Path, ast.Module]) -> set[str]:
    """Module-level names bound to a KVGRAFT_* string (WARM_PROOFS_ENV = "KVGRAFT_WARM_PROOFS")."""
    names = set()
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if isinstance(node.value.value, str) and NAME.fullmatch(node.value.value):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _reads(tree: ast.Module, constants: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each read of a KVGRAFT_* variable that does not go through `settings`."""

    def is_variable(node) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and bool(NAME.fullmatch(node.value))
        return isinstance(node, ast.Name | ast.Attribute) and (getattr(node, "id", None) or node.attr) in constants

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and is_variable(node.args[0]):
            func = node.func
            through_settings = isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "settings"
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in READERS and not through_settings:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_variable(node.slice):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare) and is_variable(node.left) and any(isinstance(o, ast.In) for o in node.ops):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_variable_is_read_outside_settings():
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in _product_files()}
    constants = _name_constants(trees)
    stray = [f"{p.relative_to(ROOT)}:{line}: {what}" for p, tree in trees.items() for line, what in _reads(tree, constants)]
    assert not stray, "read these through settings.get:\n" + "\n".join(stray)


def test_the_scan_catches_each_way_of_reading():
    """The scan above earns its place: each way a stray read could be written is caught, writes are not."""
    source = """
import os
ENV = "KVGRAFT_THREADS"
a = os.environ.get("KVGRAFT_HOME")
b = os.getenv("KVGRAFT_HOME", "x")
c = os.environ["KVGRAFT_HOME"]
d = env.get(ENV)
e = "KVGRAFT_HOME" in env
os.environ["KVGRAFT_HOME"] = "w"
f = dict(os.environ, KVGRAFT_HOME="w")
g = settings.get(ENV)
"""
    tree = ast.parse(source)
    assert [line for line, _ in _reads(tree, _name_constants({Path("x"): tree}))] == [4, 5, 6, 7, 8]


def test_every_variable_named_in_code_is_declared():
    undeclared = sorted(
        f"{p.relative_to(ROOT)}: {name}"
        for p in _python_files()
        for name in set(NAME.findall(p.read_text(encoding="utf-8")))
        if name not in settings.SETTINGS
    )
    assert not undeclared, "declare these in settings.py:\n" + "\n".join(undeclared)


def test_the_readme_table_lists_exactly_the_declared_variables():
    rows = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| `KVGRAFT_")]
    listed = {name for row in rows for name in NAME.findall(row.split("|")[1])}
    missing, extra = sorted(set(settings.SETTINGS) - listed), sorted(listed - set(settings.SETTINGS))
    assert not missing and not extra, f"README configuration table lacks {missing}; names undeclared {extra}"


def test_each_declaration_is_whole():
    for s in settings.SETTINGS.values():
        assert s.meaning and NAME.fullmatch(s.name), s
        default = s.default_value()
        if default not in (None, ""):
            assert s.parse(str(default).lower() if isinstance(default, bool) else str(default)) == default, s


GOOD = [
    ("KVGRAFT_THREADS", "1", 1),
    ("KVGRAFT_THREADS", "256", 256),
    ("KVGRAFT_LEDGER_MAX_ROWS", "1000000", 1_000_000),
    ("KVGRAFT_SERVE_DRAIN_S", "0", 0.0),
    ("KVGRAFT_SERVE_DRAIN_S", "2.5", 2.5),
    ("KVGRAFT_LEDGER_DAYS", ".5", 0.5),
    ("KVGRAFT_TRUST_PROXY", "127.0.0.1", ("127.0.0.1/32",)),
    ("KVGRAFT_TRUST_PROXY", "10.1.2.3/8, fd00::/8", ("10.0.0.0/8", "fd00::/8")),
    ("KVGRAFT_TRUST_PROXY", "no", ()),
    ("KVGRAFT_PUBLIC_URL", "https://me-kv.hf.space/", "https://me-kv.hf.space"),
    ("KVGRAFT_LINEAR", "Torch", "torch"),
    ("KVGRAFT_PRODUCTS", "plain", "plain"),
    ("KVGRAFT_HOME", "/srv/kvgraft", Path("/srv/kvgraft")),
    ("KVGRAFT_BACKEND_URL", "http://10.0.0.2:8000/", "http://10.0.0.2:8000"),
    ("KVGRAFT_BACKEND_URL", "https://kv.example/api//", "https://kv.example/api"),
    ("KVGRAFT_DB_URL", "sqlite:////tmp/c.sqlite3", "sqlite:////tmp/c.sqlite3"),
    ("KVGRAFT_DB_URL", "postgresql+psycopg://kv@db/kv", "postgresql+psycopg://kv@db/kv"),
    ("KVGRAFT_ADMIN_TOKEN", "s3cr3t-token", "s3cr3t-token"),
    ("KVGRAFT_MAX_UPLOAD", "64 MB", "64mb"),
    ("KVGRAFT_MODEL", "google/gemma-3-270m", "google/gemma-3-270m"),
]


@pytest.mark.parametrize(("name", "raw", "value"), GOOD)
def test_good_values_are_read(name, raw, value):
    got = settings.get(name, {name: f"  {raw}\n"})  # surrounding space is not part of a value
    assert got == value and type(got) is type(value)


BAD = [
    ("KVGRAFT_THREADS", "0", "a whole number from 1 to 256"),
    ("KVGRAFT_THREADS", "257", "a whole number from 1 to 256"),
    ("KVGRAFT_THREADS", "two", "a whole number from 1 to 256"),
    ("KVGRAFT_THREADS", "1.5", "a whole number from 1 to 256"),
    ("KVGRAFT_THREADS", "-1", "a whole number from 1 to 256"),
    ("KVGRAFT_THREADS", "02", "a whole number from 1 to 256"),
    ("KVGRAFT_WARM_PROOFS", "100001", "a whole number from 0 to 100,000"),
    ("KVGRAFT_LEDGER_MAX_ROWS", "0", "a whole number of at least 1"),
    ("KVGRAFT_SERVE_DRAIN_S", "-1", "a number of at least 0"),
    ("KVGRAFT_SERVE_DRAIN_S", "nan", "a number of at least 0"),
    ("KVGRAFT_SERVE_DRAIN_S", "1e3", "a number of at least 0"),
    ("KVGRAFT_LEDGER_DAYS", "0", "a number above 0"),
    (
        "KVGRAFT_TRUST_PROXY",
        "1",
        "the proxies' addresses or networks, comma-separated (like 127.0.0.1 or 10.0.0.0/8), or 0 for none",
    ),  # it once meant: believe anyone
    (
        "KVGRAFT_TRUST_PROXY",
        "true",
        "the proxies' addresses or networks, comma-separated (like 127.0.0.1 or 10.0.0.0/8), or 0 for none",
    ),
    (
        "KVGRAFT_TRUST_PROXY",
        "*",
        "the proxies' addresses or networks, comma-separated (like 127.0.0.1 or 10.0.0.0/8), or 0 for none",
    ),
    (
        "KVGRAFT_TRUST_PROXY",
        "10.0.0.1,proxy.local",
        "the proxies' addresses or networks, comma-separated (like 127.0.0.1 or 10.0.0.0/8), or 0 for none",
    ),
    ("KVGRAFT_PUBLIC_URL", "kv.example", "a http:// or https:// URL"),
    ("KVGRAFT_LINEAR", "mkl", "fma16, int8 or torch"),
    ("KVGRAFT_SERVE_EMBEDDER", "bert", "minilm or hash"),
    ("KVGRAFT_PRODUCTS", "fast", "plain or unset"),
    ("KVGRAFT_BENCH_LINEAR", "mkl", "openblas or unset"),
    ("KVGRAFT_HOME", "/srv/\x00kv", "text without control characters"),
    ("KVGRAFT_BACKEND_URL", "10.0.0.2:8000", "a http:// or https:// URL"),
    ("KVGRAFT_BACKEND_URL", "ftp://h/", "a http:// or https:// URL"),
    ("KVGRAFT_BACKEND_URL", "http:///path", "a http:// or https:// URL"),
    ("KVGRAFT_DB_URL", "catalog.sqlite3", "a URL like scheme://..."),
    ("KVGRAFT_ADMIN_TOKEN", "two words", "printable text without spaces"),
    ("KVGRAFT_MAX_UPLOAD", "1.5gb", "a size like 256mb (a whole number and b, kb, mb, gb or tb)"),
    ("KVGRAFT_MAX_UPLOAD", "256", "a size like 256mb (a whole number and b, kb, mb, gb or tb)"),
]


@pytest.mark.parametrize(("name", "raw", "what"), BAD)
def test_bad_values_are_refused_with_the_one_shape(name, raw, what):
    with pytest.raises(InvalidSetting) as e:
        settings.get(name, {name: raw})
    assert str(e.value) == f"{name} must be {what}, got {raw!r}"
    assert isinstance(e.value, InvalidInput) and isinstance(e.value, KvgraftError)


def test_unset_or_blank_gives_the_default_and_reads_happen_when_called(monkeypatch, tmp_path):
    monkeypatch.delenv("KVGRAFT_THREADS", raising=False)
    assert settings.get("KVGRAFT_THREADS") == 2
    monkeypatch.setenv("KVGRAFT_THREADS", "   ")
    assert settings.get("KVGRAFT_THREADS") == 2
    monkeypatch.setenv("KVGRAFT_THREADS", "3")
    assert settings.get("KVGRAFT_THREADS") == 3
    assert settings.get("KVGRAFT_THREADS", {}) == 2  # a given mapping, not os.environ
    assert settings.get("KVGRAFT_BLOB_ROOT", {}, default=tmp_path) == tmp_path
    assert settings.get("KVGRAFT_HOME", {"KVGRAFT_HOME": str(tmp_path)}, default=None) == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert settings.get("KVGRAFT_MODEL_CACHE", {}) == tmp_path / ".cache" / "kvgraft" / "models"  # computed now


def test_the_table_has_one_row_per_variable():
    rows = settings.table().splitlines()
    assert [NAME.search(r).group() for r in rows] == list(settings.SETTINGS)
    assert "| `KVGRAFT_THREADS` | `2` | " in settings.table()
