"""The deposit gate on the tiny model: the deposit gate grafts and generates, its record replays token for token,
an edited record is not shown as verified, imports re-tokenise / re-embed / replay, and a probe mismatch
quarantines. (The tiny model cannot answer, so the gate's verdict is a test double here except where
a test is marked `real_gate`; tests/test_gate_integration.py runs the real verifiers on the real model.)"""

from __future__ import annotations

import hashlib
import json

import pytest
import sqlalchemy as sa

import services
import verifiers
from db import connection as dbconn
from db.schema import artifacts, verifications
from errors import IncompatibleArtifact, IntegrityError, VerificationFailed
from graft_core import generate, templates
from services import AnswerOptions, gate
from tests.test_maintenance import files_under, make_lib, read_members, rewrite

Q, S, A = "Who built the Varnek lighthouse?", "The Varnek lighthouse was built by Osric Pellamy.", "Osric Pellamy"


@pytest.fixture
def lib(kvgraft_home, tiny_gemma):
    return make_lib(kvgraft_home, tiny_gemma)


def _sql(lib, stmt):
    with dbconn.write(lib.store.catalog._engine) as conn:
        conn.execute(stmt)


@pytest.mark.real_gate
def test_a_model_that_cannot_answer_is_refused_and_nothing_is_stored(lib):
    """The real verifiers on a random model: the typed answer passes the pre-check, the model's own
    answer with the graft does not, so the gate refuses (a gate that skipped the graft would accept)."""
    with pytest.raises(VerificationFailed) as e:
        lib.deposit_item(Q, S, A, "exact", A)
    msg = str(e.value)
    assert msg.startswith("the model answered ") and msg.endswith(
        " with the graft; the reference is 'Osric Pellamy'; nothing deposited"
    )
    assert lib.count() == 0 and list(lib.store.blobs) == [] and len(lib.index()) == 0
    with dbconn.read(lib.store.catalog._engine) as conn:
        [row] = conn.execute(sa.select(verifications)).all()
    assert row.verdict == "refused" and row.artifact_id is None and json.loads(row.generated_token_ids)


def test_the_gate_record_replays_token_for_token(lib, tiny_gemma):
    d = lib.deposit_item(Q, S, None, "exact", A)  # no typed answer: the deposited answer is the model's own
    assert d.created and d.verified and d.provenance == "verified" and d.gate_tokens > 0 and d.gate_s > 0
    [v] = lib.show(d.id).verifications
    assert v.counts_as_verified and v.label == "verified" and v.provenance == "verified"
    # the recorded run is the graft of the stored artifact answering the question with ask's template
    chain = lib.load_chain(d.id)[0]
    again = generate.answer(tiny_gemma, chain, Q, max_new_tokens=gate.GATE_MAX_NEW_TOKENS)
    assert again.prompt_ids == v.question_token_ids and again.token_ids == v.generated_token_ids
    assert v.generated_sha256 == generate.tokens_sha256(v.generated_token_ids)
    # and not an answer computed without the graft
    bare = generate.answer(tiny_gemma, [], Q, max_new_tokens=gate.GATE_MAX_NEW_TOKENS)
    assert (bare.prompt_ids, bare.token_ids) != (v.question_token_ids, v.generated_token_ids)
    shown = lib.show(d.id).to_json()
    assert shown["verified"] is True and shown["verifications"][0]["label"] == "verified"
    assert [e.verdict for e in lib.entries()] == ["verified"]


def test_an_edited_verification_row_is_not_shown_as_verified(lib):
    d = lib.deposit_item(Q, S, A, "exact", A)
    [v] = lib.show(d.id).verifications
    _sql(lib, sa.update(verifications).where(verifications.c.id == v.id).values(generated_token_ids=json.dumps([1, 2, 3])))
    [edited] = lib.show(d.id).verifications
    assert not edited.counts_as_verified and edited.label == "not verified"
    assert lib.show(d.id).to_json()["verified"] is False
    assert [e.verdict for e in lib.entries()] == ["not verified"]
    assert lib.retrieve(Q, threshold=0.0)[0].verdict == "not verified"


