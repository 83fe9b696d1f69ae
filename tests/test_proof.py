"""The proof an answer carries is about what was served: at first use the restored state's probe row
against the deposit-time hash and the served state's BLAKE3 against the probed one's, later the served
state's BLAKE3 against the proved one (every grafted answer), and the served logits rows against a fresh
recomputation (the full check). A graft served from the wrong cache fails both. Fast tier on the tiny
models; the probe tokenisation and the proofs on the real model in the integration tier."""

from __future__ import annotations

import json

import pytest
import torch

import services
from graft_core import exactness, generate, templates
from graft_core import proof as proof_mod
from graft_core.capture import capture
from graft_core.forward import new_cache
from graft_core.graft import restore
from graft_core.layers import state_digest
from graft_core.probe import probe_ids
from graft_core.proof import proven
from retrieval import HashEmbedder
from services import AnswerOptions

TEXT = "Fact: the lighthouse of Varnek Isle was built by Osric Pellamy in 1874.\n"


def _ids(lm, text, bos=True):
    return list(lm.tokenizer(text, add_special_tokens=bos)["input_ids"])


def _empty_restore(lm, chain):
    return new_cache(lm.model)


@pytest.mark.parametrize("kind", ["gemma", "llama"])
def test_a_grafted_answer_carries_a_passing_probe_proof_and_its_served_rows_are_exact(kind, request):
    lm = request.getfixturevalue(f"tiny_{kind}")
    art, _ = capture(lm, _ids(lm, TEXT * 2))
    ans = generate.answer(lm, [art], "who built it?", max_new_tokens=5, run_check=True)
    assert list(ans.prompt_ids[: len(probe_ids(lm))]) == probe_ids(lm)
    p = ans.proof
    assert p.kind == "probe" and p.passed is True, p
    assert p.observed == p.expected == art.probe_sha256 and p.state_digest == state_digest(restore(lm, [art]))
    assert ans.check.exact and ans.check.tokens_equal
    # the full check compares the rows that chose the served tokens: its grafted hash is the ledger's
    assert ans.check.grafted_sha256 == ans.logits_sha256 == ans.check.fresh_sha256
    assert ans.check.rows == ans.decode_tokens and ans.check.kl == 0.0 and ans.check.max_abs_diff == 0.0


def test_an_answer_served_from_a_wrong_cache_fails_the_proof_and_the_full_check(tiny_gemma, monkeypatch):
    lm = tiny_gemma
    art, _ = capture(lm, _ids(lm, TEXT * 2))
    monkeypatch.setattr(generate, "restore", _empty_restore)
    monkeypatch.setattr(proof_mod, "restore", _empty_restore)  # the probe restores the same wrong way
    ans = generate.answer(lm, [art], "who built it?", max_new_tokens=5, run_check=True)
    assert ans.tier == "exact"  # the label says exact; the data says otherwise
    assert ans.proof.kind == "probe" and ans.proof.passed is False
    assert ans.proof.observed != art.probe_sha256
    assert not ans.check.exact
    assert ans.check.grafted_sha256 == ans.logits_sha256 != ans.check.fresh_sha256


def test_a_later_answer_proves_its_served_state_by_hash_and_fails_on_one_changed_value(tiny_gemma, monkeypatch):
    lm = tiny_gemma
    art, _ = capture(lm, _ids(lm, TEXT * 2))
    first = generate.answer(lm, [art], "who built it?", max_new_tokens=4)
    known = proven(first.proof)
    assert known is not None and known.digest == first.proof.state_digest
    later = generate.answer(lm, [art], "who built it?", max_new_tokens=4, proven=known)
    assert later.proof.kind == "state" and later.proof.passed is True
    assert later.proof.observed == later.proof.expected == known.digest
    # the proof does not change what is served: same schedule, same bytes
    assert (later.output_sha256, later.logits_sha256) == (first.output_sha256, first.logits_sha256)
    real = generate.restore

    def one_value_off(lm, chain):
        cache = real(lm, chain)
        k = cache.layers[-1].keys.clone()
        k.view(-1)[0] = torch.nextafter(k.view(-1)[0], torch.tensor(float("inf")))  # one ulp
        cache.layers[-1].keys = k
        return cache

    monkeypatch.setattr(generate, "restore", one_value_off)
    refused = []
    bad = generate.answer(lm, [art], "who?", max_new_tokens=2, proven=known, on_proof=refused.append)
    assert bad.proof.kind == "state" and bad.proof.passed is False and bad.proof.observed != known.digest
    assert refused == [bad.proof]


