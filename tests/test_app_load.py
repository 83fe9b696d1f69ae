"""The running web app on loopback under concurrent depositors and askers (4 and 16, bounded in
time): zero errors, and afterwards the catalog, the blobs and the index agree. Also: the default
bind is 127.0.0.1."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.served import serve

gradio_client = pytest.importorskip("gradio_client")

TOKEN = "load-test-token"
DEPOSITORS, ASKERS, PER_ASKER = 4, 16, 2
DEADLINE_S = 240


def test_default_bind_is_loopback(monkeypatch):
    from web import app

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    assert app.server_address() == ("127.0.0.1", 7860)
    assert app.launch_kwargs()["max_file_size"] == "256mb"  # uploads (bundles) are bounded; larger via cli.py import
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9000")
    assert app.server_address() == ("0.0.0.0", 9000)


def test_depositors_and_askers_at_once(tiny_gemma, tmp_path):

    import services
    from retrieval import HashEmbedder
    from web import app

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    lib.deposit_item("Who founded Velmora?", "Velmora was founded by Osric Pellamy.", "Osric Pellamy", "exact", "Osric Pellamy")
    demo = app.build_app(lib, admin_token=TOKEN)
    serve(demo)  # as behind a proxy on loopback
    url = demo.local_url
    assert url.startswith("http://127.0.0.1:")
    start = time.monotonic()

    def user(n: int):  # each depositor and asker at an address of its own, as a proxy reports them
        return gradio_client.Client(url, verbose=False, headers={"X-Forwarded-For": f"198.51.100.{10 + n}"})

    def deposit(i: int) -> str:
        c = user(i)
        out = c.predict(
            TOKEN,
            question=f"Who keeps lighthouse number {i}?",
            solution=f"Lighthouse {i} is kept by Mira Tolland the {i}th.",
            answer=f"Mira Tolland the {i}th",
            verifier="exact",
            reference=f"Mira Tolland the {i}th",
            api_name="/deposit",
        )
        return out["id"]

    def ask(i: int) -> list[dict]:
        c = user(DEPOSITORS + i)
        return [
            c.predict(f"Who keeps lighthouse number {(i + j) % DEPOSITORS}?", max_new_tokens=4, api_name="/answer")
            for j in range(PER_ASKER)
        ]

    try:
        with ThreadPoolExecutor(DEPOSITORS + ASKERS) as pool:
            deps = [pool.submit(deposit, i) for i in range(DEPOSITORS)]
            asks = [pool.submit(ask, i) for i in range(ASKERS)]
            ids = [f.result(timeout=DEADLINE_S) for f in deps]
            answers = [r for f in asks for r in f.result(timeout=DEADLINE_S)]
    finally:
        demo.close()
    assert time.monotonic() - start < DEADLINE_S
    assert len(set(ids)) == DEPOSITORS and len(answers) == ASKERS * PER_ASKER
    assert all("answer" in a and a["tier"] in ("exact", "none") for a in answers)
    assert all(a["check"] is None or a["check"]["exact"] for a in answers)
    report = services.fsck(lib)
    assert report.consistent, report.to_json()
    assert lib.count() == DEPOSITORS + 1
    assert lib.index().ids() == {r.id for r in lib.store.catalog.list_artifacts(limit=100)}
    assert len(lib.ledger()) == ASKERS * PER_ASKER