def test_a_wrong_typed_answer_is_refused_before_any_prefill(lib, monkeypatch):
    monkeypatch.setattr(gate, "fact_run", lambda *a: pytest.fail("the pre-check must refuse before the model runs"))
    with pytest.raises(
        VerificationFailed, match="^refused, nothing deposited: answer 'Osric': it does not name the reference 'Osric Pellamy'; "
    ):
        lib.deposit_item(Q, S, "Osric", "exact", A)
    assert lib.count() == 0


def _export(lib, tmp_path):
    d = lib.deposit_item(Q, S, A, "exact", A)
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    return d, out


def _tamper_catalog(src, dst, edit):
    """Edit catalog.json and recompute its hash in the manifest (what a careful tamperer does)."""
    m = read_members(src)
    cat = json.loads(m["catalog.json"])
    edit(cat)
    m["catalog.json"] = json.dumps(cat).encode()
    man = json.loads(m["manifest.json"])
    man["catalog"]["sha256"] = hashlib.sha256(m["catalog.json"]).hexdigest()
    m["manifest.json"] = json.dumps(man).encode()
    return rewrite(src, dst, m)


def test_import_refuses_source_text_that_does_not_tokenise_to_the_artifact(lib, tmp_path, tiny_gemma):
    d, out = _export(lib, tmp_path)

    def edit(cat):
        cat["sources"][0]["text"] = cat["sources"][0]["text"].replace("Osric Pellamy", "Mallory Vane")

    bad = _tamper_catalog(out, tmp_path / "edited.tar", edit)
    target = make_lib(tmp_path / "target", tiny_gemma)
    before = files_under(tmp_path / "target")
    with pytest.raises(IntegrityError, match=f"artifact {d.id}: its source text in the bundle tokenises to other tokens"):
        services.import_bundle(target, bad)
    assert target.count() == 0 and files_under(tmp_path / "target") == before


def test_import_replays_verifications_and_recomputes_embeddings(lib, tmp_path, tiny_gemma):
    d, out = _export(lib, tmp_path)

    def edit(cat):
        cat["embeddings"][0]["vector"] = __import__("base64").b64encode(b"\0" * 4 * cat["embeddings"][0]["dim"]).decode()
        cat["verifications"][0]["generated_token_ids"] = [7, 7, 7]  # a forged record is replaced by the replay

    bad = _tamper_catalog(out, tmp_path / "forged.tar", edit)
    target = make_lib(tmp_path / "target", tiny_gemma)
    rep = services.import_bundle(target, bad)
    assert rep.new == (d.id,) and rep.replayed == 1 and rep.not_reverified == 0 and rep.probes_checked == 1
    [v] = target.show(d.id).verifications
    [orig] = lib.show(d.id).verifications
    assert v.counts_as_verified and v.generated_token_ids == orig.generated_token_ids
    assert target.store.catalog.embeddings(target.embedder.embedder_id) == lib.store.catalog.embeddings(lib.embedder.embedder_id)


def test_trust_verdicts_labels_rows_imported_not_reverified(lib, tmp_path, tiny_gemma, monkeypatch):
    d, out = _export(lib, tmp_path)
    target = make_lib(tmp_path / "target", tiny_gemma)
    monkeypatch.setattr(gate, "graft_run", lambda *a: pytest.fail("--trust-verdicts must not replay"))
    rep = services.import_bundle(target, out, trust_verdicts=True)
    assert rep.replayed == 0 and rep.not_reverified == 1
    [v] = target.show(d.id).verifications
    assert v.label == "imported, not re-verified" and not v.counts_as_verified
    assert target.show(d.id).to_json()["provenance"] == "imported, not re-verified"
    assert [e.verdict for e in target.entries()] == ["imported, not re-verified"]