def test_the_exactness_check_is_decided_by_bytes_not_by_the_tier(tiny_gemma, monkeypatch):
    lm = tiny_gemma
    art, _ = capture(lm, _ids(lm, TEXT))
    q = _ids(lm, templates.query_prompt("who?"), bos=False)
    assert exactness.check(lm, [art], q).exact
    monkeypatch.setattr(exactness, "restore", _empty_restore)
    c = exactness.check(lm, [art], q)
    assert c.tier == "exact" and not c.exact and c.fresh_sha256 != c.grafted_sha256


def test_no_proof_applies_without_a_graft_or_an_own_position_and_raw_prompts_get_one(tiny_gemma):
    lm = tiny_gemma
    art, _ = capture(lm, _ids(lm, TEXT))
    plain = generate.answer(lm, [], "who?", max_new_tokens=2)
    moved = generate.answer(lm, [art], "who?", max_new_tokens=2, relocated=True)
    off = generate.answer(lm, [art], "who?", max_new_tokens=2, probe=False)
    assert [a.proof.passed for a in (plain, moved, off)] == [None, None, None]
    assert "nothing grafted" in plain.proof.note and "relocated" in moved.proof.note and "turned off" in off.proof.note
    raw = generate.answer(lm, [art], "Tell me who", max_new_tokens=2, raw=True)  # the proof does not read the prompt
    assert raw.proof.kind == "probe" and raw.proof.passed is True


def test_the_library_reports_and_records_the_proof(tmp_path, tiny_gemma):
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    try:
        d = lib.deposit_item("Who built it?", "Osric Pellamy built it.", "Osric Pellamy", "exact", "Osric Pellamy")
        r = lib.answer("Who built it?", AnswerOptions(artifact=d.id, max_new_tokens=3))
        assert r.check is None and r.proof.passed is True
        assert r.to_json()["proof"]["observed"] == r.proof.expected
        row = lib.ledger()[-1]
        assert json.loads(row.check_json)["proof"]["passed"] is True and row.logits_sha256 == r.logits_sha256
    finally:
        lib.close()


# ---- the real model ---------------------------------------------------------------------------


@pytest.mark.integration
def test_real_prompts_open_with_the_probe_tokens(real_lm):
    lm = real_lm
    for q in ("Who built it?", "what year", '"quoted" question', "3.14 or 22/7?", "  spaced  ", "Ünïcode 東京?"):
        ids = generate.encode_prompt(lm, q, grafted=True)
        assert ids[: len(probe_ids(lm))] == probe_ids(lm), (q, ids[:4])


@pytest.mark.integration
def test_real_probe_proof_passes_on_own_state_and_fails_on_a_wrong_cache(real_lm, monkeypatch):
    lm = real_lm
    arts = [
        capture(lm, _ids(lm, templates.item_text(q, s, a)))[0]
        for q, s, a in (
            ("Who built the lighthouse of Varnek Isle?", "Osric Pellamy built it in 1874.", "Osric Pellamy"),
            ("What is the capital of Quenmora?", "The capital of the island of Quenmora is Tessaly Port.", "Tessaly Port"),
        )
    ]
    long_text = " ".join(f"Entry {i}: the ship Ardel-{i} carried {i * 7} barrels of salt." for i in range(60)) + "\n"
    arts.append(capture(lm, _ids(lm, long_text))[0])
    assert arts[-1].length > lm.info.sliding_window
    for i in range(3):  # its cost is measured by `python -m bench.proof`, not asserted on a shared machine
        ans = generate.answer(lm, [arts[i]], ["Who built it?", "What is the capital?", "How many?"][i], max_new_tokens=8)
        assert ans.proof.passed is True and ans.proof.observed == arts[i].probe_sha256, ans.proof
        later = generate.answer(lm, [arts[i]], "And?", max_new_tokens=2, proven=proven(ans.proof))
        assert later.proof.kind == "state" and later.proof.passed is True
    checked = generate.answer(lm, [arts[2]], "How many barrels?", max_new_tokens=4, run_check=True)
    assert checked.proof.passed and checked.check.exact and checked.check.grafted_sha256 == checked.logits_sha256
    monkeypatch.setattr(generate, "restore", _empty_restore)
    monkeypatch.setattr(proof_mod, "restore", _empty_restore)  # the probe restores the same wrong way
    wrong = generate.answer(lm, [arts[0]], "Who built it?", max_new_tokens=4, run_check=True)
    assert wrong.proof.passed is False and not wrong.check.exact
    known = proven(checked.proof)
    wrong_later = generate.answer(lm, [arts[2]], "How many?", max_new_tokens=2, proven=known)
    assert wrong_later.proof.kind == "state" and wrong_later.proof.passed is False
