"""Upkeep on tiny models: bundles (round trip, determinism, every refusal of a malicious tar),
rebuild-and-compare, fsck and its repair, ledger replay, delete, and two processes sharing one
PostgreSQL catalog and one blob folder."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

import services
from db import bundles
from db.schema import ledger
from errors import ArtifactNotFound, IncompatibleArtifact, IntegrityError, InvalidInput, KvgraftError
from retrieval import HashEmbedder
from services import AnswerOptions

ROOT_TEXT = "Zorblat is the capital of Quendia. It has nine bridges."
CHILD_TEXT = "The tallest bridge of Zorblat is the Ivory Span."
REPO = Path(__file__).resolve().parents[1]


def make_lib(home: Path, lm, db_url: str | None = None) -> services.Library:
    return services.Library(home=home, db_url=db_url, embedder=HashEmbedder(), lm=lm)


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return make_lib(kvgraft_home, tiny_gemma)


@pytest.fixture
def chain(lib):
    root = lib.deposit_text(ROOT_TEXT, title="root")
    child = lib.deposit_text(CHILD_TEXT, parent=root.id, title="child")
    return root, child


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def add_member(tar: tarfile.TarFile, name: str, data: bytes = b"", **kw) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if kw.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def read_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def rewrite(path: Path, out: Path, members: dict[str, bytes]) -> Path:
    """A bundle with the same member order as `path` but some contents replaced (a tamperer's tar)."""
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            add_member(tar, name, data)
    return out


# ---- bundles --------------------------------------------------------------------------------------


def test_export_import_round_trip_is_byte_identical_and_deterministic(lib, chain, tmp_path, tiny_gemma):
    root, child = chain
    out = tmp_path / "b.tar"
    rep = services.export_bundle(lib, [child.id[:12]], out)
    assert rep.artifacts == (root.id, child.id)  # ancestors come along, parents first
    again = services.export_bundle(lib, [child.id], tmp_path / "again.tar")
    assert out.read_bytes() == (tmp_path / "again.tar").read_bytes() and rep.bundle_sha256 == again.bundle_sha256
    with tarfile.open(out) as tar:
        infos = tar.getmembers()
    assert [m.name for m in infos] == sorted(m.name for m in infos)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "" and m.isreg() for m in infos)
    manifest = json.loads(read_members(out)["manifest.json"])
    assert manifest["format"] == services.BUNDLE_FORMAT and manifest["artifact_format"] == "kvgraft/1"
    assert {a["id"]: a["content_sha256"] for a in manifest["artifacts"]} == {
        root.id: root.content_sha256,
        child.id: child.content_sha256,
    }
    assert manifest["model_fingerprints"] == [tiny_gemma.fingerprint]

    other = make_lib(tmp_path / "other-home", tiny_gemma)
    imp = services.import_bundle(other, out)
    assert imp.new == (root.id, child.id) and imp.blobs_written == 2 and imp.model_checked
    for d in (root, child):
        assert other.store.blobs.get(d.content_sha256) == lib.store.blobs.get(d.content_sha256)
        assert other.store.catalog.get(d.id).content_sha256 == d.content_sha256
    assert other.store.catalog.source(child.id).text == lib.store.catalog.source(child.id).text
    assert [r.id for r in other.store.catalog.chain(child.id)] == [root.id, child.id]
    assert not [p for p in other.home.iterdir() if p.name.startswith(".import-")], "staging must be removed"
    assert services.import_bundle(other, out).new == ()  # idempotent
    assert services.fsck(other, repair=True).consistent


def test_import_restores_missing_and_corrupt_blobs(lib, chain, tmp_path):
    root, child = chain
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [child.id], out)
    lib.store.blobs.delete(root.content_sha256)
    path = lib.store.blobs.path(child.content_sha256)
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    (lib.home / ".import-leftover").mkdir()
    os.utime(lib.home / ".import-leftover", (0, 0))
    r = services.fsck(lib, repair=True)
    assert len(r.missing) == 1 and len(r.corrupt) == 1 and r.repaired.partials_removed == (".import-leftover",)
    imp = services.import_bundle(lib, out)
    assert imp.new == () and imp.blobs_written == 2
    assert path.read_bytes() == good and services.fsck(lib).consistent