def test_a_flipped_probe_hash_quarantines_the_artifact(lib):
    d = lib.deposit_item(Q, S, A, "exact", A)
    probe = lib.store.catalog.get(d.id).probe_sha256
    flipped = ("0" if probe[0] != "0" else "1") + probe[1:]
    _sql(lib, sa.update(artifacts).where(artifacts.c.id == d.id).values(probe_sha256=flipped))
    lib.artifacts.forget_proofs()  # a new process: the first restore checks the probe
    with pytest.raises(IntegrityError, match=f"artifact {d.id} is quarantined .*rebuild --compare {d.id}"):
        lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=2))
    assert lib.store.catalog.get(d.id).quarantine.startswith("probe check failed")
    assert lib.retrieve(Q, threshold=0.0) == []  # retrieval skips it
    r = services.fsck(lib)
    assert [q.id for q in r.quarantined] == [d.id] and not r.consistent and "rebuild --compare" in r.advice[-1]
    with pytest.raises(IntegrityError, match="quarantined"):
        lib.answer(Q, AnswerOptions(artifact=d.id, max_new_tokens=2))


def test_fsck_deep_checks_every_probe(lib):
    d = lib.deposit_item(Q, S, A, "exact", A)
    lib.index()
    sound = services.fsck(lib, deep=True)
    assert sound.probes_checked == 1 and sound.consistent and sound.quarantined == ()
    _sql(lib, sa.update(artifacts).where(artifacts.c.id == d.id).values(probe_sha256="f" * 64))
    r = services.fsck(lib, deep=True)
    assert [q.id for q in r.quarantined] == [d.id] and not r.consistent
    reb = services.rebuild_compare(lib, d.id)
    assert reb.probe_ok is False and not reb.equal and "catalog records probe hash" in reb.probe_detail


@pytest.mark.real_gate
@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("The spire is 212 metres tall.", True),
        ("The spire is not 212 metres tall.", False),
        ("No, 300 metres; 212 metres was the old spire.", False),
        ("It isn't 212 metres.", False),
        ("It is 300 metres rather than 212 metres.", False),
    ],
)
def test_a_value_inside_a_denial_is_not_accepted(answer, ok):
    """Both gate runs judge what the answer asserts (tests/test_gate_claims.py has the full table): "not 212
    metres" cannot pass for 212 metres, and a sentence that names 300 metres as well names two values."""
    verdict = verifiers.judge(answer, "numeric", "212 metres", "How tall is the spire?")
    assert verdict.ok is ok, (answer, verdict.detail)
    if ok:
        assert gate.claimed(answer, "How tall is the spire?", "numeric", "212 metres") == "212"


# ---- a bundle proves its KV state by recomputation -----------------------------------------------

KEEPER = "Fact sheet: the keeper of the Varnek light in 1841 was {}, who kept its log for thirty years."
NAMES = ("Tollivaux", "Delacroix", "Pellamy", "Marchetti", "Okonkwo", "Vandersloot", "Quenmora", "Ashdown")


def _same_length_pair(lm) -> tuple[str, str]:
    """Two fact sheets that differ in one name and tokenise to the same number of tokens."""
    by_len: dict[int, str] = {}
    for name in NAMES:
        n = len(lm.tokenizer(templates.document_text(KEEPER.format(name)))["input_ids"])  # as deposit_text stores it
        if n in by_len:
            return KEEPER.format(by_len[n]), KEEPER.format(name)
        by_len[n] = name
    pytest.fail(f"no two of {NAMES} tokenise to the same length in this tokenizer")


