"""The upload door against the running app (raw HTTP on loopback, tiny model): an anonymous upload, on any route
that writes one and in any shape (declared, chunked, a second Content-Type), is refused before its body is read
and leaves the temp folders exactly as they were (measured: listing and bytes); a forged or expired session
cookie and a wrong token are refused; the admin's upload (header or session cookie) is kept and imports; past
the per-caller or the total budget or under the free-disk floor an upload is refused with its message, also
when it declares nothing and is cut off while it streams, its partial file removed; a file named by URL is
refused before Gradio would download it."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.served import attested_store, serve

httpx = pytest.importorskip("httpx")

from access import uploads  # noqa: E402
from access.guard import AdminToken, Guard  # noqa: E402

TOKEN = "upload-admin-token"
FACT = "The observatory of Quellmoor was founded by the astronomer Ines Varga in 1902."
BUDGET, TOTAL = 96 * 1024, 160 * 1024


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Gradio's upload folder and the process's temp folder (Gradio's component_server parser writes there)."""
    root = tmp_path_factory.mktemp("upload-folders")
    return root / "gradio", root / "tmp"


@pytest.fixture(scope="module")
def served(tiny_gemma, tmp_path_factory, folders):
    from web import app

    gradio_dir, tmp = folders
    tmp.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("GRADIO_TEMP_DIR", str(gradio_dir))
    mp.setattr(tempfile, "tempdir", str(tmp))
    library = attested_store(tmp_path_factory, tiny_gemma, "upload-home", FACT, "Quellmoor")
    guard = Guard(TOKEN, tokens=AdminToken(TOKEN, per_address=3, window_s=600))
    demo = app.build_app(library, admin_token=TOKEN, guard=guard)
    budget = uploads.UploadBudget(gradio_dir, per_caller=BUDGET, total=TOTAL, floor=0)
    demo.upload_door = uploads.UploadDoor(guard.tokens, budget=budget)
    serve(demo, max_file_size="1mb")
    try:
        yield demo, library, budget
    finally:
        demo.close()
        mp.undo()


def _listing(folders) -> dict[str, int]:
    """Every file under the watched folders, with its size: what the disk holds, measured."""
    return {str(p): p.stat().st_size for f in folders if f.exists() for p in f.rglob("*") if p.is_file()}


def _url(demo, path: str) -> str:
    return demo.local_url.rstrip("/") + path


def _multipart(name: str, data: bytes, boundary: str = "kvgraftboundary") -> tuple[bytes, bytes, str]:
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, data, f"\r\n--{boundary}--\r\n"


def _chunked(name: str, data: bytes, piece: int = 16 * 1024, pause_s: float = 0.0):
    """A multipart body sent with no Content-Length (Transfer-Encoding: chunked); with `pause_s` between its
    pieces, so that the server reads it in pieces and has written part of it when a bound cuts it off."""
    head, body, tail = _multipart(name, data)

    def gen():
        yield head
        for i in range(0, len(body), piece):
            time.sleep(pause_s)
            yield body[i : i + piece]
        yield tail.encode()

    return gen(), {"content-type": "multipart/form-data; boundary=kvgraftboundary"}


def _post(url: str, **kw):
    """POST; the answer, or the transport error a server that stopped reading may cause (then None)."""
    try:
        return httpx.post(url, timeout=30, **kw)
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        return None


def _admin_upload(demo, name: str, data: bytes, address: str = "10.9.0.1", **headers) -> httpx.Response:
    h = {"X-Forwarded-For": address, "X-Kvgraft-Admin-Token": TOKEN, **headers}
    return httpx.post(_url(demo, "/gradio_api/upload"), files={"files": (name, data)}, headers=h, timeout=30)


# ---- anonymous ---------------------------------------------------------------------------------------------


