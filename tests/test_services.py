"""services.Library on a tiny model and the fast fake embedder: the deposit gate, hash-before-work,
retrieval and graft, exact composition through chains, and the labelled relocated composition."""

from __future__ import annotations

import pytest

import services
from errors import InputTooLong, InvalidInput, VerificationFailed
from retrieval import HashEmbedder
from services import AnswerOptions

FACTS = [
    ("Who built the Varnek lighthouse?", "The Varnek lighthouse was built by Osric Pellamy.", "Osric Pellamy"),
    ("What colour is the Quillon moth?", "The Quillon moth has copper-green wings.", "copper-green"),
]


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    yield lib
    lib.close()


def test_verified_deposit_and_refusal(lib):
    q, s, a = FACTS[0]
    d = lib.deposit_item(q, s, a, "exact", a)
    assert d.created and d.verified and d.kind == "verified" and d.verifier == "exact" and d.start == 0
    again = lib.deposit_item(q, s, a, "exact", a)
    assert (again.id, again.created, again.prefill_s) == (d.id, False, 0.0)  # hash before work
    with pytest.raises(
        VerificationFailed, match=r"refused, nothing deposited: answer 'Osric': it does not name the reference 'Osric Pellamy'"
    ):
        lib.deposit_item(q, s, "Osric", "exact", a)
    assert lib.count() == 1
    with pytest.raises(VerificationFailed, match="admins only"):
        lib.deposit_item(q, s, a, "attested", "Dr. A. Rivera")


def test_text_deposit_is_unverified_unless_attested(lib):
    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    assert d.kind == "text" and not d.verified
    with pytest.raises(VerificationFailed, match="only an admin can attest"):
        lib.deposit_text("Another sheet.", attested_by="Dr. A. Rivera")
    att = lib.deposit_text("Another sheet.", attested_by="Dr. A. Rivera", admin=True)
    assert att.kind == "attested" and att.verifier == "attested"


def test_answer_retrieves_grafts_checks_and_records(lib):
    ids = [lib.deposit_item(q, s, a, "exact", a).id for q, s, a in FACTS]
    r = lib.answer(FACTS[0][0], AnswerOptions(k=2, check=True, max_new_tokens=4, threshold=0.0))
    assert r.retrieved[0].id == ids[0] and r.tier == "exact"
    assert r.check.exact and r.check.fresh_sha256 == r.check.grafted_sha256
    assert r.grafted_tokens == lib.store.catalog.get(ids[0]).end_pos
    assert set(r.to_json()) >= {"answer", "grafted_tokens", "computed_tokens", "decode_tokens", "ttft_s", "check", "retrieved"}
    row = lib.ledger()[-1]
    assert row.id == r.ledger_id and row.exact is True and row.output_sha256 == r.output_sha256


def test_no_hit_answers_without_graft_and_says_so(lib):
    lib.deposit_item(*FACTS[0][:3], "exact", FACTS[0][2])
    r = lib.answer("zzzz qqqq", AnswerOptions(threshold=0.99, max_new_tokens=3))
    assert r.tier == "none" and r.grafted_tokens == 0 and r.note.startswith("no artifact above similarity 0.99")


def test_compose_builds_an_exact_chain_once(lib):
    a, b = (lib.deposit_item(q, s, ans, "exact", ans).id for q, s, ans in FACTS)
    leaf = lib.compose([a, b])
    chain = lib.store.catalog.chain(leaf)
    assert [c.id for c in chain][0] == a and len(chain) == 2 and chain[1].parent_id == a
    assert lib.compose([a, b]) == leaf  # deterministic keys: composing again costs nothing
    r = lib.answer("anything", AnswerOptions(artifact=leaf, check=True, max_new_tokens=3))
    assert r.tier == "exact" and r.check.exact
    # the composed child's verdict is a fresh gate run on its own chain, not a copy of b's
    (vb,), (vc,) = lib.store.catalog.verifications(b), lib.store.catalog.verifications(leaf)
    assert vc.artifact_id == leaf and "re-gated after the new parent" in vc.detail
    assert vc.question_token_ids == vb.question_token_ids and vc.counts_as_verified


def test_compose_stores_unverified_when_the_graft_fails_after_the_new_parent(lib, monkeypatch):
    import verifiers
    from services import gate

    a, b = (lib.deposit_item(q, s, ans, "exact", ans).id for q, s, ans in FACTS)
    monkeypatch.setattr(gate, "judge", lambda answer, v, r, q="": verifiers.Verdict(False, v, f"test double refused {answer!r}"))
    leaf = lib.compose([a, b])
    assert lib.store.catalog.verifications(leaf) == [] and lib.store.catalog.chain(leaf)[0].id == a
    shown = lib.show(leaf).to_json()
    assert shown["verified"] is False and shown["provenance"] == "unverified"


def test_relocated_composition_is_labelled_with_its_divergence(lib):
    for q, s, a in FACTS:
        lib.deposit_item(q, s, a, "exact", a)
    # A question about both items: the relevance stage keeps both roots (a question about one drops the other).
    both = "What colour is the Quillon moth, and who built the Varnek lighthouse?"
    r = lib.answer(both, AnswerOptions(k=2, relocated=True, check=True, max_new_tokens=3, threshold=0.0))
    assert r.tier == "relocated" and "approximate" in r.note and len(r.artifact_ids) == 2
    assert r.check.tier == "relocated" and r.check.exact is False
    assert r.check.max_abs_diff > 0  # later parts never saw the earlier ones: measured, not hidden