def _forge_kv(src_bundle, dst, lm, true_text: str, forged_text: str):
    """The attack: keep an artifact's KV tensors and probe hash, give it another text of the same token count,
    and rewrite its token ids, text hash, id, content hash and every manifest and catalog row that names them."""
    import dataclasses

    from graft_core import codec
    from graft_core.artifact import text_sha256
    from services.exchange import _blob_member

    m = read_members(src_bundle)
    man = json.loads(m["manifest.json"])
    [entry] = man["artifacts"]
    real = codec.loads(m[entry["member"]])
    [source] = json.loads(m["catalog.json"])["sources"]
    true_source, forged_source = source["text"], source["text"].replace(true_text, forged_text)
    assert true_source != forged_source
    ids = lm.tokenizer(forged_source)["input_ids"]
    assert len(ids) == real.length and ids != real.token_ids.tolist()
    forged = dataclasses.replace(real, token_ids=real.token_ids.new_tensor(ids), text_sha256=text_sha256(forged_source))
    data = codec.dumps(forged)
    new_hash = hashlib.sha256(data).hexdigest()
    swaps = {
        real.key: forged.key,
        entry["content_sha256"]: new_hash,
        text_sha256(true_source): text_sha256(forged_source),
        json.dumps(true_text)[1:-1]: json.dumps(forged_text)[1:-1],
    }

    def swapped(raw: bytes) -> bytes:
        text = raw.decode()
        for a, b in swaps.items():
            text = text.replace(a, b)
        return text.encode()

    del m[entry["member"]]
    m[_blob_member(new_hash)] = data
    m["catalog.json"] = swapped(m["catalog.json"])
    man = json.loads(swapped(m["manifest.json"]))
    man["catalog"]["sha256"] = hashlib.sha256(m["catalog.json"]).hexdigest()
    for e in man["artifacts"]:
        e["bytes"] = len(data)
    m["manifest.json"] = json.dumps(man).encode()
    return rewrite(src_bundle, dst, m), forged.key


def test_import_refuses_a_kv_state_that_does_not_come_from_its_tokens(lib, tmp_path, tiny_gemma):
    true_text, forged_text = _same_length_pair(tiny_gemma)
    d = lib.deposit_text(true_text, title="keeper")
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    bad, forged_id = _forge_kv(out, tmp_path / "forged.tar", tiny_gemma, true_text, forged_text)
    target = make_lib(tmp_path / "target", tiny_gemma)
    before = files_under(tmp_path / "target")
    with pytest.raises(
        IntegrityError,
        match=f"artifact {forged_id}: recomputed here from its own tokens it is not the bundle's artifact .*"
        "its KV state does not come from its tokens, nothing was imported",
    ):
        services.import_bundle(target, bad)
    assert target.count() == 0 and files_under(tmp_path / "target") == before
    rep = services.import_bundle(target, out)  # the honest bundle: every artifact recomputed to its bytes
    assert rep.new == (d.id,) and rep.probes_checked == 1


def test_attested_verdicts_arrive_unverified_unless_the_admin_trusts_them(lib, tmp_path, tiny_gemma):
    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.", attested_by="Dr. A. Rivera", admin=True)
    assert [e.verdict for e in lib.entries()] == ["attested"]
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    plain = make_lib(tmp_path / "plain", tiny_gemma)
    rep = services.import_bundle(plain, out)
    assert rep.new == (d.id,) and rep.attested_dropped == 1 and rep.probes_checked == 1
    assert [e.verdict for e in plain.entries()] == ["unverified"] and plain.show(d.id).verifications == ()
    trusting = make_lib(tmp_path / "trusting", tiny_gemma)
    rep = services.import_bundle(trusting, out, trust_verdicts=True)
    assert rep.attested_dropped == 0 and [e.verdict for e in trusting.entries()] == ["attested"]


def test_an_import_without_the_model_is_quarantined_until_rebuilt(lib, tmp_path, tiny_gemma):
    d = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [d.id], out)
    target = make_lib(tmp_path / "target", tiny_gemma)
    rep = services.import_bundle(target, out, check_model=False)
    assert rep.model_checked is False and rep.probes_checked == 0
    assert target.store.catalog.get(d.id).quarantine.startswith("imported without recomputation")
    assert services.rebuild_compare(target, d.id).equal
    assert target.store.catalog.get(d.id).quarantine is None


