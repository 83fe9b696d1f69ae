"""The deposit gate on the real default model (integration tier): the gate refuses a solution that contradicts
its reference and leaves nothing, accepts a consistent one whose paraphrase is then answered from the
graft; a bundle with edited source text or an edited verification is refused; a flipped probe hash
quarantines; `verify --relocate 0` is byte-equal on every sample."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import services
import verifiers
from db import connection as dbconn
from db.schema import artifacts
from errors import IntegrityError, VerificationFailed
from services import AnswerOptions
from tests.test_gate import _forge_kv, _same_length_pair, _tamper_catalog  # the careful tamperers (re-hash what they edit)

pytestmark = pytest.mark.integration

Q = "How many times does the Velmora bell ring at noon?"
GOOD = "The Velmora bell rings 11 times at noon, once for each founding family."
CONTRADICTS = "The Velmora bell rings seven times at noon, once for each founding family."
PARAPHRASE = "At noon, how many times does the bell of Velmora ring?"


@pytest.fixture(scope="module")
def store(tmp_path_factory, real_lm):
    """One real-model store with the consistent item deposited (the gate is the expensive part)."""
    lib = services.Library(home=tmp_path_factory.mktemp("gate-home"), lm=real_lm)
    d = lib.deposit_item(Q, GOOD, None, "numeric", "11")
    yield lib, d
    lib.close()


def test_a_contradicting_solution_is_refused_and_leaves_nothing(tmp_path, real_lm):
    lib = services.Library(home=tmp_path / "home", lm=real_lm)
    with pytest.raises(VerificationFailed) as e:
        lib.deposit_item(Q, CONTRADICTS, "11", "numeric", "11")  # the typed answer passes the pre-check
    assert str(e.value).startswith("the model answered ") and str(e.value).endswith("the reference is '11'; nothing deposited")
    assert lib.count() == 0 and list(lib.store.blobs) == [] and len(lib.index()) == 0


def test_a_consistent_solution_is_accepted_and_its_paraphrase_answered_from_the_graft(store):
    lib, d = store
    assert d.created and d.verified and d.provenance == "verified"
    print(f"gate cost: {d.gate_s:.2f} s, {d.gate_tokens} tokens; prefill {d.prefill_s:.2f} s, {d.prefill_tokens} tokens")
    r = lib.answer(PARAPHRASE, AnswerOptions(max_new_tokens=16))
    assert r.artifact_ids == (d.id,) and r.tier == "exact"
    assert verifiers.judge(r.answer, "numeric", "11", Q).ok, r.answer


def test_bundles_with_edited_source_text_or_verification_are_refused(store, tmp_path, real_lm):
    lib, d = store
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    target = services.Library(home=tmp_path / "target", lm=real_lm)

    def text(cat):
        cat["sources"][0]["text"] = cat["sources"][0]["text"].replace("11 times", "seven times")

    with pytest.raises(IntegrityError, match="tokenises to other tokens than the artifact holds"):
        services.import_bundle(target, _tamper_catalog(out, tmp_path / "text.tar", text))

    def reference(cat):
        cat["verifications"][0]["reference"] = "12"

    with pytest.raises(IntegrityError, match="its verification does not replay here"):
        services.import_bundle(target, _tamper_catalog(out, tmp_path / "ref.tar", reference))
    assert target.count() == 0
    rep = services.import_bundle(target, out)
    assert rep.replayed == 1 and target.show(d.id).verifications[-1].counts_as_verified


def test_a_flipped_byte_in_the_stored_probe_hash_quarantines(store, tmp_path, real_lm):
    lib, d = store
    home = tmp_path / "copy"
    out = tmp_path / "c.tar"
    services.export_bundle(lib, [d.id], out)
    other = services.Library(home=home, lm=real_lm)
    services.import_bundle(other, out, trust_verdicts=True)
    probe = other.store.catalog.get(d.id).probe_sha256
    with dbconn.write(other.store.catalog._engine) as conn:
        conn.execute(
            sa.update(artifacts)
            .where(artifacts.c.id == d.id)
            .values(probe_sha256=probe[:-1] + ("0" if probe[-1] != "0" else "1"))
        )
    other.artifacts.forget_proofs()
    with pytest.raises(IntegrityError, match="quarantined"):
        other.answer(Q, AnswerOptions(max_new_tokens=4, artifact=d.id))
    assert [q.id for q in services.fsck(other).quarantined] == [d.id]


def test_relocate_zero_is_byte_equal_on_every_sample(store):
    lib, _ = store
    rep = lib.exactness_report(3, relocate=0)
    assert rep.byte_equal == 3 and all(s.check.fresh_sha256 == s.check.grafted_sha256 for s in rep.rows)


def test_a_bundle_whose_kv_does_not_come_from_its_tokens_is_refused(tmp_path, real_lm):
    """The forgery found against the running app: a fact sheet's KV state and probe hash kept, its name swapped for
    another of the same token count, every id and hash rewritten; the import recomputes and refuses it."""
    lib = services.Library(home=tmp_path / "source", lm=real_lm)
    true_text, forged_text = _same_length_pair(real_lm)
    d = lib.deposit_text(true_text, title="keeper")
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    bad, forged_id = _forge_kv(out, tmp_path / "forged.tar", real_lm, true_text, forged_text)
    target = services.Library(home=tmp_path / "target", lm=real_lm)
    with pytest.raises(IntegrityError, match=f"artifact {forged_id}: recomputed here from its own tokens it is not the bundle's"):
        services.import_bundle(target, bad)
    assert target.count() == 0
    assert services.import_bundle(target, out).probes_checked == 1  # the honest bundle recomputes to its bytes


def test_an_attested_bundle_arrives_unverified_without_trust(tmp_path, real_lm):
    lib = services.Library(home=tmp_path / "source", lm=real_lm)
    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.", attested_by="Dr. A. Rivera", admin=True)
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    target = services.Library(home=tmp_path / "target", lm=real_lm)
    rep = services.import_bundle(target, out)
    assert rep.attested_dropped == 1 and [e.verdict for e in target.entries()] == ["unverified"]


TZERIN_Q = "What colour is the flag of the free city of Tzerin?"
TZERIN_S = "The charter of the free city of Tzerin fixes its flag as plain saffron with no emblem."


def test_the_tzerin_deposit_is_accepted_for_what_its_answer_asserts(tmp_path, real_lm):
    """The case a new user tried: the model's sentence carries a "no" that belongs to "emblem"; a span heuristic
    judges the whole sentence against 'saffron' and refuses it, the gate reads what the sentence asserts."""
    lib = services.Library(home=tmp_path / "home", lm=real_lm)
    d = lib.deposit_item(TZERIN_Q, TZERIN_S, None, "exact", "saffron")
    assert d.created and d.verified and d.provenance == "verified"
    [v] = lib.show(d.id).verifications
    said = "The flag of the free city of Tzerin is a plain saffron with no emblem."
    assert v.detail.startswith(f"with the solution grafted the model answered {said!r}; "), v.detail
    assert lib.store.catalog.source(d.id).answer == "saffron"  # the deposited answer is the claimed value


def test_a_solution_that_denies_the_reference_is_refused(tmp_path, real_lm):
    lib = services.Library(home=tmp_path / "home", lm=real_lm)
    denial = "The charter of the free city of Tzerin fixes its flag as plain crimson, never saffron."
    with pytest.raises(VerificationFailed, match=r"the reference is 'saffron'; nothing deposited$"):
        lib.deposit_item(TZERIN_Q, denial, None, "exact", "saffron")
    assert lib.count() == 0