def test_anonymous_uploads_are_refused_on_every_route_and_write_nothing(served, folders):
    demo, _library, _budget = served
    before = _listing(folders)
    data = os.urandom(200 * 1024)
    attempts = []
    for route in ("/gradio_api/upload", "/gradio_api/component_server", "/gradio_api/process_recording"):
        attempts.append(_post(_url(demo, route), files={"files": ("x.tar", data)}, headers={"X-Forwarded-For": "10.9.1.1"}))
    body, headers = _chunked("chunked.tar", data)
    attempts.append(_post(_url(demo, "/gradio_api/upload"), content=body, headers={**headers, "X-Forwarded-For": "10.9.1.2"}))
    # a multipart body to a JSON route, and a second Content-Type after the multipart one (a dict keeps the last)
    head, raw, tail = _multipart("x.tar", data)
    two = [("content-type", "multipart/form-data; boundary=kvgraftboundary"), ("content-type", "application/json")]
    attempts.append(_post(_url(demo, "/gradio_api/queue/join"), content=head + raw + tail.encode(), headers=two))
    attempts.append(_post(_url(demo, "/gradio_api/upload"), content=b"{}", headers={"content-type": "application/json"}))
    for r in attempts:
        assert r is None or (r.status_code == 403 and r.json()["detail"] == uploads.ANONYMOUS), r and r.text
    assert sum(r is not None for r in attempts) >= 4  # the refusal, as the client read it (not only a closed socket)
    assert _listing(folders) == before  # nothing written, not a byte


def test_a_forged_or_expired_session_cookie_and_a_wrong_token_are_refused(served, folders):
    demo, _library, _budget = served
    door = demo.upload_door
    good, _until = door.sessions.issue()
    v, until, nonce, sig = good.split(".")
    flipped = sig[:-1] + ("A" if sig[-1] != "A" else "B")
    other = uploads.Sessions(TOKEN).issue()[0]  # another process's key (a restart): its cookies no longer open
    real_clock = door.sessions._clock
    door.sessions._clock = lambda: time.time() - uploads.SESSION_S - 60
    expired = door.sessions.issue()[0]
    door.sessions._clock = real_clock
    later = f"{v}.{int(until) + 3600}.{nonce}.{sig}"  # a longer life, signature kept
    before = _listing(folders)
    for n, cookie in enumerate((flipped, other, expired, later, "v1.9999999999.x.y", "", "garbage")):
        r = httpx.post(
            _url(demo, "/gradio_api/upload"),
            files={"files": ("a.tar", b"a" * 1000)},
            headers={"X-Forwarded-For": f"10.9.2.{n}", "Cookie": f"{uploads.COOKIE}={cookie}"},
            timeout=30,
        )
        assert r.status_code == 403 and r.json()["detail"] == uploads.ANONYMOUS, (cookie, r.text)
    r = _admin_upload(demo, "a.tar", b"a" * 1000, address="10.9.2.50", **{"X-Kvgraft-Admin-Token": "guess"})
    assert r.status_code == 401 and "Admin token refused" in r.json()["detail"]
    r = httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": "guess"}, headers={"X-Forwarded-For": "10.9.2.50"})
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert _listing(folders) == before
    # the good cookie opens; the two guesses above counted: a third locks the address out, the right token included
    r = httpx.post(
        _url(demo, "/gradio_api/upload"),
        files={"files": ("good.tar", b"g" * 1000)},
        headers={"X-Forwarded-For": "10.9.2.60", "Cookie": f"{uploads.COOKIE}={good}"},
        timeout=30,
    )
    assert r.status_code == 200 and Path(r.json()[0]).read_bytes() == b"g" * 1000
    Path(r.json()[0]).unlink()
    httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": "guess2"}, headers={"X-Forwarded-For": "10.9.2.50"})
    r = httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": TOKEN}, headers={"X-Forwarded-For": "10.9.2.50"})
    assert r.status_code == 401 and "Too many wrong admin tokens" in r.json()["detail"]


