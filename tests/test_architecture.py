"""The layering the README draws, checked: lower layers load no torch, the library table is one query
whatever its size, results are typed and serialise through one `to_json()`, and the blob store hashes
what fsck needs without a second reader."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import event

import services
from db.blobs import RACY_NS
from retrieval import HashEmbedder
from services import AnswerOptions

ROOT = Path(__file__).resolve().parents[1]
ITEM = ("Who built the Varnek lighthouse?", "The Varnek lighthouse was built by Osric Pellamy.", "Osric Pellamy")


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    yield lib
    lib.close()


def test_lower_layers_import_no_torch():
    code = "import sys, errors, files, db, db.queries, retrieval, verifiers, graft_core, graft_core.errors; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_graft_core_names_resolve_lazily_and_errors_are_one_hierarchy():
    import errors
    import graft_core
    from graft_core import errors as old_errors

    assert graft_core.KvgraftError is errors.KvgraftError is old_errors.KvgraftError
    from graft_core.artifact import KVArtifact

    assert graft_core.KVArtifact is KVArtifact
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = graft_core.nope


def _selects(lib: services.Library, fn) -> int:
    seen: list[str] = []
    engine = lib.store.catalog._engine
    listener = lambda conn, cursor, stmt, *a: seen.append(stmt)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    return sum(1 for s in seen if s.lstrip().upper().startswith("SELECT"))


def test_library_table_is_one_query_with_the_latest_verification(lib):
    item = lib.deposit_item(*ITEM, "exact", ITEM[2])
    one = _selects(lib, lambda: lib.entries())
    text = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.", title="spire")
    attested = lib.deposit_text("Another sheet.", attested_by="Dr. A. Rivera", admin=True)
    three = _selects(lib, lambda: lib.entries())
    assert one == three == 1
    got = {e.row.id: (e.verifier, e.verdict) for e in lib.entries()}
    assert got == {item.id: ("exact", "verified"), text.id: ("none", "unverified"), attested.id: ("attested", "attested")}
    assert [e.row.id for e in lib.entries(query="spire")] == [text.id]
    assert [e.row.id for e in lib.entries(kind="verified")] == [item.id]


def test_results_are_typed_and_serialise_once(lib):
    d = lib.deposit_item(*ITEM, "exact", ITEM[2])
    r = lib.answer(ITEM[0], AnswerOptions(check=True, compare=True, max_new_tokens=3, threshold=0.0))
    assert r.check is not None and r.check.exact and r.check.fresh_sha256 == r.check.grafted_sha256
    assert r.baseline is not None and r.ttft_speedup == r.baseline.ttft_s / max(r.ttft_s, 1e-9)
    j = r.to_json()
    assert j["check"]["exact"] is True and j["savings"]["token_ratio"] == r.savings.token_ratio
    assert j["baseline"]["measured"] is True and j["baseline"]["prefill_tokens"] == r.baseline.prefill_tokens
    assert j["retrieved"][0] == {
        "id": d.id,
        "title": d.title,
        "score": r.retrieved[0].score,
        "tokens": d.tokens,
        "kind": "verified",
        "verifier": "exact",
        "verdict": "verified",  # the record's label: the gate ran here and its token ids hash as recorded
        "relevant": True,
        "reason": "the question has every distinctive term of the item (varnek)",
        "use": "fact",
    }
    rep = lib.exactness_report(2)
    assert all(s.check.exact for s in rep.rows) and rep.byte_equal == 2
    short = rep.to_json(every_field=False)
    full = rep.to_json()["rows"][0]
    dropped = {
        "rows",
        "decode_steps",
        "tokens_equal",
        "monolithic_max_abs_diff",
        "monolithic_kl",
        "monolithic_argmax_agreement",
        "offset",
    }
    assert set(short["rows"][0]) == set(full) - dropped and short["rows"][0]["exact"] is True
    assert rep.to_json()["rows"][0]["decode_steps"] == rep.rows[0].check.decode_steps
    shown = lib.show(d.id)
    assert shown.artifact.id == d.id and shown.verifications[-1].verdict == "pass"
    assert shown.to_json()["artifact"]["end_pos"] == shown.artifact.end_pos


def test_blob_store_hashes_what_is_on_disk(lib):
    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    blobs = lib.store.blobs
    assert blobs.actual_sha256(d.content_sha256) == d.content_sha256
    path = blobs.path(d.content_sha256)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    import hashlib

    assert blobs.actual_sha256(d.content_sha256) == hashlib.sha256(path.read_bytes()).hexdigest() != d.content_sha256
    path.unlink()
    assert blobs.actual_sha256(d.content_sha256) is None


def test_pyproject_installs_every_top_level_module_and_package():
    """A module added at the top level but not listed in pyproject would be missing from `pip install .`.
    The two entry scripts (app.py, cli.py) are not modules: each only starts its front end's package."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    entry = {"app", "cli"}
    for name in entry:
        assert len((ROOT / f"{name}.py").read_text().splitlines()) <= 20, (
            f"{name}.py is an entry shim: its code belongs in its package"
        )
    modules = {p.stem for p in ROOT.glob("*.py")} - entry
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "scripts"}
    assert set(setup["py-modules"]) == modules, f"pyproject py-modules {sorted(setup['py-modules'])} vs files {sorted(modules)}"
    assert packages <= set(setup["packages"]), f"packages not installed: {sorted(packages - set(setup['packages']))}"