def test_a_long_import_reports_its_progress_by_tokens(lib, tmp_path, tiny_gemma):
    a = lib.deposit_text("Fact sheet: the Brannock Spire is 212 metres tall.")
    b = lib.deposit_text("Fact sheet: the Velmora bell rings eleven times at noon, once for each founding family.")
    out = tmp_path / "b.tar"
    services.export_bundle(lib, [a.id, b.id], out)
    heard = []
    services.import_bundle(make_lib(tmp_path / "target", tiny_gemma), out, on_progress=lambda f, m: heard.append((f, m)))
    total = a.tokens + b.tokens
    assert [f for f, _ in heard] == sorted(f for f, _ in heard) and heard[-1][0] == 1.0 and len(heard) == 2
    assert heard[-1][1] == f"recomputed 2/2 artifacts ({total:,}/{total:,} tokens)"


def test_the_cli_progress_bar_draws_only_on_a_terminal():
    import io

    from cli.upkeep import _progress_bar

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert _progress_bar("import", io.StringIO()) is None
    tty = Tty()
    draw = _progress_bar("import", tty)
    draw(0.5, "recomputed 1/2 artifacts")
    draw(1.0, "recomputed 2/2 artifacts")
    assert tty.getvalue() == (
        "\rimport [" + "#" * 15 + "." * 15 + "]  50% recomputed 1/2 artifacts\x1b[K"
        "\rimport [" + "#" * 30 + "] 100% recomputed 2/2 artifacts\x1b[K\n"
    )


def _other_numerics(lm):
    """The same weights and tokenizer under another numerical definition (another record, another fingerprint)."""
    import dataclasses

    return dataclasses.replace(lm, config=dataclasses.replace(lm.config, torch_version=lm.config.torch_version + "-other"))


def test_a_bundle_of_another_numerical_definition_is_rebuilt_here_from_its_tokens(tmp_path, tiny_gemma):
    other = _other_numerics(tiny_gemma)
    assert other.fingerprint != tiny_gemma.fingerprint and other.info == tiny_gemma.info
    src, here = make_lib(tmp_path / "src", other), make_lib(tmp_path / "here", tiny_gemma)
    d = src.deposit_item(Q, S, A, "exact", A)
    child = src.deposit_text("The Varnek lighthouse stands on the north cape.", parent=d.id)
    out = tmp_path / "other.tar"
    services.export_bundle(src, [child.id], out)
    target = make_lib(tmp_path / "target", tiny_gemma)
    rep = services.import_bundle(target, out)
    # what depositing the same texts here gives: the ids and the bytes a rebuilt import must have
    d_here = here.deposit_item(Q, S, A, "exact", A)
    child_here = here.deposit_text("The Varnek lighthouse stands on the north cape.", parent=d_here.id)
    assert rep.rebuilt == 2 and rep.probes_checked == 0 and rep.replayed == 1
    assert sorted(rep.new) == sorted([d_here.id, child_here.id]) and d.id not in rep.new
    for aid in (d_here.id, child_here.id):
        row, ref = target.store.catalog.get(aid), here.store.catalog.get(aid)
        assert row.content_sha256 == ref.content_sha256 and row.model_fingerprint == tiny_gemma.fingerprint
        assert target.store.blobs.get(row.content_sha256) == here.store.blobs.get(ref.content_sha256)  # this machine's bytes
        assert row.origin.startswith(f"rebuilt: made under numerics {other.config.digest()[:16]}")
    assert target.store.catalog.get(child_here.id).parent_id == d_here.id
    src_blob = src.store.catalog.get(d.id).content_sha256
    assert not target.store.blobs.exists(src_blob)  # the bundle's bytes were not kept
    [v] = target.show(d_here.id).verifications
    assert v.counts_as_verified  # replayed on the rebuilt chain
    assert target.answer(Q, AnswerOptions(artifact=child_here.id, max_new_tokens=4, record=False)).tier == "exact"