def test_the_session_route_sets_an_httponly_strict_cookie_and_an_empty_token_ends_it(served):
    demo, _library, _budget = served
    r = httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": TOKEN}, headers={"X-Forwarded-For": "10.9.3.1"})
    assert r.status_code == 200 and r.json()["detail"].startswith("Uploads allowed from this browser until")
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and f"Max-Age={uploads.SESSION_S}" in cookie
    assert demo.upload_door.sessions.valid(r.cookies[uploads.COOKIE])
    r = httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": ""}, headers={"X-Forwarded-For": "10.9.3.1"})
    assert r.status_code == 200 and "Max-Age=0" in r.headers["set-cookie"]
    assert httpx.get(_url(demo, uploads.SESSION_PATH)).status_code == 405


def test_no_admin_token_configured_refuses_every_upload(tmp_path):
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    gate = uploads.UploadGate(Starlette(), door=uploads.UploadDoor(AdminToken("")))
    with TestClient(gate) as c:
        r = c.post("/gradio_api/upload", files={"files": ("a", b"a")}, headers={"X-Kvgraft-Admin-Token": "anything"})
        assert r.status_code == 403 and r.json()["detail"] == uploads.NO_TOKEN
        r = c.post(uploads.SESSION_PATH, json={"token": "anything"})
        assert r.status_code == 403 and "no admin token is configured" in r.json()["detail"]
    assert uploads.UploadDoor(AdminToken("")).sessions.valid(uploads.Sessions("x").issue()[0]) is False


def test_a_file_named_by_url_is_refused_before_gradio_would_download_it(served, folders):
    demo, _library, _budget = served
    (index,) = [i for i, f in demo.fns.items() if f.name == "import_bundle"]
    ref = {"path": "https://example.com/huge.tar", "meta": {"_type": "gradio.FileData"}, "orig_name": "huge.tar"}
    before = _listing(folders)
    for data in ([TOKEN, ref], ["hi", [{"role": "user", "content": [ref]}]]):
        body = {"data": data, "fn_index": index, "session_hash": uuid.uuid4().hex, "event_data": None, "trigger_id": None}
        r = httpx.post(_url(demo, "/gradio_api/queue/join"), json=body, timeout=30)
        assert r.status_code == 400 and "A file given by URL (https://example.com/huge.tar) is not fetched" in r.json()["detail"]
    assert _listing(folders) == before


# ---- the admin ---------------------------------------------------------------------------------------------


def test_the_admin_imports_through_gradio_client_and_the_upload_is_removed(served, folders):
    gradio_client = pytest.importorskip("gradio_client")
    demo, library, _budget = served
    c = gradio_client.Client(
        demo.local_url, verbose=False, headers={"X-Forwarded-For": "10.9.4.1", "X-Kvgraft-Admin-Token": TOKEN}
    )
    path, _ = c.predict(TOKEN, library.artifact_ids()[0], api_name="/export")
    before = set(folders[0].rglob("*.tar"))
    msg, _table = c.predict(TOKEN, gradio_client.handle_file(path), api_name="/import")
    assert msg.startswith("Imported 1 artifacts (0 new")
    assert set(folders[0].rglob("*.tar")) - before == set()  # the upload is gone after the import
    anonymous = gradio_client.Client(demo.local_url, verbose=False, headers={"X-Forwarded-For": "10.9.4.2"})
    with pytest.raises(httpx.HTTPStatusError, match="403"):
        anonymous.predict(TOKEN, gradio_client.handle_file(path), api_name="/import")


def _kept(r: httpx.Response) -> Path:
    assert r.status_code == 200, r.text
    return Path(r.json()[0])


