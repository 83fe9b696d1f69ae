"""A serving process probe-proves its newest artifacts once it is up (Library.warm_proofs, run by the web app's
start-up and by each replica), so that the first answer from each carries the one-hash state proof instead of
paying the probe forward. The warm-up is the first-use check itself: same bytes served, a failed probe
quarantines, and what an answer would refuse or skip is passed over and said why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from errors import IntegrityError, InvalidInput
from graft_core import graft, proof
from services import AnswerOptions, limits
from tests.test_first_use_probe import TEXT, Q, _tampered
from tests.test_maintenance import make_lib
from web import startup

OTHER = "The lighthouse of Quenmora was built in 1841.\n"
THIRD = "Its keeper was Hild Sarrow.\n"
graft_restore = graft.restore


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return make_lib(kvgraft_home, tiny_gemma)


def test_warmed_artifacts_answer_first_with_the_state_proof_and_the_same_bytes(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    cold = lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))  # this process's first use: the probe
    assert cold.proof.kind == "probe" and cold.proof.passed
    lib.artifacts.forget_proofs()  # a new process
    report = lib.warm_proofs(8)
    assert (report.proved, report.already, report.skipped, report.quarantined) == (1, 0, 0, ())
    assert "probe-proved 1 artifacts" in report.line()
    monkeypatch.setattr(lib.artifacts, "probe", lambda *a, **k: pytest.fail("warmed: the answer must not probe"))
    warm = lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))
    assert warm.proof.kind == "state" and warm.proof.passed and warm.proof.state_digest == cold.proof.state_digest
    assert (warm.output_sha256, warm.logits_sha256) == (cold.output_sha256, cold.logits_sha256)
    again = lib.warm_proofs(8)  # nothing left to prove
    assert (again.proved, again.already) == (0, 1)


def test_the_limit_takes_the_newest_and_the_rest_prove_themselves(lib):
    oldest = lib.deposit_text(TEXT)
    lib.deposit_text(OTHER)
    lib.deposit_text(THIRD)
    lib.artifacts.forget_proofs()
    report = lib.warm_proofs(2)
    assert report.proved == 2 and lib.store.catalog.get(oldest.id).content_sha256 not in lib.artifacts.proven()
    assert lib.answer(Q, AnswerOptions(artifact=oldest.id, max_new_tokens=2)).proof.kind == "probe"
    assert lib.warm_proofs(0).proved == 0 and lib.warm_proofs(0).seconds < 1


def test_a_failed_warm_probe_quarantines_and_the_answer_refuses(lib, monkeypatch):
    bad = lib.deposit_text(TEXT)
    good = lib.deposit_text(OTHER)
    lib.artifacts.forget_proofs()
    tampered = _tampered(graft.restore)
    monkeypatch.setattr(  # the probe restores through proof's own name for it
        proof, "restore", lambda lm, chain: tampered(lm, chain) if chain[-1].key == bad.id else graft_restore(lm, chain)
    )
    report = lib.warm_proofs(8)
    assert report.quarantined == (bad.id,) and report.proved == 1 and "1 quarantined" in report.line()
    assert lib.store.catalog.get(bad.id).quarantine.startswith("probe check failed")
    monkeypatch.setattr(proof, "restore", graft_restore)
    with pytest.raises(IntegrityError, match="quarantined"):
        lib.answer(Q, AnswerOptions(artifact=bad.id, max_new_tokens=2))
    assert lib.answer(Q, AnswerOptions(artifact=good.id, max_new_tokens=2)).proof.kind == "state"


def test_quarantined_foreign_and_unprobed_artifacts_are_passed_over_with_the_reason(lib, monkeypatch):
    q = lib.deposit_text(TEXT)
    foreign = lib.deposit_text(OTHER)
    unprobed = lib.deposit_text(THIRD)
    lib.artifacts.forget_proofs()
    lib.store.catalog.set_quarantine(q.id, "test: quarantined by hand")
    real_list = lib.store.catalog.list_artifacts

    def listed(**kw):
        out = []
        for r in real_list(**kw):
            if r.id == foreign.id:
                r = replace(r, model_fingerprint="0" * 64)
            elif r.id == unprobed.id:
                r = replace(r, probe_sha256=None)
            out.append(r)
        return out

    monkeypatch.setattr(lib.store.catalog, "list_artifacts", listed)
    monkeypatch.setattr(lib.artifacts, "probe", lambda *a, **k: pytest.fail("nothing here may be probed"))
    report = lib.warm_proofs(8)
    assert (report.proved, report.skipped, report.quarantined) == (0, 3, ())
    assert sorted(report.skipped_why) == sorted(
        [f"{q.id[:12]}: quarantined", f"{foreign.id[:12]}: another model fingerprint", f"{unprobed.id[:12]}: no probe hash"]
    )


def test_an_unreadable_artifact_is_passed_over_not_fatal(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    ok = lib.deposit_text(OTHER)
    lib.artifacts.forget_proofs()
    real = lib.artifacts.probe

    def probe(i, **k):
        if i == d.id:
            raise IntegrityError(f"blob of {i} is missing")
        return real(i, **k)

    monkeypatch.setattr(lib.artifacts, "probe", probe)
    report = lib.warm_proofs(8)
    assert report.proved == 1 and report.skipped == 1 and "is missing" in report.skipped_why[0]
    assert (
        lib.store.catalog.get(ok.id).content_sha256 in lib.artifacts.proven() and lib.store.catalog.get(d.id).quarantine is None
    )


def test_the_startup_warms_after_its_stages_and_only_when_asked(lib):
    d = lib.deposit_text(TEXT)
    lib.artifacts.forget_proofs()
    startup.run(lib, startup.Startup(), seed=None)
    assert not lib.artifacts.proven()  # warm=0: nothing proved ahead
    tracker = startup.Startup()
    startup.run(lib, tracker, seed=None, warm=4)
    assert tracker.ready and lib.store.catalog.get(d.id).content_sha256 in lib.artifacts.proven()
    assert [s.key for s in tracker.snapshot().stages] == ["convert", "load", "seed", "index"]  # not a stage


def test_the_limit_comes_from_the_environment_and_bad_values_stop_the_start(monkeypatch):
    monkeypatch.delenv(limits.WARM_PROOFS_ENV, raising=False)
    assert limits.warm_proofs_limit() == limits.DEFAULT_WARM_PROOFS
    monkeypatch.setenv(limits.WARM_PROOFS_ENV, "0")
    assert limits.warm_proofs_limit() == 0
    monkeypatch.setenv(limits.WARM_PROOFS_ENV, "12")
    assert limits.warm_proofs_limit() == 12
    for bad in ("-1", "many", "1e3", "012"):
        monkeypatch.setenv(limits.WARM_PROOFS_ENV, bad)
        with pytest.raises(InvalidInput, match="KVGRAFT_WARM_PROOFS must be a whole number from 0 to 100,000, got "):
            limits.warm_proofs_limit()
    monkeypatch.setenv(limits.WARM_PROOFS_ENV, "100001")
    with pytest.raises(InvalidInput, match="^KVGRAFT_WARM_PROOFS must be a whole number from 0 to 100,000, got '100001'$"):
        limits.warm_proofs_limit()
