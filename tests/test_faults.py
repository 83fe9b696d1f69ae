"""Faults lose nothing: a full disk and I/O errors at every write of every store operation, a real full
file system, a PostgreSQL server killed under load, SIGKILLs during deposits, imports and `fsck --repair`,
and fsck's verdict on a healthy store. The machinery is in scripts/sweeps.py (the write-point sweeps and
the full file system), scripts/pg_outage.py and scripts/crash_deposits.py; bench/faults.py runs all of it
in full and writes docs/bench/faults.json. Each test here asserts the exact one-line messages."""

from __future__ import annotations

import copy
import re

import pytest

import cli
import retrieval.embedder
from retrieval import HashEmbedder
from scripts import crash_deposits, pg_outage, sweeps
from tests.conftest import in_ci

MB = 1 << 20

# Every operation that writes to a store, under a full disk (the disk stays full until the operation
# ends) and under one I/O error; deposits at every write point, the rest at every k-th and the last.
SWEEPS = [
    ("deposit", "ENOSPC", 1),
    ("deposit", "EIO", 1),
    ("import", "ENOSPC", 5),
    ("import", "EIO", 5),
    ("export", "ENOSPC", 1),
    ("export", "EIO", 3),
    ("index", "ENOSPC", 1),
    ("index", "EIO", 1),
    ("ledger", "ENOSPC", 1),
    ("ledger", "EIO", 3),
]


@pytest.fixture(scope="module")
def swept(tiny_dirs, tmp_path_factory) -> dict[tuple[str, str], dict]:
    results = sweeps.sweep(SWEEPS, tiny_dirs["gemma3"], tmp_path_factory.mktemp("sweeps"))
    return {(r["op"], r["errno"]): r for r in results}


@pytest.mark.parametrize("op,err", [(op, err) for op, err, _ in SWEEPS], ids=[f"{op}-{err}" for op, err, _ in SWEEPS])
def test_a_write_failing_anywhere_in_an_operation_leaves_the_store_whole(swept, op, err):
    """At each write point: one StorageError line, nothing partial visible, every earlier artifact
    byte-identical, fsck consistent without repair (also from a fresh process), and the operation run
    again once the fault is gone gives what a fault-free run gives."""
    result = swept[(op, err)]
    assert sweeps.judge(result) == []
    assert sweeps.lost_acknowledged(result) == 0
    failed = [r for r in result["records"] if r["error"] is not None]
    assert failed and all(r["faults"] for r in failed), "the sweep must hit write points, and fail only where it injected"
    assert result["records"][-1]["faults"] == 0 and result["records"][-1]["error"] is None  # past the last write point


def test_the_deposit_sweep_reaches_the_blob_write_its_folder_and_sqlite(swept):
    """The sweep is only as good as the write points it reaches: the blob's temporary file, the blob folder's
    fsync after the rename, and SQLite's WAL must all be among them."""
    result = swept[("deposit", "EIO")]
    assert result["write_points"] >= 20, result["write_points"]
    hit = {(r["call"], r["path"].rsplit("/", 1)[-1]) for r in result["records"] if r["faults"]}
    assert any(call == "write" and name.startswith(".tmp-") for call, name in hit), hit
    assert any(call == "fsync" and len(name) == 2 for call, name in hit), hit  # blobs/aa/bb
    assert any(name == "catalog.sqlite3-wal" for _, name in hit), hit


def test_a_full_disk_and_an_io_error_during_a_deposit_say_where_and_what_to_do(swept):
    full, eio = swept[("deposit", "ENOSPC")], swept[("deposit", "EIO")]
    assert full["clean"]["bytes"] < MB  # so the deposit needs its blob plus a MB for the catalog: 2 MB
    first = full["records"][0]
    assert first["error"]["type"] == "StoreFull"
    assert first["error"]["message"] == (
        f"no space left on device in {first['store']}: free at least 2 MB there (or move KVGRAFT_HOME to a larger disk), "
        "then deposit again; nothing was stored"
    )
    first = eio["records"][0]
    assert first["error"]["type"] == "StorageError"
    assert first["error"]["message"] == (
        f"input/output error writing to {first['store']}: its disk or file system is failing; check the device "
        "(dmesg, smartctl), then deposit again; nothing was stored"
    )


