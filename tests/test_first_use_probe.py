"""An artifact's first answer in a process proves its restored state with the probe (and remembers the
state's BLAKE3); every later answer proves its served state by that hash alone (the per-answer
proof costs one hash). A failed proof of either kind quarantines and refuses before any token is chosen."""

from __future__ import annotations

import pytest

from errors import IntegrityError
from graft_core import generate
from services import AnswerOptions
from tests.test_maintenance import make_lib

TEXT = "The harbour master of Quenmora was Osric Pellamy.\n"
Q = "Who was the harbour master of Quenmora?"


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return make_lib(kvgraft_home, tiny_gemma)


def test_first_answer_runs_the_probe_and_later_answers_prove_by_the_state_hash(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    row = lib.store.catalog.get(d.id)
    first = lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))
    assert first.proof.kind == "probe" and first.proof.passed and first.proof.observed == row.probe_sha256
    state = lib.artifacts.state(row.content_sha256)
    assert state.digest == first.proof.state_digest and state.probe_sha256 == row.probe_sha256
    monkeypatch.setattr(lib.artifacts, "probe", lambda *a, **k: pytest.fail("the leaf is proved already"))
    later = lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))
    assert later.proof.kind == "state" and later.proof.passed and later.proof.expected == state.digest
    assert (later.output_sha256, later.logits_sha256) == (first.output_sha256, first.logits_sha256)
    lib.artifacts.forget_proofs()  # a new process: the probe again, the same bytes served
    again = lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))
    assert again.proof.kind == "probe" and (again.output_sha256, again.logits_sha256) == (
        first.output_sha256,
        first.logits_sha256,
    )


def test_a_chain_checks_its_ancestors_separately_and_the_leaf_in_the_answer(lib, monkeypatch):
    root = lib.deposit_text(TEXT)
    child = lib.deposit_text("He kept the ledger for forty years.\n", parent=root.id)
    lib.artifacts.forget_proofs()
    checked = []
    real = lib.artifacts.probe
    monkeypatch.setattr(lib.artifacts, "probe", lambda i, **k: checked.append(i) or real(i, **k))
    r = lib.answer(Q, AnswerOptions(artifact=child.id, max_new_tokens=2))
    assert checked == [root.id] and r.proof.kind == "probe" and r.proof.passed


def _tampered(restore):
    def tampered(lm, chain):
        cache = restore(lm, chain)
        cache.layers[0].keys = cache.layers[0].keys * 1.5  # the served state is not the deposited one
        return cache

    return tampered


def test_a_mismatching_first_use_probe_quarantines_before_any_token(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    monkeypatch.setattr(generate, "restore", _tampered(generate.restore))
    tokens = []
    with pytest.raises(IntegrityError, match=f"artifact {d.id} is quarantined .*probe check failed"):
        lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3), on_token=tokens.append)
    assert tokens == []
    assert lib.store.catalog.get(d.id).quarantine.startswith("probe check failed")
    with pytest.raises(IntegrityError, match="quarantined"):
        lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3))


def test_a_served_state_unlike_the_proved_one_quarantines_before_any_token(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=2))  # proved
    monkeypatch.setattr(generate, "restore", _tampered(generate.restore))
    tokens = []
    with pytest.raises(IntegrityError, match=f"artifact {d.id} is quarantined .*state proof failed"):
        lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=3), on_token=tokens.append)
    assert tokens == [] and lib.store.catalog.get(d.id).quarantine.startswith("state proof failed")
