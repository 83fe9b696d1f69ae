"""The web app end to end through gradio_client: build_app over a tiny model and the hash embedder,
launched on a free local port, driven exactly as an API user would."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.served import serve

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402

TOKEN = "s3cret-token"
ITEM = {
    "question": "Who founded the town of Velmora?",
    "solution": "The town of Velmora was founded by the cartographer Osric Pellamy.",
    "answer": "Osric Pellamy",
    "verifier": "exact",
    "reference": "Osric Pellamy",
}


def _launch(library, token):
    from web import app

    demo = app.build_app(library, admin_token=token)
    serve(demo)  # as behind a proxy on loopback
    return demo


@pytest.fixture(scope="module")
def library(tiny_gemma, tmp_path_factory):
    import services
    from retrieval import HashEmbedder

    return services.Library(home=tmp_path_factory.mktemp("app-home"), lm=tiny_gemma, embedder=HashEmbedder())


@pytest.fixture(scope="module")
def served(library):
    demo = _launch(library, TOKEN)
    try:
        yield demo.local_url
    finally:
        demo.close()


@pytest.fixture(scope="module")
def client(served):
    return gradio_client.Client(served, verbose=False)


@pytest.fixture(scope="module")
def deposited(client):
    from tests.conftest import accepting_judge

    with pytest.MonkeyPatch.context() as mp:  # module-scoped: set up before the per-test judge double
        accepting_judge(mp)
        return client.predict(TOKEN, *ITEM.values(), api_name="/deposit")


def answer_keys() -> set[str]:
    import services

    return {f.name for f in dataclasses.fields(services.AnswerResult)} | {"scope"}  # scope: derived from machine_bound


def test_deposit_refused_without_token(client):
    with pytest.raises(AppError, match="Admin token refused"):
        client.predict("", *ITEM.values(), api_name="/deposit")
    with pytest.raises(AppError, match="Admin token refused"):
        client.predict("wrong", *ITEM.values(), api_name="/deposit")


def test_deposit_accepted_with_token_and_answer_is_exact(client, deposited):
    assert deposited["created"] and deposited["verified"] and deposited["verifier"] == "exact"
    again = client.predict(TOKEN, *ITEM.values(), api_name="/deposit")
    assert again["id"] == deposited["id"] and not again["created"]
    r = client.predict(ITEM["question"], check=True, admin_token=TOKEN, api_name="/answer")  # the fresh recomputation
    assert set(r) == answer_keys()  # the `cli.py ask --json` object
    assert r["tier"] == "exact" and r["artifact_ids"] == [deposited["id"]]
    assert r["check"]["exact"] is True and r["check"]["fresh_sha256"] == r["check"]["grafted_sha256"]
    assert r["retrieved"][0]["verifier"] == "exact" and r["retrieved"][0]["verdict"] == "verified"


def test_deposit_refusal_is_explained(client):
    bad = dict(ITEM, answer="Someone Else", question="Who else founded Velmora?")
    with pytest.raises(AppError, match="refused, nothing deposited"):
        client.predict(TOKEN, *bad.values(), api_name="/deposit")


def test_deposits_disabled_without_configured_token(library):
    demo = _launch(library, "")
    try:
        c = gradio_client.Client(demo.local_url, verbose=False)
        with pytest.raises(AppError, match="KVGRAFT_ADMIN_TOKEN"):
            c.predict("anything", *ITEM.values(), api_name="/deposit")
    finally:
        demo.close()


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("", "The question is empty"),
        ("   \n", "The question is empty"),
        ("what\x00is\x00this", "NUL bytes"),
        ("\x01\x02\x03\x7f junk", "control or unassigned characters"),
        ("why " * 1200, "the limit is 4,000"),
        ("word " * 700, "the limit without the admin token is 256: shorten it, or give the admin token"),
    ],
)
def test_bad_input_gets_clear_message(client, question, message):
    with pytest.raises(AppError, match=message):
        client.predict(question, api_name="/answer")


def test_an_admin_question_past_the_context_gets_a_clear_message(client):
    """The admin has no prompt-token bound but the model's own: past its context the answer says so."""
    with pytest.raises(AppError, match="context"):
        client.predict("word " * 700, admin_token=TOKEN, api_name="/answer")


def _text(message: dict) -> str:
    """A chat message's text (Gradio 6 sends content as a list of typed parts)."""
    c = message["content"]
    return c if isinstance(c, str) else "".join(p.get("text", "") for p in c if isinstance(p, dict))