def _product_sources() -> list[tuple[str, ast.Module]]:
    """Every tracked .py file outside tests/, parsed."""
    names = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [(n, ast.parse((ROOT / n).read_text(), n)) for n in names if not n.startswith("tests/")]


def test_every_function_is_at_most_120_lines():
    """A function past a screen or two is several steps under one name: split it into named ones."""
    long = [
        f"{name}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _product_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 120
    ]
    assert not long, "functions over 120 lines:\n" + "\n".join(long)


_LIST_EDITS = {
    "append",
    "extend",
    "insert",
    "remove",
    "pop",
    "clear",
    "sort",
    "reverse",
    "__setitem__",
    "__delitem__",
    "__iadd__",
}


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"


def _sys_path_edit(node: ast.AST) -> str | None:
    """What `node` does to sys.path, if it changes it: a list-editing call, or an assignment to it or an item."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value):
        return f"calls sys.path.{node.func.attr}()" if node.func.attr in _LIST_EDITS else None
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return None
    for t in targets:
        if _is_sys_path(t) or isinstance(t, ast.Subscript) and _is_sys_path(t.value):
            return "assigns to sys.path"
    return None


def test_no_module_edits_sys_path():
    """Packages run as `python -m pkg.mod` from the checkout's root, so nothing needs to reorder imports;
    a `sys.path` edit is how a script reached around that (and shadowed a package of the same name)."""
    edits = [
        f"{name}:{node.lineno} {edit}"
        for name, tree in _product_sources()
        for node in ast.walk(tree)
        if (edit := _sys_path_edit(node))
    ]
    assert not edits, "sys.path edited:\n" + "\n".join(edits)


# ---- the floors: every import of every product file runs downward ----------------------------

GROUND = {"errors", "files", "settings"}  # root modules that import no project package
PRODUCT_FORBIDS = {"bench", "scripts", "tests"}
FRONT_ENDS = {"web", "serving", "cli"}  # siblings: none imports another
ENTRY = {"server"}  # the one module that puts the page and the API on one port: it alone imports both
ABOVE_KERNELS = {"graft_core", "db", "retrieval", "verifiers", "services", "access", *FRONT_ENDS, *ENTRY, "eval"}
FORBIDDEN = {  # top-level package (or root module) -> what it must never import
    **{g: {"kernels", *ABOVE_KERNELS} for g in GROUND},
    "kernels": ABOVE_KERNELS,  # the floor below graft_core and retrieval: both compute through it
    "graft_core": {"db", "retrieval", "services", "access", *FRONT_ENDS, *ENTRY, "verifiers", "eval"},
    "db": {"services", "access", *FRONT_ENDS, *ENTRY, "eval"},
    "retrieval": {"graft_core", "services", "access", *FRONT_ENDS, *ENTRY, "eval"},  # the engine's neighbour, not its tenant
    "verifiers": {"services", "access", *FRONT_ENDS, *ENTRY, "eval"},
    "services": {"access", *FRONT_ENDS, *ENTRY},
    "access": {*FRONT_ENDS, *ENTRY, "eval"},  # the edge, below both front ends: it imports neither
    "web": {"serving", "cli", *ENTRY},  # the page and the API are siblings: neither imports the other
    "serving": {"web", "cli", *ENTRY},
    "cli": {"web", *ENTRY},  # the command line starts a deployment (`cli.py serve`: serving.launch), never the page
}
NOT_PRODUCT = {"bench", "scripts", "tests"}
SKIP_DIRS = {"tests", "__pycache__", "node_modules", "venv"}


def _source_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not any(part.startswith(".") or part in SKIP_DIRS for part in p.relative_to(ROOT).parts[:-1])
    )


def _imported_tops(path: Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every import in `path`, at module level or inside a function; relative
    imports resolve against the file's own package."""
    import ast

    rel = path.relative_to(ROOT)
    package = list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(rel))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.lineno, (node.module or "").split(".")[0]))
            else:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                names = target or [a.name for a in node.names]
                out += [(node.lineno, names[0])] if target else [(node.lineno, n) for n in names]
    return out