def test_the_judge_finds_each_broken_promise(swept):
    """judge() is what the sweeps' verdict rests on: each promise broken in a copy of a good record is found."""
    good = swept[("deposit", "ENOSPC")]
    rec_at = 3

    def broken(change) -> list[str]:
        bad = copy.deepcopy(good)
        change(bad["records"][rec_at])
        return sweeps.judge(bad)

    at = f"deposit ENOSPC write point {good['records'][rec_at]['n']}"

    def stray_blob(r):
        r["after_fault"]["blobs"] = [*r["after_fault"]["blobs"], "f" * 64 + ".safetensors"]

    def message(r):
        r["error"]["message"] = "[Errno 28] No space left on device"

    def inexact(r):
        r["reopened"]["exact"] = dict.fromkeys(r["reopened"]["exact"], False)

    def absorbed(r):
        r["error"], r["result"], r["path"] = None, good["clean"], r["store"] + "/blobs"

    def no_retry(r):
        r["retry"] = {"error": "StorageError: ..."}

    def untidy(r):
        r["after_fault"]["fsck_consistent"] = False

    for change, says in (
        (stray_blob, "blobs changed by a failed operation"),
        (message, "is not 'no space left on device in"),
        (inexact, "reopened: earlier artifacts lost or changed"),
        (absorbed, "the fault was absorbed and the operation reported success"),
        (no_retry, "run again without the fault gave"),
        (untidy, "after_fault: fsck False"),
    ):
        problems = broken(change)
        assert problems and all(p.startswith(at) for p in problems) and says in " ".join(problems), (says, problems)
    assert sweeps.lost_acknowledged(_with(good, rec_at, inexact)) == len(good["pristine"]["artifacts"])


def test_each_disk_refusal_has_its_line_and_other_errors_pass_unchanged(tmp_path):
    """The words for the errno values no sweep injects (a quota, a read-only file system), and write_faults
    leaving alone an OSError that says nothing about the disk."""
    from errors import StorageError, StoreFull
    from files import write_faults

    def refused(code: int) -> StorageError:
        with pytest.raises(StorageError) as e, write_faults(tmp_path, "deposit again", needed_bytes=3 * MB + 1):
            raise OSError(code, "refused")
        return e.value

    quota, readonly = refused(122), refused(30)
    assert isinstance(quota, StoreFull) and str(quota) == (
        f"disk quota exceeded in {tmp_path}: free at least 4 MB there (or move KVGRAFT_HOME to a larger disk), "
        "then deposit again; nothing was stored"
    )
    assert not isinstance(readonly, StoreFull) and str(readonly) == (
        f"{tmp_path} is on a read-only file system: remount it read-write (or move KVGRAFT_HOME to a writable disk), "
        "then deposit again; nothing was stored"
    )
    assert (quota.code, quota.folder) == (122, str(tmp_path))
    with pytest.raises(FileNotFoundError), write_faults(tmp_path, "deposit again"):
        (tmp_path / "absent").read_bytes()


def _with(result: dict, i: int, change) -> dict:
    out = copy.deepcopy(result)
    change(out["records"][i])
    return out