def test_import_without_model_check_and_wrong_model(lib, chain, tmp_path, tiny_llama):
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [chain[1].id], out)
    llama_lib = make_lib(tmp_path / "llama-home", tiny_llama)
    before = files_under(tmp_path)
    with pytest.raises(IncompatibleArtifact, match="this store's model is"):
        services.import_bundle(llama_lib, out)
    assert files_under(tmp_path) == before
    assert llama_lib.count() == 0
    # without loading the model the bundle is still checked against itself
    unloaded = services.Library(home=tmp_path / "unloaded", embedder=HashEmbedder(), model_name="/nonexistent")
    assert services.import_bundle(unloaded, out, check_model=False).model_checked is False
    assert unloaded._lm is None, "check_model=False must not load the model"


def _tampered(src: Path, dst: Path, edit) -> Path:
    members = read_members(src)
    edit(members)
    return rewrite(src, dst, members)


def _assert_refused(lib, bundle: Path, tmp_path: Path, exc, match: str, limits: bundles.Limits = bundles.Limits()):
    before = files_under(tmp_path)
    n = lib.count()
    with pytest.raises(exc, match=match):
        services.import_bundle(lib, bundle, limits=limits)
    assert files_under(tmp_path) == before, "a refused import must leave no file behind"
    assert lib.count() == n


def test_import_refuses_tampered_blob_catalog_and_fingerprint(lib, chain, tmp_path, tiny_gemma):
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [chain[1].id], out)
    target = make_lib(tmp_path / "target", tiny_gemma)
    blob = f"blobs/{chain[0].content_sha256}.safetensors"

    def flip(m):
        data = bytearray(m[blob])
        data[-1] ^= 1
        m[blob] = bytes(data)

    _assert_refused(target, _tampered(out, tmp_path / "t1.tar", flip), tmp_path, IntegrityError, "blob integrity check failed")

    def catalog(m):
        m["catalog.json"] = m["catalog.json"].replace(b'"title": "root"', b'"title": "evil"')

    _assert_refused(target, _tampered(out, tmp_path / "t2.tar", catalog), tmp_path, IntegrityError, "catalog.json hashes to")

    def fingerprint(m):
        man = json.loads(m["manifest.json"])
        man["artifacts"][0]["model_fingerprint"] = "0" * 64
        m["manifest.json"] = json.dumps(man).encode()

    _assert_refused(
        target, _tampered(out, tmp_path / "t3.tar", fingerprint), tmp_path, IncompatibleArtifact, "manifest says 0000"
    )

    def extra(m):
        m["notes.txt"] = b"hello"

    _assert_refused(target, _tampered(out, tmp_path / "t4.tar", extra), tmp_path, InvalidInput, "'notes.txt' is not listed")

    def no_manifest(m):
        del m["manifest.json"]

    _assert_refused(target, _tampered(out, tmp_path / "t5.tar", no_manifest), tmp_path, InvalidInput, "no manifest.json")
    _assert_refused(target, out, tmp_path, InvalidInput, "the limit is 100", bundles.Limits(max_member_bytes=100))


@pytest.mark.parametrize(
    ("name", "kw", "match"),
    [
        ("../evil.txt", {}, "escapes the bundle"),
        ("blobs/../../evil.txt", {}, "escapes the bundle"),
        ("/tmp/evil-kvgraft.txt", {}, "absolute path"),
        ("link", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, "symbolic link"),
        ("hard", {"type": tarfile.LNKTYPE, "linkname": "manifest.json"}, "hard link"),
        ("dev", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, "a device"),
        ("fifo", {"type": tarfile.FIFOTYPE}, "a fifo"),
        ("manifest.json", {}, "appears twice"),
    ],
)
def test_import_refuses_unsafe_members(lib, tmp_path, name, kw, match):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w", format=tarfile.GNU_FORMAT) as tar:
        add_member(tar, "manifest.json", b"{}")
        add_member(tar, name, b"owned", **kw)
    _assert_refused(lib, bad, tmp_path, InvalidInput, match)
    assert not (tmp_path.parent / "evil.txt").exists() and not Path("/tmp/evil-kvgraft.txt").exists()