def test_the_per_caller_budget_refuses_with_its_message_declared_or_streamed(served, folders):
    demo, _library, budget = served
    first = _kept(_admin_upload(demo, "one.bin", os.urandom(60 * 1024), address="10.9.5.1"))
    assert budget.held("10.9.5.1") == 60 * 1024
    before = _listing(folders)
    r = _admin_upload(demo, "two.bin", os.urandom(60 * 1024), address="10.9.5.1")  # declared: refused before reading
    assert r.status_code == 413 and r.json()["detail"] == uploads.CALLER_BUDGET.format(limit=uploads.mb(BUDGET))
    for address, size in (("10.9.5.1", 60 * 1024), ("10.9.5.3", 300 * 1024)):  # declares nothing: cut off as it streams
        body, headers = _chunked("two.bin", os.urandom(size), pause_s=0.05)  # 10.9.5.3: ~96 KiB written, then cut
        r = _post(
            _url(demo, "/gradio_api/upload"),
            content=body,
            headers={**headers, "X-Forwarded-For": address, "X-Kvgraft-Admin-Token": TOKEN},
        )
        assert r is None or (
            r.status_code == 413 and r.json()["detail"] == uploads.CALLER_BUDGET.format(limit=uploads.mb(BUDGET))
        )
        assert _listing(folders) == before  # the partial file removed
    assert _kept(_admin_upload(demo, "small.bin", b"s" * 1024, address="10.9.5.2"))  # another caller is not held back
    first.unlink()  # as an import does: the caller's bytes are free again
    assert budget.held("10.9.5.1") == 0
    assert _kept(_admin_upload(demo, "three.bin", os.urandom(60 * 1024), address="10.9.5.1")).stat().st_size == 60 * 1024


def test_the_total_budget_refuses_with_its_message(served, folders):
    demo, _library, budget = served
    for p in list(folders[0].rglob("*")):  # start from an empty upload folder
        if p.is_file():
            p.unlink()
    kept = [_kept(_admin_upload(demo, f"t{i}.bin", os.urandom(70 * 1024), address=f"10.9.6.{i}")) for i in range(2)]
    before = _listing(folders)
    body, headers = _chunked("t2.bin", os.urandom(70 * 1024), pause_s=0.05)
    r = _post(
        _url(demo, "/gradio_api/upload"),
        content=body,
        headers={**headers, "X-Forwarded-For": "10.9.6.9", "X-Kvgraft-Admin-Token": TOKEN},
    )
    assert r is None or (r.status_code == 413 and r.json()["detail"] == uploads.TOTAL_BUDGET.format(limit=uploads.mb(TOTAL)))
    assert _listing(folders) == before
    for p in kept:
        p.unlink()


def test_the_free_disk_floor_refuses_declared_and_streamed(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_UPLOAD_FREE_FLOOR", "1000tb")  # more than any disk has: every upload refused
    budget = uploads.UploadBudget.from_settings(tmp_path)
    assert (budget.per_caller, budget.total, budget.floor) == (2**30, 2 * 2**30, 1000 * 2**40)
    with pytest.raises(uploads.OverBudget) as exc:
        budget.begin("a", 10)
    assert exc.value.status == 507 and exc.value.message == uploads.DISK_FLOOR.format(limit="1,048,576,000 MiB")
    free = [10 * 2**20]
    low = uploads.UploadBudget(tmp_path, per_caller=2**40, total=2**40, floor=8 * 2**20, disk_free=lambda p: free[0])
    t = low.begin("a")  # declares nothing: 10 MiB free, 8 MiB kept
    low.add(t, uploads.FLOOR_EVERY - 1)
    free[0] -= uploads.FLOOR_EVERY  # the disk fills (this upload and anything else)
    with pytest.raises(uploads.OverBudget, match="would have less than 8 MiB free"):
        low.add(t, 1)  # the next look at the disk, FLOOR_EVERY bytes in
    low.end(t)


def test_the_floor_over_http(tiny_gemma, tmp_path, monkeypatch):
    from web import app

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    monkeypatch.setenv("KVGRAFT_UPLOAD_FREE_FLOOR", "1000tb")
    from retrieval import HashEmbedder
    from services import Library

    guard = Guard(TOKEN)

    demo = app.build_app(Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder()), admin_token=TOKEN, guard=guard)
    serve(demo)
    try:
        before = _listing([tmp_path / "gradio"])
        r = _admin_upload(demo, "f.bin", b"f" * 4096)
        assert r.status_code == 507 and "KVGRAFT_UPLOAD_FREE_FLOOR" in r.json()["detail"]
        assert _listing([tmp_path / "gradio"]) == before
    finally:
        demo.close()


