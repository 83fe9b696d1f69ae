"""One store, several models (SQLite and PostgreSQL): each artifact is bound to the fingerprint of the model that
made it, retrieval and relevance offer a model only its own artifacts (never another's, even when nearer),
`list --model` filters by a name the store opened the model under or a fingerprint prefix, and the answer's
evidence and the dashboard name the model. Two tiny models (Gemma 3 and Llama shapes) share one store."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cli
import services
from errors import ArtifactNotFound, IncompatibleArtifact, InvalidInput
from retrieval import HashEmbedder
from services import AnswerOptions
from web import views

LIGHTHOUSE = "The lighthouse of Varnek Isle was built by Osric Pellamy in 1874."
SALT = "The ship Ardel carried salt barrels to Quenmora every spring."


@pytest.fixture
def two(tmp_path, url, tiny_gemma, tiny_llama):
    """(store home, db url, the Gemma's library, the Llama's library) over one store."""
    home = tmp_path / "home"
    a = services.Library(home=home, db_url=url, lm=tiny_gemma, embedder=HashEmbedder())
    b = services.Library(home=home, db_url=url, lm=tiny_llama, embedder=HashEmbedder())
    try:
        yield home, url, a, b
    finally:
        a.close()
        b.close()


def test_the_same_text_deposited_by_two_models_is_two_artifacts_each_bound_to_its_model(two):
    _, _, a, b = two
    da, db = a.deposit_text(LIGHTHOUSE), b.deposit_text(LIGHTHOUSE)
    assert da.id != db.id  # the key hashes the model's fingerprint
    assert a.store.catalog.get(da.id).model_fingerprint == a.lm.fingerprint
    assert b.store.catalog.get(db.id).model_fingerprint == b.lm.fingerprint
    assert a.lm.fingerprint != b.lm.fingerprint
    with pytest.raises(IncompatibleArtifact):  # one model's artifact grafted into the other: refused at the graft
        b.answer("Who built it?", AnswerOptions(artifact=da.id, max_new_tokens=2))


def test_retrieval_offers_a_model_only_its_own_artifacts(two):
    _, _, a, b = two
    mine_a = {a.deposit_text(LIGHTHOUSE).id}
    mine_b = {b.deposit_text(SALT).id}
    q = "Who built the lighthouse of Varnek Isle?"
    # the index holds both, and the Gemma's lighthouse is the nearest to the question for either model
    everything = a.store.index().search(a.embedder.embed(q), k=5, threshold=-1.0)
    assert {h.artifact_id for h in everything} == mine_a | mine_b and everything[0].artifact_id in mine_a
    assert {h.id for h in a.retrieve(q, k=5, threshold=-1.0)} == mine_a
    got_b = b.retrieve(q, k=5, threshold=-1.0)
    assert {h.id for h in got_b} == mine_b  # never the nearer artifact of the other model
    r = b.answer(q, AnswerOptions(k=5, threshold=-1.0, max_new_tokens=3, check=True))
    assert {h.id for h in r.retrieved} == mine_b and set(r.artifact_ids) <= mine_b
    assert r.model == b.lm.info.name and r.to_json()["model"] == b.lm.info.name
    assert services.AnswerResult.from_json(r.to_json()).model == b.lm.info.name
    assert f'<span class="kv-model">model {b.lm.info.name}</span>' in views.evidence_html(r)


def test_the_index_search_keeps_only_the_allowed_ids_and_fills_k_from_them(two):
    _, _, a, b = two
    ids_a = [a.deposit_text(f"{LIGHTHOUSE} Keeper number {i}.").id for i in range(3)]
    ids_b = [b.deposit_text(f"{SALT} Voyage number {i}.").id for i in range(2)]
    vec = np.asarray(a.embedder.embed(LIGHTHOUSE))
    idx = a.store.index()
    hits = idx.search(vec, k=2, threshold=-1.0, allowed=frozenset(ids_b))
    assert sorted(h.artifact_id for h in hits) == sorted(ids_b) and [h.rank for h in hits] == [1, 2]
    assert idx.search(vec, k=5, threshold=-1.0, allowed=frozenset()) == []
    assert a.store.model_ids(a.lm.fingerprint) == frozenset(ids_a)
    assert b.store.model_ids(b.lm.fingerprint) == frozenset(ids_b)


def test_a_store_of_one_model_searches_without_a_filter(tmp_path, url, tiny_gemma):
    lib = services.Library(home=tmp_path / "one", db_url=url, lm=tiny_gemma, embedder=HashEmbedder())
    try:
        lib.deposit_text(LIGHTHOUSE)
        assert lib.store.model_ids(tiny_gemma.fingerprint) is None
    finally:
        lib.close()


def test_list_filters_by_model_name_or_fingerprint_prefix(two, capsys):
    home, url, a, b = two
    da, db = a.deposit_text(LIGHTHOUSE).id, b.deposit_text(SALT).id
    assert [e.row.id for e in a.entries(model=a.lm.info.name)] == [da]
    assert [e.row.id for e in a.entries(model=b.lm.fingerprint[:12])] == [db]
    assert {e.row.id for e in a.entries()} == {da, db}
    with pytest.raises(InvalidInput) as e:
        a.entries(model="packaged:not-a-model")
    assert str(e.value).startswith("no model 'packaged:not-a-model' in this store; its models: ")
    assert a.lm.info.name in str(e.value) and b.lm.info.name in str(e.value)
    args = ["--home", str(home), *(["--db-url", url] if url else []), "list", "--model", b.lm.info.name, "--json"]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [x["id"] for x in out["artifacts"]] == [db] and out["count"] == 1


def test_the_dashboard_names_the_model_and_the_store_holds_both(two):
    _, _, a, b = two
    a.deposit_text(LIGHTHOUSE)
    b.deposit_text(SALT)
    b.deposit_text(f"{SALT} Again.")
    s = a.stats()
    assert s.model == a.lm.info.name and sorted(s.models) == sorted([a.lm.info.name, b.lm.info.name])
    html = views.stats_html(s)
    assert f"model <b>{a.lm.info.name}</b> · models in this store: {', '.join(s.models)}" in html


def test_a_replica_of_either_model_is_healthy_on_a_store_holding_both(two):
    """The replica health rule in a store of several models: a model that made some of the store's artifacts
    may serve it, even when all of the newest are another model's; one that made none is refused."""
    from serving import health

    home, _, a, b = two
    a.deposit_text(LIGHTHOUSE)
    for i in range(3):
        b.deposit_text(f"{SALT} Voyage {i}.")
    blobs = home / "blobs"
    assert health.check(a, blobs, "r1", a.lm.fingerprint).fingerprint_ok
    assert health.check(b, blobs, "r2", b.lm.fingerprint).fingerprint_ok
    stranger = health.check(a, blobs, "r3", "f" * 64)
    assert not stranger.fingerprint_ok and "made none of the store's artifacts" in stranger.problems[-1]


def test_the_exactness_report_draws_only_the_loaded_models_artifacts(two):
    """`verify --samples` on a store both models deposited into: each model's report samples its own artifacts
    (another's would be refused as incompatible), and a model with none in the store is told so."""
    _, _, a, b = two
    with pytest.raises(ArtifactNotFound, match="no artifact of this model"):
        b.exactness_report(samples=1, decode_steps=1)
    mine = a.deposit_text(LIGHTHOUSE).id
    rep = a.exactness_report(samples=3, decode_steps=1)
    assert rep.byte_equal == rep.samples == 3 and {r.artifact for r in rep.rows} == {mine}
    theirs = b.deposit_text(SALT).id
    rep = b.exactness_report(samples=3, decode_steps=1)
    assert rep.byte_equal == 3 and {r.artifact for r in rep.rows} == {theirs}
