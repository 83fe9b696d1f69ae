"""The web app in a real browser (Debian's chromium through Playwright): first start seeds the
built-in library, a question is answered with its evidence and EXACT badge, the dashboard plots, the admin
imports a bundle through the Library tab (the token opens an upload session; a browser without one is
refused and nothing is written). Served through `web.app.serve`, the product's launch with its edge gates.
Saves chat.png and dashboard.png into $KVGRAFT_SCREENSHOTS (`make screenshots` points it at
docs/screenshots), else into a temp folder, so a test run never rewrites committed files.

Uses the real Gemma 3 270M and embedder when the converted model is already in the model cache
(an answer that actually answers), otherwise the tiny model and the hash embedder."""

from __future__ import annotations

import os
import re
import uuid
import warnings
from pathlib import Path

import pytest

from tests.served import serve

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(os.environ.get("KVGRAFT_SCREENSHOTS") or Path(os.environ.get("TMPDIR", "/tmp")) / "kvgraft-screenshots")
QUESTION = "Who founded the town of Velmora?"


def _real_model_cached() -> bool:
    cache = Path(os.environ.get("KVGRAFT_MODEL_CACHE") or Path.home() / ".cache" / "kvgraft" / "models")
    return any(cache.glob("gemma-3-270m*/config.json"))


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    import services
    from retrieval import HashEmbedder
    from services import seed
    from web import app, startup

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make system-deps)")
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no") and not os.environ.get("KVGRAFT_BROWSER_TINY"):
        lm, embedder, real = request.getfixturevalue("real_lm"), None, True  # CI: the real model or a failure
    elif _real_model_cached() and not os.environ.get("KVGRAFT_BROWSER_TINY"):
        lm, embedder, real = request.getfixturevalue("real_lm"), None, True
    else:
        warnings.warn(
            "browser test on the TINY model: the real model is not in the model cache (or KVGRAFT_BROWSER_TINY is set)",
            stacklevel=2,
        )
        lm, embedder, real = request.getfixturevalue("tiny_gemma"), HashEmbedder(), False
    uploads = tmp_path_factory.mktemp("browser-uploads")
    env = pytest.MonkeyPatch()
    env.setenv("GRADIO_TEMP_DIR", str(uploads))  # Gradio's upload folder, this module's own: measured below
    library = services.Library(home=tmp_path_factory.mktemp("browser-home"), lm=lm, embedder=embedder)
    status = startup.Startup()
    demo = app.build_app(library, admin_token="t", startup=status)
    seeding = startup.start(library, status, seed=seed.seed_library)
    serve(demo, proxies=(), **app.launch_kwargs())  # the socket's peer is the address, as a direct deployment
    try:
        yield demo.local_url, real, library, uploads
    finally:
        if seeding is not None:
            seeding.join(timeout=120)
        demo.close()
        env.undo()


@pytest.fixture(scope="module")
def browser(served):
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(served, browser):
    pg = browser.new_page(viewport={"width": 1440, "height": 1000})
    pg.goto(served[0])
    yield pg


def _ask(page, question: str) -> None:
    box = page.locator("#kv-question textarea")
    box.fill(question)
    box.press("Enter")


def test_chat_answer_with_exact_badge(page, served):
    real = served[1]
    # seeding deposits 11 items through the behavioural gate (a prefill and two graft+generate runs each):
    # a behaviour to wait for, not a speed to assert; CI's machine may be shared
    playwright.expect(page.locator("#kv-status")).to_contain_text("Built-in library ready", timeout=1_200_000)
    page.get_by_label("compare with no graft (measured)").check()
    page.get_by_label("check exactness (a fresh recomputation)").check()  # off by default (the probe proof runs instead)
    page.get_by_label("admin token (check, compare)").fill("t")  # both recompute the context: admin only
    _ask(page, QUESTION)
    badge = page.locator("#kv-evidence .kv-badge")
    playwright.expect(badge).to_have_text("EXACT", timeout=120_000)
    evidence = page.locator("#kv-evidence")
    playwright.expect(evidence).to_contain_text("tier exact")
    playwright.expect(evidence).to_contain_text("grafted logits SHA-256")
    playwright.expect(evidence).to_contain_text("(measured)")
    if real:
        playwright.expect(page.locator("#kv-chat")).to_contain_text("Osric Pellamy")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "chat.png"))


def test_dashboard_shows_plots(page):
    for n, question in enumerate(("How tall is the Brannock Spire?", "What is the capital of the Duchy of Marrowind?"), start=2):
        _ask(page, question)
        playwright.expect(page.locator("#kv-evidence")).to_contain_text(f"ledger #{n}", timeout=120_000)
    page.get_by_role("tab", name="Dashboard").click()
    stats = page.locator("#kv-stats")
    playwright.expect(stats).to_contain_text("tokens saved", timeout=30_000)
    playwright.expect(stats.locator(".kv-stat").nth(1)).not_to_have_text(re.compile(r"^\s*0\s*answers"), timeout=30_000)
    plot = page.locator("#kv-plot-tokens img")
    playwright.expect(plot).to_be_visible(timeout=30_000)
    playwright.expect(page.locator("#kv-plot-ttft img")).to_be_visible(timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)


def _library_accordion(page) -> None:
    page.get_by_role("tab", name="Library").click()
    page.get_by_text("Export / import / delete").click()
    playwright.expect(page.locator("#kv-library-token")).to_be_visible(timeout=30_000)


def test_admin_imports_a_bundle_through_the_browser_and_an_anonymous_upload_writes_nothing(served, browser, tmp_path):
    import services

    url, _real, library, upload_dir = served
    anonymous = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    anonymous.goto(url)
    playwright.expect(anonymous.locator("#kv-status")).to_contain_text("Built-in library ready", timeout=1_200_000)
    bundle = tmp_path / f"kvgraft-browser-{uuid.uuid4().hex[:8]}.tar"
    services.export_bundle(library, library.artifact_ids()[:1], bundle)
    listing = lambda: sorted(str(p) for p in upload_dir.rglob("*") if p.is_file())  # noqa: E731

    before = listing()
    _library_accordion(anonymous)  # no token given: no upload session
    with anonymous.expect_response(lambda r: "/gradio_api/upload" in r.url, timeout=60_000) as refused:
        anonymous.locator("#kv-import-file input[type=file]").set_input_files(str(bundle))
    assert refused.value.status == 403 and "Uploads need the admin" in refused.value.text()
    assert listing() == before  # nothing written
    anonymous.context.close()

    admin = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    admin.goto(url)
    _library_accordion(admin)
    token = admin.locator("#kv-library-token input")
    token.fill("t")
    token.press("Tab")  # leaving the box opens the upload session
    playwright.expect(admin.locator("#kv-upload-session")).to_contain_text(
        "Uploads allowed from this browser until", timeout=30_000
    )
    assert "kvgraft_upload" not in admin.evaluate("document.cookie")  # HttpOnly: no script on the page reads it
    with admin.expect_response(lambda r: "/gradio_api/upload" in r.url, timeout=60_000) as accepted:
        admin.locator("#kv-import-file input[type=file]").set_input_files(str(bundle))
    assert accepted.value.status == 200
    admin.get_by_role("button", name="Import", exact=True).click()
    playwright.expect(admin.locator("#kv-library-out")).to_contain_text("Imported 1 artifacts (0 new", timeout=300_000)
    assert not [p for p in listing() if p.endswith(bundle.name)]  # the import removed its upload
    SHOTS.mkdir(parents=True, exist_ok=True)
    admin.screenshot(path=str(SHOTS / "import.png"))
    admin.context.close()