def test_inputs_are_bounded(lib):
    with pytest.raises(InvalidInput, match="question is empty"):
        lib.answer("  ")
    with pytest.raises(InputTooLong, match="question is 4,001 characters; the limit is 4,000"):
        lib.answer("x" * 4001)
    with pytest.raises(InvalidInput, match="contains NUL bytes"):
        lib.answer("a\x00b")
    with pytest.raises(InvalidInput, match="k must be between 1 and 16"):
        lib.answer("hi", AnswerOptions(k=0))


def test_the_exactness_report_reports_byte_equality(lib):
    for q, s, a in FACTS:
        lib.deposit_item(q, s, a, "exact", a)
    rep = lib.exactness_report(4)
    assert rep.samples == 4 and rep.byte_equal == 4 and rep.max_kl == 0.0 and rep.argmax_agreement == 1.0
    rel = lib.exactness_report(2, relocate=50)
    assert all(r.check.tier == "relocated" for r in rel.rows)
    assert rel.byte_equal == sum(r.check.fresh_sha256 == r.check.grafted_sha256 for r in rel.rows) == 0
    # --relocate 0 re-places each root at its own position: byte-equal on every sample, counted from the hashes
    zero = lib.exactness_report(3, relocate=0)
    assert zero.byte_equal == 3 and all(r.check.tier == "relocated" and r.check.exact for r in zero.rows)


def test_a_new_embedder_embeds_the_store_again_before_it_searches(lib):
    """A store made under another embedder id (here a fake of another width): the first index() embeds every
    artifact from its source (the question where there is one), in one catalog version, and retrieval finds
    them; the old vectors stay, under their own id."""
    item = lib.deposit_item(*FACTS[0][:3], "exact", FACTS[0][2]).id
    text = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.").id
    old_id, before = lib.embedder.embedder_id, lib.store.catalog.version()
    new = services.Library(home=lib.home, lm=lib.lm, embedder=HashEmbedder(dim=32))
    assert new.store.catalog.embeddings("hash-32@1") == []
    assert new.index().ids() == {item, text}
    assert new.store.catalog.version() == before + 1
    vectors = dict(new.store.catalog.embeddings("hash-32@1"))
    assert vectors[item] == new.embedder.embed(FACTS[0][0]).astype("<f4").tobytes()
    assert vectors[text] == new.embedder.embed("Fact sheet: the Brannock Spire is 212 metres tall.").astype("<f4").tobytes()
    assert [h.id for h in new.retrieve(FACTS[0][0], threshold=0.5)][:1] == [item]
    assert {a for a, _ in new.store.catalog.embeddings(old_id)} == {item, text}
    assert new.index().ids() == {item, text} and new.store.catalog.version() == before + 1  # nothing left to embed
    late = lib.deposit_item(*FACTS[1][:3], "exact", FACTS[1][2]).id  # a replica still on the old embedder
    idx = new.index()
    assert idx.ids() == {item, text, late} and idx is new.index()  # synced in place, the late one embedded
    assert dict(new.store.catalog.embeddings("hash-32@1"))[late] == new.embedder.embed(FACTS[1][0]).astype("<f4").tobytes()
    new.close()


def test_a_store_that_refuses_the_new_vectors_still_answers_and_rebuild_says_why(lib, monkeypatch):
    """The catch-up's write fails (a read-only disk): the index is built from the vectors the store has
    and an answer goes on without a graft; `rebuild_index`, which must save, raises the store's error."""
    from errors import StorageError, storage_error

    lib.deposit_item(*FACTS[0][:3], "exact", FACTS[0][2])
    new = services.Library(home=lib.home, lm=lib.lm, embedder=HashEmbedder(dim=32))

    def refused(made):
        raise storage_error(30, lib.home)

    monkeypatch.setattr(new.store.catalog, "add_embeddings", refused)
    assert new.index().ids() == set()
    assert new.answer(FACTS[0][0], AnswerOptions(max_new_tokens=2)).grafted_tokens == 0
    with pytest.raises(StorageError, match="read-only file system"):
        new.store.rebuild_index()
    new.close()


def test_index_follows_the_catalog_incrementally(lib, tmp_path):
    a = lib.deposit_item(*FACTS[0][:3], "exact", FACTS[0][2]).id
    idx = lib.index()
    assert idx.ids() == {a}
    other = services.Library(home=lib.home, lm=lib.lm, embedder=lib.embedder)  # another replica on the same store
    b = other.deposit_item(*FACTS[1][:3], "exact", FACTS[1][2]).id
    synced = lib.index()
    assert synced is idx  # updated in place, not rebuilt
    assert synced.ids() == {a, b} and synced.version == lib.store.catalog.version()
    other.store.catalog.delete(b)
    assert lib.index().ids() == {a}
    other.close()


def test_answers_from_one_artifact_share_its_decoded_rows_only_while_a_cache_holds_them(lib, monkeypatch):
    """While a restored cache holds an artifact, another load of it is that object (one read, one copy of its
    rows for every answer grafting it); once no cache holds it, a load reads and hash-checks the blob again."""
    import gc

    from graft_core.graft import restore

    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    reads = []
    get = lib.store.blobs.get
    monkeypatch.setattr(lib.store.blobs, "get", lambda h: reads.append(h) or get(h))
    first, _ = lib.load_chain(d.id)
    cache = restore(lib.lm, first)
    del first
    again, _ = lib.load_chain(d.id)
    assert again[0] is cache.grafted[0] and len(reads) == 1
    assert cache.layers[0].keys.data_ptr() == restore(lib.lm, again).layers[0].keys.data_ptr()  # the same tensor
    del again, cache
    gc.collect()
    fresh, _ = lib.load_chain(d.id)
    assert len(reads) == 2 and reads[0] == reads[1] == lib.store.catalog.get(d.id).content_sha256
    assert fresh[0].key == d.id
