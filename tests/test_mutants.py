"""The suite's guarantees about itself: every mutation site of scripts/mutants.py still exists exactly once
(so `make mutants` keeps testing the code that is there), and with CI set a skip is a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts import mutants

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutation_site_exists_once_and_names_existing_tests():
    assert mutants.check_sites() == []
    for m in mutants.MUTATIONS:
        assert m.old != m.new and m.tests, m.name
        for t in m.tests:
            path, _, name = t.partition("::")
            assert (ROOT / path).is_file(), t
            if name:
                assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(encoding="utf-8"), t


def test_a_site_refactored_away_is_reported(tmp_path):
    for m in mutants.MUTATIONS:
        (tmp_path / m.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m.path).write_text("refactored away\n", encoding="utf-8")
    problems = mutants.check_sites(tmp_path)
    assert len(problems) == len(mutants.MUTATIONS)
    m = mutants.MUTATIONS[0]
    assert problems[0] == f"{m.name}: {m.path} holds the site {m.old!r} 0 times, not once; update scripts/mutants.py"


def _run_skipping_test(tmp_path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_needs_something():\n    pytest.skip('frobnicator is missing')\n", encoding="utf-8"
    )
    env = {**os.environ, "CI": ci}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "tests.conftest",
        "-p",
        "no:cacheprovider",
        str(tmp_path / "test_skips.py"),
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def test_with_ci_set_a_skip_is_a_failure_that_names_what_is_missing(tmp_path):
    res = _run_skipping_test(tmp_path, "true")
    assert res.returncode == 1, res.stdout
    assert "CI is set, so a skip is a failure: Skipped: frobnicator is missing" in res.stdout
    res = _run_skipping_test(tmp_path, "")
    assert res.returncode == 0 and "1 skipped" in res.stdout, res.stdout
