"""The upkeep commands through `cli.main([...])`: --json fields, exit codes, and one-line errors
without a traceback. The store is built in-process on the tiny Gemma; the CLI loads the same model
folder (same fingerprint) and a HashEmbedder stands in for the sentence embedder."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import sqlalchemy as sa

import cli
import retrieval.embedder
import services
from db.schema import ledger
from retrieval import HashEmbedder
from services import AnswerOptions


@pytest.fixture(autouse=True)
def fake_embedder(monkeypatch):
    monkeypatch.setattr(retrieval.embedder, "SentenceEmbedder", HashEmbedder)  # what Library.embedder makes


@pytest.fixture(autouse=True)
def quiet_progress_bars():
    """What HF_HUB_DISABLE_PROGRESS_BARS (set by cli/upkeep.py) does in a fresh CLI process; here
    transformers was imported before the CLI, so switch its bars off directly."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    yield
    if was:
        logging.enable_progress_bar()


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return services.Library(home=kvgraft_home, embedder=HashEmbedder(), lm=tiny_gemma)


@pytest.fixture
def chain(lib):
    root = lib.deposit_text("Zorblat is the capital of Quendia.", title="root")
    child = lib.deposit_text("Its tallest bridge is the Ivory Span.", parent=root.id, title="child")
    return root, child


@pytest.fixture
def run(tiny_dirs, kvgraft_home, capsys):
    """cli.main with the tiny model; returns (exit code, parsed JSON or stdout text, stderr)."""

    def call(*argv: str, home=None, as_json: bool = True):
        args = ["--home", str(home or kvgraft_home), "--model", str(tiny_dirs["gemma3"]), *argv]
        code = cli.main([*args, "--json"] if as_json else args)
        out, err = capsys.readouterr()
        return code, (json.loads(out) if as_json and out.strip() else out), err

    return call


