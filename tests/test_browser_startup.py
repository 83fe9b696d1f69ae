"""The first minute in a real browser (Debian's chromium through Playwright): the page opens while the
model is still loading (the load slowed by the test-only hook), shows a progress bar per start-up stage,
answers a question asked too early with "still starting", then answers once the status line says ready.
And from `python app.py` itself: the placeholder page during Gradio's import (slowed by its own test hook),
which reloads itself into the app. Tiny model: this is about the start-up, not the answer's content."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
SLOW_S = 20
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def starting(tiny_dirs, tmp_path, monkeypatch):
    """The app served over a library whose model is not loaded yet, its start-up just begun."""
    import services
    from retrieval import HashEmbedder
    from services import seed
    from web import app, startup

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
    thread = startup.start(library, tracker, seed=seed.seed_library)
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
            load_s = tracker.expected["load"]  # the typical figure this machine has not measured yet
            playwright.expect(status.locator('[data-stage="load"]')).to_contain_text(f" of ~{load_s:.0f} s")
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


def _lines_into(stream, into: list[str]) -> None:
    for line in stream:
        into.append(line)


@pytest.fixture
def app_process(tiny_dirs, tmp_path):
    """`python app.py` with Gradio's import held 8 s (the placeholder's time) and the model load 15 s."""
    from web import placeholder as boot
    from web import startup

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make system-deps)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
        KVGRAFT_MODEL=str(tiny_dirs["gemma3"]),
        KVGRAFT_HOME=str(tmp_path / "home"),
        KVGRAFT_MODEL_CACHE=str(tmp_path / "models"),
        **{boot.SLOW_IMPORT_ENV: "8", startup.SLOW_LOAD_ENV: "15"},
    )
    for var in ("SYSTEM", "SPACE_ID", "KVGRAFT_DB_URL"):
        env.pop(var, None)
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    threading.Thread(target=_lines_into, args=(proc.stdout, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not any("a placeholder page answers" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/", lines
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_python_app_py_shows_a_placeholder_at_once_then_reloads_into_the_app(app_process):
    url, lines = app_process
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(url)  # during Gradio's import: only the placeholder can answer
            playwright.expect(page.locator("h1")).to_have_text("kvgraft is starting")
            stage = page.locator("#kv-boot-stage")
            playwright.expect(stage).to_contain_text("Stage: loading the web framework (step 1 of 3)")
            first = stage.inner_text()
            playwright.expect(stage).not_to_have_text(first, timeout=5_000)  # the polling updates the seconds
            assert not any("page served at" in line for line in lines)

            status = page.locator("#kv-status")  # the app's own page, reached by the placeholder's reload
            playwright.expect(status).to_contain_text("Starting:", timeout=120_000)
            assert any("page served at" in line for line in lines)
            playwright.expect(page.locator("#kv-boot-stage")).to_have_count(0)
            playwright.expect(status.locator("progress")).to_have_count(4)
            assert page.url == url  # the same address: the placeholder handed its port to the app

            playwright.expect(status).to_contain_text("Built-in library ready", timeout=240_000)
            box = page.locator("#kv-question textarea")
            box.fill("How tall is the Brannock Spire?")
            box.press("Enter")
            playwright.expect(page.locator("#kv-evidence")).to_contain_text("ledger #1", timeout=120_000)
        finally:
            browser.close()