def test_a_real_full_filesystem_refuses_each_write_in_one_line_and_recovers_without_repair(tiny_dirs, tiny_gemma, monkeypatch):
    """A 24 MB tmpfs filled to the last page: the CLI's deposit, a deposit, an import, an export, an index
    rebuild and a ledger write each refused with their line; nothing changed; the filler removed, each works."""
    try:
        mounted = sweeps.small_filesystem(24)
        mount = mounted.__enter__()
    except sweeps.FilesystemUnavailable as e:
        if in_ci():
            pytest.fail(f"CI is set but no small file system can be mounted: {e}")
        pytest.skip(f"no small file system here: {e}")
    try:
        r = sweeps.full_disk_run(mount, tiny_dirs["gemma3"], tiny_gemma, HashEmbedder())
    finally:
        mounted.__exit__(None, None, None)
    store, exports = r["store"], r["exports"]
    assert r["free_when_full"] == 0
    deposit_line = (
        f"no space left on device in {store}: free at least 2 MB there (or move KVGRAFT_HOME to a larger disk), "
        "then deposit again; nothing was stored"
    )
    assert r["cli_full"] == {"code": 2, "stdout": "", "stderr": f"error: {deposit_line}\n"}
    said = {a["op"]: a for a in r["full"]}
    assert said["deposit"]["message"] == deposit_line and said["deposit"]["type"] == "StoreFull"
    import_mb = -(-(2 * r["bundle_bytes"] + MB) // MB)
    # the staging folder cannot even be made on a disk full to the last page (the check of the bundle against
    # the free space, which comes next, has its own line: tests/test_security_bundles.py)
    assert said["import"]["type"] == "StoreFull" and said["import"]["message"] == (
        f"no space left on device in {store}: free at least {import_mb} MB there (or move KVGRAFT_HOME to a larger disk), "
        "then import again; nothing was stored"
    )
    assert said["export"]["type"] == "StoreFull" and said["export"]["message"] == (
        f"no space left on device in {exports}: free at least 2 MB there (or export to a folder on another disk), "
        "then export again; nothing was written"
    )
    assert said["index"]["type"] == "StoreFull" and said["index"]["message"] == (
        f"no space left on device in {store}: free at least 2 MB there (or move KVGRAFT_HOME to a larger disk), "
        "then rebuild it again (`cli.py fsck --repair`); answers rebuild it in memory meanwhile"
    )
    ledger_line = (
        f"no space left on device in {store}: free at least 1 MB there (or move KVGRAFT_HOME to a larger disk), "
        "then ask again; the answer was not recorded"
    )
    # SQLite may still have room in its WAL for one ledger row; if it had none the answer is refused in one line
    assert said["ledger"]["ok"] or said["ledger"]["message"] == ledger_line, said["ledger"]
    before, full = r["before"], r["at_full"]
    assert full["artifacts"] == before["artifacts"] and full["blobs"] == before["blobs"]
    assert full["ledger_rows"] == before["ledger_rows"] + int(said["ledger"]["ok"])
    assert full["strays"] == [] and full["exports"] == [] and full["fsck_consistent"]
    assert set(full["exact"].values()) == {True}
    freed = {a["op"]: a for a in r["freed"]}
    assert all(a["ok"] for a in r["freed"]), r["freed"]
    assert freed["deposit"]["result"]["created"] and len(freed["import"]["result"]) == 2
    assert freed["index"]["result"] == len(before["artifacts"]) + 3
    after = r["after"]
    assert after["fsck_consistent"] and set(after["exact"].values()) == {True}
    assert len(after["artifacts"]) == len(before["artifacts"]) + 3
    assert r["cli_again"]["code"] == 0 and r["cli_again"]["stdout"].startswith("deposited ") and r["cli_again"]["stderr"] == ""


def test_fsck_after_one_cli_deposit_on_a_fresh_store_is_consistent(tiny_dirs, kvgraft_home, tmp_path, capsys, monkeypatch):
    """A deposit writes no index; the first answer builds it. fsck must call that healthy, not damage."""
    monkeypatch.setattr(retrieval.embedder, "SentenceEmbedder", HashEmbedder)
    text = tmp_path / "fact.txt"
    text.write_text("Fact sheet: the Brannock Spire is 212 metres tall.", encoding="utf-8")
    base = ["--home", str(kvgraft_home), "--model", str(tiny_dirs["gemma3"])]
    assert cli.main([*base, "deposit", "--text-file", str(text)]) == 0
    capsys.readouterr()
    assert cli.main([*base, "fsck"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "consistent: 1 artifact(s), 1 blob(s); missing 0, corrupt 0, orphans 0, partials 0, index missing",
        "the index is missing: it is a cache of the catalog, rebuilt on first use (`cli.py fsck --repair` rebuilds it now)",
    ]


def test_an_index_save_cut_between_its_two_files_is_a_cache_state_not_damage(kvgraft_home, tiny_gemma):
    """A process killed inside VectorIndex.save leaves the new index.faiss beside the old index.json (seen once
    in the 100 kills): fsck calls that the cache's state, and the next answer rebuilds the index."""
    import services

    lib = services.Library(home=kvgraft_home, lm=tiny_gemma, embedder=HashEmbedder())
    lib.deposit_text("The Orlen Gate faces the sea.")
    lib.index()
    old_meta = (kvgraft_home / "index" / "index.json").read_bytes()
    lib.deposit_text("The Orlen Gate was painted green.")
    lib.store.rebuild_index()
    (kvgraft_home / "index" / "index.json").write_bytes(old_meta)  # the second save killed before its JSON
    r = services.fsck(lib)
    assert r.index.status == "half-saved" and r.consistent, r.to_json()
    assert r.advice == (
        "the index is half-saved: it is a cache of the catalog, rebuilt on first use (`cli.py fsck --repair` rebuilds it now)",
    )
    fresh = services.Library(home=kvgraft_home, lm=tiny_gemma, embedder=HashEmbedder())
    assert len(fresh.index()) == 2  # rebuilt from the catalog on first use
    assert services.fsck(fresh).index.status == "ok"


@pytest.mark.postgres
def test_postgres_killed_under_load_loses_no_acknowledged_deposit(tiny_gemma, tmp_path):
    """4 depositors and 16 askers on one Library; the server SIGKILLed (postmaster and backends) and restarted
    on the same port: every acknowledged deposit there exactly once, each error during the outage one
    kvgraft line, and the same process deposits and answers again without a restart."""
    from tests import pgserver

    try:
        server = pgserver.start(crash_safe=True)
    except pgserver.PgUnavailable as e:
        if in_ci():
            pytest.fail(f"CI is set but PostgreSQL cannot run: {e}")
        pytest.skip(f"PostgreSQL is missing: {e}")
    try:
        result = pg_outage.run(server, tiny_gemma, tmp_path / "home", depositors=4, askers=16, before=6, after=1, down_s=1.5)
    finally:
        server.stop()
    s = pg_outage.summary(result)
    assert s["lost"] == 0 and s["duplicated"] == 0 and s["unreadable"] == 0, s
    assert s["errors_not_kvgraft"] == 0 and s["errors_multiline"] == 0, s
    assert s["errors_by_phase"]["before"] == 0 and s["errors_by_phase"]["down"] > 0, s
    assert min(result["after_acks"]) >= 1 and s["answers"]["after"] > 0, s  # service back in the same process
    assert s["fsck_after_repair_consistent"], result["fsck_after_repair"]
    where = re.escape(f"127.0.0.1:{server.port}/")
    line = re.compile(
        rf"the catalog database at {where}t_[0-9a-f]{{12}} cannot be reached \([^\n]+\); try again when it is back "
        r"\(a deposit that did reach it is found again by its key, never stored twice\)"
    )
    odd = [e["message"] for e in result["errors"] if not line.fullmatch(e["message"])]
    assert odd == [], odd[:3]


def test_sigkill_during_deposit_import_and_repair_loses_nothing_acknowledged(tmp_path):
    """Six forked children killed at random points, two each running deposits, imports and fsck --repair:
    every artifact any of them acknowledged is in the catalog after every kill, and the store is consistent."""
    totals = crash_deposits.run(
        kills=6, seed=5, work=tmp_path, max_delay_s=1.0, fork=True, ops=("deposit", "import", "repair"), log=lambda s: None
    )
    assert totals["lost"] == 0, totals
    assert {op: t["kills"] for op, t in totals["by_op"].items()} == {"deposit": 2, "import": 2, "repair": 2}
    assert all(t["committed"] > 0 for t in totals["by_op"].values()), totals
    assert totals["artifacts"] >= totals["acknowledged"] > 0, totals