def test_sessions_unit():
    now = [1000.0]
    s = uploads.Sessions("t", ttl_s=60, clock=lambda: now[0])
    value, until = s.issue()
    assert until == 1060 and s.valid(value)
    now[0] = 1059.9
    assert s.valid(value)
    now[0] = 1060.0
    assert not s.valid(value)  # expired
    assert not uploads.Sessions("").valid(value)  # no token: no session
    now[0] = 1000.0
    v, exp, nonce, sig = value.split(".")
    assert not s.valid(f"{v}.{int(exp) + 30}.{nonce}.{sig}")  # a signature covers the expiry
    assert not s.valid(f"{v}.{exp}.{nonce}x.{sig}") and not s.valid(value + "x")
    assert not s.valid(f"{v}.\u00b2.{nonce}.{sig}") and not s.valid("v1.1.2.3.4")  # odd digits, odd shapes: False


def test_the_rate_limiter_counts_uploads_and_session_attempts(tiny_gemma, tmp_path, monkeypatch):
    """At one request a second (a burst of 2) per address, an address's third upload in a row is answered 429
    (the admin's too), and so is its third session attempt; another address is not held back."""
    from access.limiter import RATE_REFUSAL
    from retrieval import HashEmbedder
    from services import Library
    from web import app

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    demo = app.build_app(Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder()), admin_token=TOKEN)
    serve(demo, joins=(1.0, 2))
    try:
        codes = [_admin_upload(demo, f"r{i}.bin", b"r" * 100, address="10.9.7.1").status_code for i in range(3)]
        assert codes[:2] == [200, 200] and codes[2] == 429
        anonymous = [
            httpx.post(_url(demo, "/gradio_api/upload"), files={"files": ("a", b"a")}, headers={"X-Forwarded-For": "10.9.7.2"})
            for _ in range(3)
        ]
        assert [r.status_code for r in anonymous] == [403, 403, 429]
        assert anonymous[2].json()["detail"].startswith(RATE_REFUSAL.split("{")[0])
        sessions = [
            httpx.post(_url(demo, uploads.SESSION_PATH), json={"token": TOKEN}, headers={"X-Forwarded-For": "10.9.7.3"})
            for _ in range(3)
        ]
        assert [r.status_code for r in sessions] == [200, 200, 429]
        assert _admin_upload(demo, "other.bin", b"o" * 100, address="10.9.7.4").status_code == 200
    finally:
        demo.close()


def test_the_uploads_attack_writes_nothing_and_the_user_sees_no_error(tiny_gemma, tmp_path, monkeypatch):
    """bench.abuse's uploads attack on the tiny model (seconds, not figures: the p95 ratio is the bench's to
    report): every anonymous upload of 8 sessions of one address is refused, the temp folders' bytes do not grow,
    and the chatting user sees no error."""
    from bench import abuse
    from retrieval import HashEmbedder
    from services import Library
    from web import app

    watch = (tmp_path / "gradio", tmp_path / "tmp")
    for folder in watch:
        folder.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(watch[0]))
    monkeypatch.setattr(tempfile, "tempdir", str(watch[1]))
    lib = Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    abuse.seed_tiny(lib)
    demo = app.build_app(lib, admin_token=TOKEN, guard=Guard(TOKEN))
    serve(demo, joins=(4.0, 8))  # the app's default rate: uploads are counted by it
    try:
        rep = abuse.run(demo.local_url, chats=6, attackers=8, watch=watch, deadline_s=300, attack="uploads")
    finally:
        demo.close()
    assert rep.user_errors == () and rep.attacker_errors == ()
    assert rep.attacker_calls >= 8 and rep.attacker_refusals == rep.attacker_calls
    assert rep.temp_bytes == (0, 0) and rep.bytes_written == 0 and rep.outside_files == ()