def test_import_refuses_too_many_or_too_large(lib, tmp_path):
    bad = tmp_path / "many.tar"
    with tarfile.open(bad, "w") as tar:
        for i in range(5):
            add_member(tar, f"f{i}", b"x" * 10)
    _assert_refused(lib, bad, tmp_path, InvalidInput, "more than 3 members", bundles.Limits(max_members=3))
    _assert_refused(lib, bad, tmp_path, InvalidInput, "more than 25 bytes", bundles.Limits(max_total_bytes=25))
    _assert_refused(lib, bad, tmp_path, InvalidInput, "'f0' is 10 bytes; the limit is 9", bundles.Limits(max_member_bytes=9))
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x1f\x8b not a tar at all" * 40)
    _assert_refused(lib, junk, tmp_path, InvalidInput, "not an uncompressed tar bundle|damaged tar")


# ---- rebuild, fsck, replay, delete ----------------------------------------------------------------


def test_rebuild_verify_reproduces_bytes_and_detects_a_changed_blob(lib, chain):
    root, child = chain
    r = services.rebuild_compare(lib, child.id)
    assert r.equal and r.rebuilt_sha256 == r.stored_sha256 == r.blob_sha256 == child.content_sha256, r
    path = lib.store.blobs.path(child.content_sha256)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    r = services.rebuild_compare(lib, child.id)
    assert not r.equal and r.rebuilt_sha256 == child.content_sha256 and r.blob_sha256 != child.content_sha256


def test_fsck_reports_and_repairs_without_touching_referenced_blobs(lib, chain):
    root, child = chain
    lib.index()
    clean = services.fsck(lib)
    assert clean.consistent and clean.index.status == "ok" and clean.artifacts == 2, clean
    orphan = lib.store.blobs.put(b"nobody refers to me")
    partial = lib.store.blobs.path(orphan).parent / ".tmp-abc.part"
    partial.write_bytes(b"half")
    corrupt_path = lib.store.blobs.path(child.content_sha256)
    good = corrupt_path.read_bytes()
    corrupt_path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    missing_path = lib.store.blobs.path(root.content_sha256)
    missing_bytes = missing_path.read_bytes()
    missing_path.unlink()
    (lib.home / "index" / "index.json").unlink()

    r = services.fsck(lib)
    d = r.to_json()
    assert not r.consistent
    assert d["counts"] == {"missing": 1, "orphans": 1, "corrupt": 1, "partials": 1, "quarantined": 0}
    assert r.missing[0].id == root.id and r.corrupt[0].id == child.id and r.orphans == (orphan,)
    assert r.index.status == "missing"
    young = services.fsck(lib, repair=True)  # default grace: too young, maybe a deposit in flight
    assert young.repaired == services.Repaired((), (), index_rebuilt=True)
    assert lib.store.blobs.exists(orphan) and partial.exists() and services.fsck(lib).index.status == "ok"

    r = services.fsck(lib, repair=True, grace_s=0)
    assert r.repaired == services.Repaired((orphan,), (".tmp-abc.part",), index_rebuilt=False)
    assert r.to_json()["repaired"] == {"orphans_removed": [orphan], "partials_removed": [".tmp-abc.part"], "index_rebuilt": False}
    assert not r.consistent and corrupt_path.exists(), "a referenced blob is never deleted, even a corrupt one"
    assert any("rebuild --compare" in a for a in r.advice)
    assert not lib.store.blobs.exists(orphan) and not partial.exists()

    missing_path.write_bytes(missing_bytes)
    corrupt_path.write_bytes(good)
    assert services.fsck(lib).consistent


def test_index_staleness_is_seen_by_fsck_as_information(lib, chain):
    lib.index()
    lib.deposit_text("Another fact about nothing in particular.")
    stale = services.fsck(lib)
    assert stale.index.status == "stale" and stale.consistent
    assert stale.advice == (
        "the index is stale: it is a cache of the catalog, rebuilt on first use (`cli.py fsck --repair` rebuilds it now)",
    )
    assert services.fsck(lib, repair=True).consistent
    assert services.fsck(lib).index.status == "ok"


def test_a_fresh_store_after_one_deposit_is_healthy(lib):
    """A deposit writes no index (the first answer builds it): fsck must not call that damage."""
    lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    r = services.fsck(lib)
    assert r.index.status == "missing" and r.consistent and r.artifacts == 1, r.to_json()


