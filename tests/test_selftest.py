"""The golden-hash self-test: committed SHA-256s of artifacts and logits for fixed inputs, recomputed
here. A machine whose kernels compute other bits fails these tests (that is their purpose)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graft_core import selftest

ROOT = Path(__file__).resolve().parents[1]
CASES = [f"{c}.{k}" for c in ("short", "long", "chain") for k in ("artifact", "grafted_logits", "fresh_logits")]


def _report_text(rep) -> str:
    return json.dumps(rep.to_json(), indent=1)


def test_tiny_model_matches_its_committed_golden_hashes(tiny_gemma):
    rep = selftest.run(tiny_gemma)
    assert [c.name for c in rep.cases] == [*CASES, "question.logits"]
    assert rep.match, "bits differ from graft_core/golden.json on this machine:\n" + _report_text(rep)
    # grafted == fresh inside each case is the exactness claim itself, pinned here as well
    got = {c.name: c.got for c in rep.cases}
    assert all(got[f"{n}.grafted_logits"] == got[f"{n}.fresh_logits"] for n in ("short", "long", "chain"))
    assert len(set(got[f"{n}.artifact"] for n in ("short", "long", "chain"))) == 3


def test_long_case_is_longer_than_the_window(tiny_gemma):
    ids = selftest._long_ids(tiny_gemma)
    assert len(ids) > tiny_gemma.info.sliding_window


def test_one_changed_golden_hash_is_a_mismatch(tiny_gemma, tmp_path):
    golden = selftest.load_golden()
    entry = golden["sets"][tiny_gemma.fingerprint]
    entry["cases"]["chain.artifact"] = "0" * 64
    rep = selftest.run(tiny_gemma, golden)
    assert not rep.match and [c.name for c in rep.cases if not c.match] == ["chain.artifact"]
    other = selftest.run(tiny_gemma, {"sets": {}})  # no set for this kernel path: never a match
    assert not other.match and all(c.expected is None for c in other.cases)


def test_cli_selftest_json_and_exit_code(tiny_dirs, tmp_path):
    cmd = [sys.executable, "cli.py", "--model", str(tiny_dirs["gemma3"]), "selftest", "--json"]
    ok = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    out = json.loads(ok.stdout)
    assert out["match"] is True and len(out["cases"]) == 10
    assert set(out["cases"][0]) == {"name", "expected", "got"} and out["numerics"] == {"numerics": "kvgraft-f32-v2"}
    bad = tmp_path / "golden.json"
    bad.write_text(json.dumps({"sets": {}}))
    script = (
        "import sys; from graft_core import selftest; from pathlib import Path; selftest.GOLDEN_FILE = Path(sys.argv[1]);"
        "import cli; sys.exit(cli.main(['--model', sys.argv[2], 'selftest', '--json']))"
    )
    miss = subprocess.run(
        [sys.executable, "-c", script, str(bad), str(tiny_dirs["gemma3"])], cwd=ROOT, capture_output=True, text=True
    )
    assert miss.returncode == 1 and json.loads(miss.stdout)["match"] is False, miss.stderr


@pytest.mark.integration
def test_real_model_matches_its_committed_golden_hashes(real_lm):
    rep = selftest.run(real_lm)
    assert rep.match, "bits differ from graft_core/golden.json on this machine:\n" + _report_text(rep)
