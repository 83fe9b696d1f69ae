"""The built-in library as a recipe (services.seed): written deterministically from the gate's deposits,
brought in by recomputing every artifact and proving it against the gate's content hash, never stored
otherwise. Fast tier on the tiny model; the committed library.json against the real model in the
integration tier."""

from __future__ import annotations

import json

import pytest

import services
from errors import IntegrityError
from retrieval import HashEmbedder
from services import AnswerOptions, seed


def _library(home, lm):
    return services.Library(home=home, lm=lm, embedder=HashEmbedder())


@pytest.fixture(scope="module")
def written(tmp_path_factory, tiny_gemma):
    """One store seeded through the gate (its verdict the tiny tier's test double) and its library.json."""
    from tests.conftest import accepting_judge

    root = tmp_path_factory.mktemp("written")
    lib = _library(root / "a", tiny_gemma)
    with pytest.MonkeyPatch.context() as mp:
        accepting_judge(mp)
        report = seed.write_bundle(lib, root / "library.json")
    yield lib, root / "library.json", report
    lib.close()


def test_the_written_library_is_a_function_of_the_deposits(written, tmp_path, tiny_gemma):
    lib, out, report = written
    again = _library(tmp_path / "b", tiny_gemma)
    try:
        seed.write_bundle(again, tmp_path / "again.json")
    finally:
        again.close()
    assert (tmp_path / "again.json").read_bytes() == out.read_bytes()  # no timestamp, no embedding, no order
    doc = json.loads(out.read_bytes())
    assert report["artifacts"] == len(doc["manifest"]["artifacts"]) == lib.count() == 11
    assert seed.bundle_model(out) == tiny_gemma.info.fingerprint
    assert not doc["catalog"]["embeddings"] and "blobs/" not in json.dumps(doc["catalog"])


def test_written_from_a_store_that_holds_artifacts_is_refused(written, tiny_gemma):
    lib, out, _ = written
    with pytest.raises(Exception, match="written from an empty store"):
        seed.write_bundle(lib, out)


def test_bring_in_recomputes_each_artifact_and_imports_it(written, tmp_path, tiny_gemma, monkeypatch):
    lib, out, _ = written
    monkeypatch.setattr(seed, "seed_library", lambda *a, **k: pytest.fail("the gate ran"))
    fresh = _library(tmp_path / "c", tiny_gemma)
    try:
        assert seed.bring_in(fresh, bundle=out) == 11
        assert sorted(fresh.artifact_ids()) == sorted(lib.artifact_ids())
        for aid in fresh.artifact_ids():  # the same bytes the gate deposited
            assert fresh.store.catalog.get(aid).content_sha256 == lib.store.catalog.get(aid).content_sha256
        labels = {v.label for aid in fresh.artifact_ids() for v in fresh.show(aid).verifications}
        assert labels == {"imported, not re-verified", "attested"}
        assert seed.bring_in(fresh, bundle=out) == 0  # a repeat costs nothing
    finally:
        fresh.close()


def test_the_recipe_is_found_by_the_model_it_names_not_by_its_file_name(written, tmp_path, tiny_gemma, monkeypatch):
    """Several recipes in the seed folder (one per packaged model): bring_in with no bundle named takes the one whose
    manifest names this model, whatever the file is called; none for this model seeds through the gate."""
    import shutil

    _, out, _ = written
    folder = tmp_path / "seed-folder"
    shutil.copytree(seed.SEED_DIR, folder)
    (folder / "library.json").write_text(json.dumps({"format": seed.BUNDLE_FORMAT, "manifest": {}, "catalog": {}}))
    shutil.copy(out, folder / "library-some-other-name.json")
    assert seed.recipe_for(tiny_gemma.info.fingerprint, folder) == folder / "library-some-other-name.json"
    assert seed.recipe_path("packaged:qwen2.5-coder-1.5b-instruct", folder).name == "library-qwen2.5-coder-1.5b-instruct.json"
    assert seed.recipe_path("packaged:gemma-3-270m", folder).name == "library.json"
    monkeypatch.setattr(seed, "seed_library", lambda *a, **k: pytest.fail("the gate ran"))
    fresh = _library(tmp_path / "f", tiny_gemma)
    try:
        assert seed.bring_in(fresh, folder) == 11
    finally:
        fresh.close()
    (folder / "library-some-other-name.json").unlink()
    assert seed.recipe_for(tiny_gemma.info.fingerprint, folder) is None


def test_an_artifact_that_recomputes_to_other_bytes_is_refused_and_nothing_is_recorded(written, tmp_path, tiny_gemma):
    _, out, _ = written
    doc = json.loads(out.read_bytes())
    entry = doc["manifest"]["artifacts"][3]
    entry["content_sha256"] = "0" * 64  # what the gate deposited is not what these tokens give here
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    fresh = _library(tmp_path / "d", tiny_gemma)
    try:
        with pytest.raises(IntegrityError, match="is not the one the gate deposited"):
            seed.bring_in(fresh, bundle=bad)
        assert fresh.count() == 0
    finally:
        fresh.close()


def test_another_model_seeds_through_the_gate(written, tmp_path, tiny_llama, monkeypatch):
    _, out, _ = written
    seen = []
    monkeypatch.setattr(seed, "seed_library", lambda library, folder, on_progress: seen.append(library) or 7)
    other = _library(tmp_path / "e", tiny_llama)
    try:
        assert seed.bring_in(other, bundle=out) == 7 and seen == [other]
    finally:
        other.close()


@pytest.mark.integration
def test_the_committed_library_is_what_the_command_writes(real_lm, tmp_path):
    """`cli.py seed --write-bundle` on the real model (the gate's generations: a few minutes on two cores)."""
    lib = _library(tmp_path / "real", real_lm)
    try:
        seed.write_bundle(lib, tmp_path / "library.json")
    finally:
        lib.close()
    assert (tmp_path / "library.json").read_bytes() == seed.BUNDLE.read_bytes()


@pytest.mark.integration
def test_the_real_model_brings_in_the_committed_library(real_lm, tmp_path):
    assert seed.bundle_model() == real_lm.info.fingerprint
    lib = _library(tmp_path / "in", real_lm)
    try:
        assert seed.bring_in(lib) == 11
        r = lib.answer("Who founded the town of Velmora?", AnswerOptions(max_new_tokens=16))
        assert r.artifact_ids and r.tier == "exact", (r.tier, r.answer)
    finally:
        lib.close()
