"""The first-use probe check of a leaf runs as the answer's own probe chunk (issue 13): no second read,
restore and probe forward; a mismatch still quarantines and refuses before any token is chosen."""

from __future__ import annotations

import pytest

from errors import IntegrityError
from graft_core import generate
from tests.test_maintenance import make_lib

TEXT = "The harbour master of Quenmora was Osric Pellamy.\n"
Q = "Who was the harbour master of Quenmora?"


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return make_lib(kvgraft_home, tiny_gemma)


def test_first_answer_proves_the_leaf_with_its_own_probe_chunk(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    reference = lib.answer(Q, artifact=d.id, max_new_tokens=3)  # probed at deposit: the plain path
    lib._probed.clear()  # a new process
    monkeypatch.setattr(lib, "probe_check", lambda *a, **k: pytest.fail("no separate probe check for the leaf"))
    r = lib.answer(Q, artifact=d.id, max_new_tokens=3)
    assert r.proof.passed and r.proof.observed_sha256 == lib._catalog.get(d.id).probe_sha256
    assert lib._probed[lib._catalog.get(d.id).content_sha256]
    assert (r.output_sha256, r.logits_sha256) == (reference.output_sha256, reference.logits_sha256)


def test_a_chain_checks_its_ancestors_separately_and_the_leaf_in_the_answer(lib, monkeypatch):
    root = lib.deposit_text(TEXT)
    child = lib.deposit_text("He kept the ledger for forty years.\n", parent=root.id)
    lib._probed.clear()
    checked = []
    real = lib.probe_check
    monkeypatch.setattr(lib, "probe_check", lambda i, **k: checked.append(i) or real(i, **k))
    r = lib.answer(Q, artifact=child.id, max_new_tokens=2)
    assert checked == [root.id] and r.proof.passed


def test_a_mismatching_served_probe_quarantines_before_any_token(lib, monkeypatch):
    d = lib.deposit_text(TEXT)
    lib._probed.clear()
    restore = generate.restore

    def tampered(lm, chain):
        cache = restore(lm, chain)
        cache.layers[0].keys = cache.layers[0].keys * 1.5  # the served state is not the deposited one
        return cache

    monkeypatch.setattr(generate, "restore", tampered)
    tokens = []
    with pytest.raises(IntegrityError, match=f"artifact {d.id} is quarantined .*probe check failed"):
        lib.answer(Q, artifact=d.id, max_new_tokens=3, on_token=tokens.append)
    assert tokens == []
    assert lib._catalog.get(d.id).quarantine.startswith("probe check failed")
    with pytest.raises(IntegrityError, match="quarantined"):
        lib.answer(Q, artifact=d.id, max_new_tokens=3)