def test_bad_input_in_chat_keeps_history(client, deposited):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "earlier"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "kept"}]},
    ]
    args = (True, 3, 8, True, False, TOKEN)  # the full check needs the admin token
    out, _evidence, _box = client.predict("a\x00b", history, *args, api_name="/chat")
    assert [_text(m) for m in out[:2]] == ["earlier", "kept"]
    assert "NUL bytes" in _text(out[-1])
    out, evidence, box = client.predict("word " * 700, out, *args, api_name="/chat")
    assert [_text(m) for m in out[:2]] == ["earlier", "kept"] and "Not answered" in _text(out[-1])
    out, evidence, box = client.predict(ITEM["question"], out, *args, api_name="/chat")
    assert 'class="kv-badge kv-pass">EXACT<' in evidence and box == ""
    assert out[-1]["metadata"]["title"].startswith("Evidence · EXACT")


def test_verify_endpoint(client, deposited):
    rep = client.predict(3, None, api_name="/verify")
    assert rep["samples"] == 3 and rep["byte_equal"] == 3 and len(rep["rows"]) == 3
    rel = client.predict(2, 5, api_name="/verify")
    assert rel["relocate"] == 5 and all(r["tier"] == "relocated" for r in rel["rows"])


def test_eight_concurrent_clients(served, deposited):
    """Eight users at eight addresses at once (one address gets a share of the model, not all of it)."""

    def ask(i: int) -> dict:
        c = gradio_client.Client(served, verbose=False, headers={"X-Forwarded-For": f"198.51.100.{10 + i}"})
        return c.predict(ITEM["question"], 3, True, 4, i % 2 == 0, False, TOKEN, api_name="/answer")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(8)))
    assert len(results) == 8 and all(r["tier"] == "exact" for r in results)
    assert all(r["check"]["exact"] for r in results[::2])


def test_export_delete_import_round_trip(client, served, deposited):
    path, message = client.predict(TOKEN, deposited["id"], api_name="/export")
    assert message.startswith("Exported 1 artifacts")
    with pytest.raises(AppError, match="Admin token refused"):
        client.predict("nope", deposited["id"], api_name="/delete")
    msg, _table = client.predict(TOKEN, deposited["id"], api_name="/delete")
    assert msg.startswith("Deleted")
    admin = gradio_client.Client(served, verbose=False, headers={"X-Kvgraft-Admin-Token": TOKEN})  # uploads: the admin's
    msg, table = admin.predict(TOKEN, gradio_client.handle_file(path), api_name="/import")
    assert msg.startswith("Imported 1 artifacts (1 new")
    assert deposited["id"][:16] in [row[0] for row in table["data"]]
    assert client.predict(ITEM["question"], check=True, admin_token=TOKEN, api_name="/answer")["check"]["exact"] is True


@pytest.mark.integration
def test_real_model_seed_item_answered_exactly(real_lm, tmp_path):
    import services
    from retrieval import HashEmbedder
    from services import seed

    lib = services.Library(home=tmp_path / "real", lm=real_lm, embedder=HashEmbedder())
    item = seed.seed_items()[0][0]
    demo = _launch(lib, TOKEN)
    try:
        c = gradio_client.Client(demo.local_url, verbose=False)
        d = c.predict(TOKEN, *item.values(), api_name="/deposit")
        r = c.predict(item["question"], check=True, admin_token=TOKEN, api_name="/answer")  # the full recomputation
    finally:
        demo.close()
    assert d["verified"] and r["artifact_ids"] == [d["id"]] and r["tier"] == "exact"
    assert r["proof"]["passed"] is True  # the probe proof on the serving cache
    assert r["answer"].strip().rstrip(".") == item["answer"], r["answer"]
    assert r["check"]["exact"] is True and r["check"]["kl"] == 0.0


def test_one_dashboard_render_serves_every_session_within_its_period():
    import threading

    from web.handlers import SharedRender

    now = [100.0]
    drawn = []

    def render():
        drawn.append(now[0])
        return ("stats", len(drawn))

    shared = SharedRender(render, ttl_s=5.0, clock=lambda: now[0])
    results = []
    threads = [threading.Thread(target=lambda: results.append(shared())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [("stats", 1)] * 8 and shared.renders == 1
    now[0] += 4.9
    assert shared() == ("stats", 1)
    now[0] += 0.1
    assert shared() == ("stats", 2) and drawn == [100.0, 105.0]