def assert_one_line_error(err: str, text: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert text in err, err


def test_list_and_show(run, chain):
    root, child = chain
    code, out, err = run("list")
    assert code == 0 and out["count"] == 2 and [r["id"] for r in out["artifacts"]] == [child.id, root.id]
    assert {"id", "content_sha256", "tokens", "start", "kind", "title", "parent_id", "end_pos"} <= set(out["artifacts"][0])
    code, out, _ = run("show", child.id[:10])
    assert code == 0 and out["chain"] == [root.id, child.id] and out["children"] == [] and out["blob_present"]
    assert out["source"]["text"].startswith("Its tallest bridge") and out["artifact"]["parent_id"] == root.id
    code, text, _ = run("list", "--kind", "text", as_json=False)
    assert code == 0 and child.id in text and "child" in text


def test_export_import_round_trip(run, chain, tmp_path):
    root, child = chain
    bundle = tmp_path / "b.tar"
    code, out, _ = run("export", child.id, "--out", str(bundle))
    assert code == 0 and out["artifacts"] == [root.id, child.id] and out["bytes"] == bundle.stat().st_size
    assert len(out["bundle_sha256"]) == 64
    other = tmp_path / "other"
    code, out, _ = run("import", str(bundle), home=other)
    assert code == 0 and out["new"] == [root.id, child.id] and out["blobs_written"] == 2 and out["model_checked"]
    code, out, _ = run("import", str(bundle), "--no-model-check", home=other)
    assert code == 0 and out["new"] == [] and out["model_checked"] is False


def test_import_of_a_malicious_tar_is_one_line_error(run, tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    code, out, err = run("import", str(bad))
    assert code == 2 and out == ""
    assert_one_line_error(err, "escapes the bundle")
    assert not (tmp_path / "escape.txt").exists()


def test_rebuild_compare_exit_codes(run, lib, chain):
    root, child = chain
    code, out, _ = run("rebuild", "--compare", child.id)
    assert code == 0 and out["equal"] and out["rebuilt_sha256"] == out["stored_sha256"] == child.content_sha256
    code, again, err = run("rebuild", "--verify", child.id)  # the flag's former name still works and names the new one
    assert code == 0 and again == out | {"prefill_s": again["prefill_s"]} and "`rebuild --compare ID`" in err
    path = lib.store.blobs.path(child.content_sha256)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    code, out, _ = run("rebuild", "--compare", child.id)
    assert code == 1 and not out["equal"] and out["blob_sha256"] != out["stored_sha256"]


def test_fsck_exit_codes_and_repair(run, lib, chain):
    lib.index()
    code, out, _ = run("fsck")
    assert code == 0 and out["consistent"]
    assert out["counts"] == {"missing": 0, "orphans": 0, "corrupt": 0, "partials": 0, "quarantined": 0}
    assert out["index"]["status"] == "ok" and out["artifacts"] == 2 and out["blobs"] == 2
    orphan = lib.store.blobs.put(b"stray bytes")
    os.utime(lib.store.blobs.path(orphan), (0, 0))  # old enough not to be a deposit in flight
    code, out, _ = run("fsck")  # a leftover of an interrupted write: space to free, not damage
    assert code == 0 and out["consistent"] and out["orphans"] == [orphan]
    assert out["advice"] == [
        "1 orphan blob(s) and 0 partial file(s) are leftovers of interrupted writes: nothing acknowledged refers "
        "to them; `cli.py fsck --repair` removes them to free their space"
    ]
    bad = lib.store.blobs.path(chain[0].content_sha256)
    good = bad.read_bytes()
    bad.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # damage: a stored artifact's bytes changed
    code, out, _ = run("fsck")
    assert code == 1 and not out["consistent"] and out["counts"]["corrupt"] == 1
    bad.write_bytes(good)
    code, out, _ = run("fsck", "--repair")
    assert code == 0 and out["repaired"]["orphans_removed"] == [orphan] and out["consistent"]
    code, text, _ = run("fsck", as_json=False)
    assert code == 0 and text.startswith("consistent")


def test_replay_exit_codes(run, lib, chain):
    lib.answer("Which bridge?", AnswerOptions(artifact=chain[1].id, max_new_tokens=4))
    code, out, _ = run("replay", "--last", "5")
    assert code == 0 and out["ok"] and out["replayed"] == 1 and out["entries"][0]["output_equal"]
    with lib.store.catalog._engine.begin() as conn:
        conn.execute(sa.update(ledger).values(output_sha256="0" * 64))
    code, out, _ = run("replay")
    assert code == 1 and out["mismatched"] == 1 and not out["entries"][0]["output_equal"]
    code, out, err = run("replay", "--last", "0")
    assert code == 2
    assert_one_line_error(err, "--last must be at least 1")


def test_delete_refuses_a_parent_and_removes_a_leaf(run, lib, chain):
    root, child = chain
    code, out, err = run("delete", root.id)
    assert code == 2
    assert_one_line_error(err, "continue its chain")
    code, out, _ = run("delete", child.id)
    assert code == 0 and out == {"id": child.id, "content_sha256": child.content_sha256, "blob_removed": True}
    code, out, err = run("show", child.id)
    assert code == 2
    assert_one_line_error(err, "no artifact")


def test_deposit_json_is_the_web_object(run, chain, lib, tmp_path):
    """`cli.py deposit --json` prints Deposited.to_json(): the object /deposit returns (title and parent included)."""
    root, _ = chain
    path = tmp_path / "sheet.txt"
    path.write_text("The Ivory Span has nine arches.", encoding="utf-8")
    code, out, _ = run("deposit", "--text-file", str(path), "--parent", root.id, "--title", "arches")
    assert code == 0 and out["created"] and out["title"] == "arches" and out["parent"] == root.id
    again = lib.deposit_text("The Ivory Span has nine arches.", parent=root.id, title="arches").to_json()
    assert list(out) == list(again)  # same fields, same order
    computed = ("created", "prefill_s", "prefill_tokens")  # what the second call did not have to compute
    assert {k: v for k, v in out.items() if k not in computed} == {k: v for k, v in again.items() if k not in computed}
    assert out["prefill_tokens"] == out["tokens"] and again["prefill_tokens"] == 0


@pytest.mark.real_gate
def test_a_refused_deposit_exits_non_zero_with_one_line(run, lib):
    q, s, a = "Who built the Varnek lighthouse?", "The Varnek lighthouse was built by Osric Pellamy.", "Osric Pellamy"
    code, out, err = run("deposit", "--question", q, "--solution", s, "--verifier", "exact", "--reference", a)
    assert code == 2 and out == ""
    assert_one_line_error(err, "with the graft; the reference is 'Osric Pellamy'; nothing deposited")
    assert lib.count() == 0


def test_ask_with_a_named_artifact_proves_its_chain_at_load_and_serves_the_same_bytes(run, lib, chain):
    _, child = chain
    q = "What is the tallest bridge of Quendia's capital?"
    before = len(lib.ledger())
    code, out, _ = run("ask", q, "--artifact", child.id, "--max-new-tokens", "3")
    assert code == 0 and out["proved_at_load_s"] > 0 and out["warmed_at_load_s"] > 0
    assert out["proof"]["kind"] == "state" and out["proof"]["passed"] is True  # the probe ran before the question
    rows = lib.ledger()  # the throw-away warm-up answer is not recorded; the question is, once
    assert len(rows) == before + 1 and rows[-1].query == q and out["ledger_id"] is not None
    alone = lib.answer(q, AnswerOptions(artifact=child.id, max_new_tokens=3))  # this process proves it inside the answer
    assert alone.proof.kind == "probe" and alone.proof.passed
    assert (out["output_sha256"], out["logits_sha256"]) == (alone.output_sha256, alone.logits_sha256)
    code, out, _ = run("ask", q, "--max-new-tokens", "3")  # retrieval picks the artifact: nothing known at load
    assert code == 0 and "proved_at_load_s" not in out


def test_ask_refuses_a_named_artifact_whose_probe_fails_at_load(run, lib, chain, monkeypatch):
    from graft_core import graft, proof

    _, child = chain
    real = graft.restore

    def tampered(lm, arts):
        cache = real(lm, arts)
        cache.layers[0].keys = cache.layers[0].keys * 1.5  # the restored state is not the deposited one
        return cache

    monkeypatch.setattr(graft, "restore", tampered)
    monkeypatch.setattr(proof, "restore", tampered)  # the probe restores through proof's own name for it
    code, out, err = run("ask", "What is the capital of Quendia?", "--artifact", child.id, as_json=False)
    assert code == 2 and out == ""
    assert_one_line_error(err, "quarantined")
    assert lib.store.catalog.get(lib.store.catalog.chain(child.id)[0].id).quarantine.startswith("probe check failed")


def test_ask_stream_prints_the_answer_as_it_comes_and_the_same_text(run, chain, monkeypatch):
    from cli import commands

    q = "What is the tallest bridge of Quendia's capital?"
    code, whole, _ = run("ask", q, "--max-new-tokens", "6", "--raw")
    writes: list[str] = []
    real = commands._Streamed.__call__

    def spy(self, text):  # what reaches the terminal, piece by piece
        before = self.shown
        real(self, text)
        if self.shown != before:
            writes.append(self.shown[len(before) :])

    monkeypatch.setattr(commands._Streamed, "__call__", spy)
    code, out, _ = run("ask", q, "--max-new-tokens", "6", "--raw", "--stream", as_json=False)
    assert code == 0 and out.startswith(whole["answer"] + "\n"), (out, whole["answer"])
    assert "".join(writes) == whole["answer"][: len("".join(writes))] and len(writes) >= 1
    with pytest.raises(SystemExit, match="give one of them"):
        run("ask", q, "--stream")  # with --json


def test_streamed_pieces_never_take_back_what_was_printed():
    import io

    from cli.commands import _Streamed

    out = io.StringIO()
    s = _Streamed(out)
    shown = []
    for text in ("caf\ufffd", "café", "café ", "café au", "café au lait"):
        s(text)
        shown.append(out.getvalue())
    # the half character and the trailing space are held back until what follows settles them
    assert shown == ["caf", "café", "café", "café au", "café au lait"]
    s.finish("café au lait")
    assert out.getvalue() == "café au lait\n"
