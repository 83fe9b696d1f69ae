"""The first minute in a real browser (Debian's chromium through Playwright): the page opens while the
model is still loading (the load slowed by the test-only hook), shows a progress bar per start-up stage,
answers a question asked too early with "still starting", then answers once the status line says ready.
Tiny model and hash embedder: this is about the start-up, not the answer's content."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
SLOW_S = 20


@pytest.fixture
def starting(tiny_dirs, tmp_path, monkeypatch):
    """The app served over a library whose model is not loaded yet, its start-up just begun."""
    import app
    import services
    import startup
    from retrieval import HashEmbedder

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make system-deps)")
    monkeypatch.setenv(startup.SLOW_LOAD_ENV, str(SLOW_S))
    library = services.Library(home=tmp_path / "home", model_name=str(tiny_dirs["gemma3"]), embedder=HashEmbedder())
    tracker = startup.Startup()
    demo = app.build_app(library, admin_token="t", startup=tracker)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs())
    thread = startup.start(library, tracker, seed=app.seed_library)
    try:
        yield demo.local_url, tracker, library
    finally:
        thread.join(timeout=180)
        demo.close()


def test_page_during_start_up_shows_progress_then_answers(starting):
    url, tracker, library = starting
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(url)
            status = page.locator("#kv-status")
            playwright.expect(status).to_contain_text("Starting: loading the model", timeout=30_000)
            assert not library.model_loaded  # the page came before the model
            playwright.expect(status.locator("progress")).to_have_count(4)
            playwright.expect(status.locator('[data-stage="convert"]')).to_contain_text("skipped")
            playwright.expect(status.locator('[data-stage="load"]')).to_contain_text(" of ~6 s")
            playwright.expect(status).to_contain_text("s left (typical figures, not yet measured on this machine)")

            box = page.locator("#kv-question textarea")
            box.fill("Who founded the town of Velmora?")
            box.press("Enter")
            chat = page.locator("#kv-chat")
            playwright.expect(chat).to_contain_text("Still starting: loading the model (stage 2 of 4)", timeout=30_000)
            assert not tracker.ready

            playwright.expect(status).to_contain_text("Built-in library ready", timeout=SLOW_S * 1000 + 150_000)
            playwright.expect(status).to_contain_text("started in")
            playwright.expect(status.locator("progress")).to_have_count(0)
            box.fill("How tall is the Brannock Spire?")
            box.press("Enter")
            playwright.expect(page.locator("#kv-evidence")).to_contain_text("ledger #1", timeout=120_000)
            assert len(library.ledger()) == 1  # the early question was refused, not recorded
        finally:
            browser.close()