def layer_breaks(files: list[Path]) -> list[str]:
    breaks = []
    for path in files:
        rel = path.relative_to(ROOT)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        forbidden = FORBIDDEN.get(owner, set()) | (PRODUCT_FORBIDS if owner not in NOT_PRODUCT else set())
        breaks += [f"{rel}:{line} imports {top}" for line, top in _imported_tops(path) if top in forbidden]
    return breaks


def test_layers_import_only_downward(tmp_path, monkeypatch):
    files = _source_files()
    assert len(files) > 50 and ROOT / "graft_core" / "proof.py" in files and ROOT / "errors.py" in files
    assert layer_breaks(files) == []
    # the check fails when it should: an import inside a function, and a relative one climbing out of graft_core
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "graft_core" / "sub").mkdir(parents=True)
    (tmp_path / "graft_core" / "bad.py").write_text("def f():\n    from services import Library\n")
    (tmp_path / "graft_core" / "sub" / "worse.py").write_text("from ...web import app\nfrom .. import model\n")
    (tmp_path / "errors.py").write_text("import db\n")
    # and the siblings: the page reaching for the API, the API for the page, the edge for either
    for name, line in (
        ("web", "from serving import openai_api"),
        ("serving", "from ..web import guard"),
        ("access", "import web"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lean.py").write_text(f"def f():\n    {line}\n")
    assert layer_breaks(_source_files()) == [
        "access/lean.py:2 imports web",
        "errors.py:1 imports db",
        "graft_core/bad.py:2 imports services",
        "graft_core/sub/worse.py:1 imports web",
        "serving/lean.py:2 imports web",
        "web/lean.py:2 imports serving",
    ]


TORCH_DOORS = {"retrieval/encoder.py"}  # the embedder's forward on the kernels: retrieval's one module that uses torch


def test_torch_reaches_retrieval_only_through_the_kernels_door():
    """retrieval's index, relevance and embedder interface load no torch; the one module that computes with it
    (the embedder's forward, on the kernels) is declared, imported lazily, and imports no graft_core."""
    users = sorted(
        str(p.relative_to(ROOT))
        for p in _source_files()
        if p.relative_to(ROOT).parts[0] == "retrieval" and any(top in {"torch", "transformers"} for _, top in _imported_tops(p))
    )
    assert users == sorted(TORCH_DOORS), f"torch imported in retrieval outside {sorted(TORCH_DOORS)}: {users}"
    door = {top for _, top in _imported_tops(ROOT / "retrieval" / "encoder.py")}
    assert "kernels" in door and "graft_core" not in door, sorted(door)


def test_front_ends_and_tools_reach_the_store_only_through_library_methods(lib):
    """No product module reaches into a library's private state: the store's parts are its public members
    (services/store.py), which the pipelines and upkeep in services/ use, and front ends and tools do not."""
    private = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _source_files()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if any(f"{who}.{name}" in line for who in ("lib", "library", "self") for name in ("_catalog", "_blobs", "_lock."))
    ]
    assert private == []
    reach = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _source_files()
        if p.relative_to(ROOT).parts[0] in {"bench", "scripts", "eval", "web", "cli", "serving"}
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if ".store.catalog" in line or ".store.blobs" in line or ".store.lock" in line
    ]
    assert reach == []
    d = lib.deposit_text("The Varnek lighthouse was built by Osric Pellamy in 1874.")
    assert bytes(lib.read_blob(d.content_sha256)) == lib.blob_file(d.content_sha256).read_bytes()
    assert lib.stored_tokens() == d.tokens and 0.0 <= lib.blob_trusted_after_s(d.content_sha256) <= RACY_NS / 1e9
    assert lib.corrupt_blobs() == []
    data = bytearray(lib.blob_file(d.content_sha256).read_bytes())
    data[-1] ^= 1
    lib.blob_file(d.content_sha256).chmod(0o644)
    lib.blob_file(d.content_sha256).write_bytes(bytes(data))
    assert lib.corrupt_blobs() == [d.content_sha256]