def test_a_corrupt_index_file_is_not_consistent_until_repaired(lib, chain):
    lib.index()
    (lib.home / "index" / "index.json").write_text("{not json")
    r = services.fsck(lib)
    assert r.index.status == "corrupt" and not r.consistent
    assert services.fsck(lib, repair=True).consistent and services.fsck(lib).index.status == "ok"


def test_replay_confirms_every_tier_and_flags_a_changed_record(lib, chain):
    root, child = chain
    lib.answer("Which bridge is the tallest?", AnswerOptions(artifact=child.id, max_new_tokens=6))
    lib.answer("Which bridge is the tallest?", AnswerOptions(graft=False, max_new_tokens=5))
    lib.answer("Zorblat capital Quendia bridges", AnswerOptions(relocated=True, threshold=0.0, max_new_tokens=4))
    rep = services.replay_ledger(lib)
    assert [e.tier for e in rep.entries] == ["exact", "none", "relocated"]
    assert rep.ok and rep.matched == 3, rep
    assert rep.entries[0].artifact_ids == (root.id, child.id)
    assert services.replay_ledger(lib, last=1).replayed == 1
    with lib.store.catalog._engine.begin() as conn:
        conn.execute(sa.update(ledger).where(ledger.c.id == rep.entries[1].ledger_id).values(logits_sha256="0" * 64))
    rep = services.replay_ledger(lib)
    assert not rep.ok and rep.mismatched == 1 and rep.entries[1].output_equal and not rep.entries[1].logits_equal


def test_replay_of_an_empty_ledger_says_what_to_do(lib):
    with pytest.raises(ArtifactNotFound, match="ledger is empty"):
        services.replay_ledger(lib)


def test_show_list_delete(lib, chain):
    root, child = chain
    s = lib.show(child.id)
    assert s.chain == (root.id, child.id) and s.children == () and s.blob_present
    assert s.source.text.startswith(CHILD_TEXT) and s.to_json()["source"]["text"] == s.source.text
    assert [e.row.id for e in lib.entries()] == [child.id, root.id]
    with pytest.raises(KvgraftError, match="continue its chain"):
        lib.delete(root.id)
    d = lib.delete(child.id)
    assert d.blob_removed and not lib.store.blobs.exists(child.content_sha256)
    with pytest.raises(ArtifactNotFound):
        lib.store.catalog.get(child.id)
    assert services.fsck(lib, repair=True).consistent


# ---- two processes, one PostgreSQL catalog, one blob folder ---------------------------------------

_WORKER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import services
    from retrieval import HashEmbedder
    lib = services.Library(embedder=HashEmbedder())
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "deposit":
            out = {"id": lib.deposit_text(cmd["text"]).id}
        elif cmd["op"] == "answer":
            r = lib.answer(cmd["q"], services.AnswerOptions(max_new_tokens=3, threshold=0.2))
            out = {"tier": r.tier, "ids": list(r.artifact_ids), "version": lib.store.catalog.version()}
        else:
            break
        print(json.dumps(out), flush=True)
    """
)


@pytest.mark.postgres
def test_two_processes_share_one_postgres_catalog_and_blob_folder(pg_server, tiny_dirs, tmp_path):
    url = pg_server.create_database()
    env = os.environ | {
        "KVGRAFT_DB_URL": url,
        "KVGRAFT_HOME": str(tmp_path / "shared-home"),
        "KVGRAFT_MODEL": str(tiny_dirs["gemma3"]),
        "OMP_NUM_THREADS": "1",
    }
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)

    def start():
        return subprocess.Popen(
            [sys.executable, str(script), str(REPO)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def ask(proc, **cmd):
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"worker exited with {proc.poll()}"
        return json.loads(line)

    a, b = start(), start()
    try:
        first = ask(b, op="answer", q="Zorblat capital Quendia")
        assert first["tier"] == "none" and first["ids"] == []  # B's index is built, at the empty catalog's version
        dep = ask(a, op="deposit", text=ROOT_TEXT)
        second = ask(b, op="answer", q="Zorblat capital Quendia")
        assert second["version"] > first["version"]
        assert second["tier"] == "exact" and second["ids"] == [dep["id"]], second
    finally:
        for p in (a, b):
            p.stdin.close()
            p.wait(timeout=60)