@pytest.mark.parametrize("claim", ["another identity", "no claim"])
def test_a_bundle_of_another_model_is_refused_whatever_it_claims(tmp_path, tiny_gemma, claim):
    other = _other_numerics(tiny_gemma)
    src = make_lib(tmp_path / "src", other)
    d = src.deposit_item(Q, S, A, "exact", A)
    out = tmp_path / "other.tar"
    services.export_bundle(src, [d.id], out)
    m = read_members(out)
    man = json.loads(m["manifest.json"])
    if claim == "no claim":
        del man["models"]  # as a bundle made before claims were written
    else:
        man["models"][other.fingerprint]["identity"] = "0" * 64
    m["manifest.json"] = json.dumps(man).encode()
    bad = rewrite(out, tmp_path / "bad.tar", m)
    target = make_lib(tmp_path / "target", tiny_gemma)
    before = files_under(tmp_path / "target")
    with pytest.raises(
        IncompatibleArtifact, match=f"artifact {d.id} was made by model {other.fingerprint[:16]}, this store's model is"
    ):
        services.import_bundle(target, bad)
    assert target.count() == 0 and files_under(tmp_path / "target") == before


def test_an_import_of_this_machines_bytes_is_labelled_imported(lib, tmp_path, tiny_gemma):
    d, out = _export(lib, tmp_path)
    target = make_lib(tmp_path / "target", tiny_gemma)
    rep = services.import_bundle(target, out)
    assert rep.rebuilt == 0 and rep.probes_checked == 1
    row = target.store.catalog.get(d.id)
    assert row.origin == "imported" and row.content_sha256 == lib.store.catalog.get(d.id).content_sha256
    assert lib.store.catalog.get(d.id).origin is None  # deposited there


def test_the_fact_run_grafts_a_one_line_fact_alone_and_a_worked_solution_below_its_question():
    """The shape decides the form, never the typed answer: a one-line fact (every knowledge and library item) as
    `Fact: <solution>`; a worked solution of several lines with its question above it."""
    q, fact = "What colour is the flag of Tzerin?", "The charter of Tzerin fixes its flag as plain saffron."
    assert templates.fact_run_text(q, fact) == templates.fact_text(fact) == f"Fact: {fact}\n"
    assert templates.fact_run_text(q, f"\n  {fact}  \n\n") == f"Fact: {fact}\n"  # blank lines are not steps
    worked = "After the discount the price is 215 × 90/100 = 193.5.\nAdding 5% tax gives 203.175.\nAnswer: 203.175"
    assert templates.fact_run_text(q, worked) == f"Question: {q}\nFact: {worked}\n"
    assert templates.is_worked_solution(worked) and not templates.is_worked_solution(fact)


def test_the_gate_budget_follows_the_models_template(lib, tiny_gemma, monkeypatch):
    """A model asked in the plain form answers an item in a line (24 tokens); one asked through a chat template
    answers in sentences and one that reasons works first: each gate run decodes up to the chat budget."""
    seen = []
    real = generate.answer
    monkeypatch.setattr(generate, "answer", lambda *a, **k: seen.append(k["max_new_tokens"]) or real(*a, **k))
    lib.deposit_item("Who built the Varnek lighthouse?", "Osric Pellamy built it.", "Osric Pellamy", "exact", "Osric Pellamy")
    assert seen == [gate.GATE_MAX_NEW_TOKENS] * 2 == [24, 24]
    chat = templates.Template(chat=True, turn=("<s>", "</s>\n"), query=("<u>", "</u>\n<a>"), bare=("<u>", "</u>\n<a>"))
    monkeypatch.setattr(templates, "of", lambda tok: chat)
    assert gate.budget(tiny_gemma) == gate.GATE_CHAT_MAX_NEW_TOKENS == 384
