"""Shared fixtures: an isolated data directory for every test, tiny models built once per session,
and the real default model loaded once per session for the integration tier. With `CI` set (.ci/run
sets it) every skip is a failure: PostgreSQL, browser and real-model tests must run there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _fail_skip_in_ci(rep) -> None:
    if in_ci() and rep.skipped and not hasattr(rep, "wasxfail"):
        why = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"CI is set, so a skip is a failure: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.fixture(autouse=True)
def kvgraft_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own store; nothing touches the user's ~/.local/share/kvgraft."""
    home = tmp_path / "kvgraft-home"
    monkeypatch.setenv("KVGRAFT_HOME", str(home))
    monkeypatch.delenv("KVGRAFT_DB_URL", raising=False)
    monkeypatch.delenv("KVGRAFT_ADMIN_TOKEN", raising=False)
    return home


def accepting_judge(monkeypatch) -> None:
    """Replace the deposit gate's verdict with a test double that accepts whatever the model generated."""
    import verifiers
    from services import gate

    monkeypatch.setattr(gate, "judge", lambda answer, v, r, q="": verifiers.Verdict(True, v, f"test double accepted {answer!r}"))


@pytest.fixture(autouse=True)
def tiny_gate_judge(request, monkeypatch):
    """A randomly initialised tiny model cannot answer any question, so in the fast tier the deposit
    gate's *verdict* is a test double that accepts whatever the model generated; everything else of
    the gate (the scratch fact graft, the graft of the new artifact, generation, the recorded token
    ids) runs for real. Tests marked `real_gate` and the integration/browser tiers use the real
    verifiers (tests/test_gate.py checks that a tiny model is refused by them). Module-scoped fixtures
    that deposit on the tiny model call `accepting_judge` themselves (they run before this one)."""
    if any(request.node.get_closest_marker(m) for m in ("real_gate", "integration", "browser")):
        return
    accepting_judge(monkeypatch)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    from graft_core import tiny

    root = tmp_path_factory.mktemp("tiny-models")
    dirs = {kind: tiny.build(kind, root / kind) for kind in ("gemma3", "llama")}
    dirs["outside"] = tiny.build("llama", root / "outside", hidden_act="gelu")  # a Llama the definition does not cover
    return dirs


@pytest.fixture(scope="session")
def tiny_gemma(tiny_dirs):
    from graft_core import model

    return model.load(str(tiny_dirs["gemma3"]))


@pytest.fixture(scope="session")
def tiny_gemma_torch(tiny_dirs):
    """The tiny Gemma with torch's (MKL's) products instead of fma16 (KVGRAFT_LINEAR=torch): an explicitly
    separate numerical class, whose checks (graft_core.products, batch widths) these
    tests keep exercising where fma16 runs."""
    from graft_core import model

    return model.load(str(tiny_dirs["gemma3"]), linear="torch")


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs):
    """The tiny Llama (GQA, untied embeddings): another model under the numerical definition (tests/test_llama.py)."""
    from graft_core import model

    return model.load(str(tiny_dirs["llama"]))


@pytest.fixture(scope="session")
def tiny_outside(tiny_dirs):
    """A tiny Llama with the exact GELU: outside the numerical definition, so loaded on the machine-bound path it
    opts into (KVGRAFT_MACHINE_BOUND; without it the load is refused, tests/test_machine_bound.py)."""
    from graft_core import model

    return model.load(str(tiny_dirs["outside"]), machine_bound=True)


@pytest.fixture(scope="session")
def real_lm():
    """The packaged Gemma 3 270M, converted into the user's model cache on first use (about a minute)."""
    from graft_core import model

    return model.load()


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL cluster for the session (tests/pgserver.py). Without PostgreSQL
    installed the test is skipped, unless the CI environment variable is set: then it fails."""
    from tests import pgserver

    try:
        server = pgserver.start()
    except pgserver.PgUnavailable as e:
        if in_ci():
            pytest.fail(f"CI is set but PostgreSQL cannot run: {e}", pytrace=False)
        pytest.skip(f"PostgreSQL is missing: {e} (make system-deps; with CI=true this is a failure)")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request) -> str | None:
    """Each catalog test twice: None (SQLite in the home) or a fresh, empty PostgreSQL database."""
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture(scope="session")
def postgres_url(pg_server) -> str:
    """URL of an empty database (postgresql+psycopg://kvgraft@127.0.0.1:PORT/kvgraft) on the session cluster."""
    return pg_server.create_database("kvgraft")