THROUGH_A_PART = re.compile(r"\bself\.\w+\._[A-Za-z]")  # self._store._index: a held part's private state
INTO_A_LIBRARY = re.compile(r"\b(?:lib|library|self\.lib|self\.library|self\._library)\._[A-Za-z]")


def test_the_library_is_composed_and_its_parts_touch_only_their_own_state(tmp_path):
    """The Library holds its parts (Artifacts, ModelTurns, the pipelines), each handed what it needs: no module of
    services/ reaches through a part it holds into that part's private members, and no module outside
    services/library.py reads a library's private members (the engine's `lib` is a C library handle)."""
    through = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "services").glob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if THROUGH_A_PART.search(line)
    ]
    assert through == []
    into = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _source_files()
        if p.relative_to(ROOT).parts[0] not in {"graft_core", "kernels"} and p != ROOT / "services" / "library.py"
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if INTO_A_LIBRARY.search(line)
    ]
    assert into == []
    assert THROUGH_A_PART.search("self._store._index") and not THROUGH_A_PART.search("self._store.catalog.get(x)")
    assert INTO_A_LIBRARY.search("lib._probed.clear()") and not INTO_A_LIBRARY.search("lib.artifacts.forget_proofs()")
    from services.answer import AnswerPipeline
    from services.artifacts import Artifacts
    from services.deposit import DepositPipeline
    from services.exactness_report import ExactnessReportPipeline
    from services.solve import SolvePipeline
    from services.turns import ModelTurns

    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder())
    try:  # the parts are the Library's public members, each an object of its own class, not a mixin
        parts = (lib.artifacts, lib.turns, lib.deposits, lib.answers, lib.reports, lib.solving)
        kinds = (Artifacts, ModelTurns, DepositPipeline, AnswerPipeline, ExactnessReportPipeline, SolvePipeline)
        assert [type(x) for x in parts] == list(kinds) and not any(isinstance(lib, k) for k in kinds)
    finally:
        lib.close()
