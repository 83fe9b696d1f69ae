"""The placeholder page: what `python app.py` serves during Gradio's import. Its page and status,
the refusals (405 for non-GET, 503 + Retry-After for any other path, bodies never read), the handover of
the port to the app, the exit when the port is taken, and its imports (standard library only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from web import hosting
from web import placeholder as boot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def placeholder():
    clock = iter(range(100, 10_000)).__next__  # one second per reading
    p = boot.Placeholder("127.0.0.1", 0, t0=90.0, clock=clock).start()
    host, port = p.address
    yield p, f"http://{host}:{port}"
    p.stop()


def _get(url: str, method: str = "GET") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_page_says_kvgraft_is_starting_with_the_stage_and_the_time(placeholder):
    p, url = placeholder
    code, headers, body = _get(url + "/")
    page = body.decode()
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Cache-Control"] == "no-store"  # the reload must reach the app, not this page from a cache
    assert "<h1>kvgraft is starting</h1>" in page
    assert "Stage: loading the web framework (step 1 of 3), 1" in page  # 10x.0 s since t0=90
    assert "http://" not in page and "https://" not in page  # self-contained: no external assets
    assert 'fetch("kvgraft-boot-status"' in page and 'fetch("config"' in page  # relative: works under a Space's proxy
    p.stage("building the page")
    assert "Stage: building the page (step 2 of 3)" in _get(url + "/?x=1")[2].decode()


def test_the_status_is_json_with_the_stage_and_the_elapsed_seconds(placeholder):
    p, url = placeholder
    code, headers, body = _get(url + boot.STATUS_PATH)
    first = json.loads(body)
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert first["starting"] is True and first["stage"] == "loading the web framework"
    p.stage("building the page")
    second = json.loads(_get(url + boot.STATUS_PATH)[2])
    assert second["stage"] == "building the page" and second["elapsed_s"] > first["elapsed_s"]
    with pytest.raises(AssertionError, match="unknown boot stage"):
        p.stage("loading the model")


def test_other_paths_get_503_with_retry_after_and_head_gets_no_body(placeholder):
    _, url = placeholder
    for path in ("/config", "/gradio_api/info", "/index.html"):
        code, headers, body = _get(url + path)
        assert code == 503, path
        assert headers["Retry-After"] == str(boot.RETRY_AFTER_S)
        assert body == b"kvgraft is starting (loading the web framework); try again in a few seconds.\n"
    code, headers, body = _get(url + "/", method="HEAD")
    assert code == 200 and body == b"" and int(headers["Content-Length"]) > 500


def test_only_get_and_head_are_allowed_and_bodies_are_never_read(placeholder):
    _, url = placeholder
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "BREW"):
        code, headers, body = _get(url + "/", method=method)
        assert code == 405, method
        assert headers["Allow"] == "GET, HEAD" and body == b"Only GET and HEAD while kvgraft starts.\n"
    host, port = placeholder[0].address
    with socket.create_connection((host, port), timeout=10) as s:  # announces 1 GB and sends none of it
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        t = time.monotonic()
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.0 405 ") and time.monotonic() - t < 3  # answered at once, not after a read


class _Plain(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"app")

    def log_message(self, *args):
        pass


def test_the_port_is_free_for_the_app_the_moment_the_placeholder_stops():
    """The handover: pages were served (their connections are closed by the server, so in TIME_WAIT), the
    placeholder stops, and a server binding the same port at once (SO_REUSEADDR, as Gradio's uvicorn does) gets it."""
    p = boot.Placeholder("127.0.0.1", 0).start()
    host, port = p.address
    for _ in range(3):
        assert _get(f"http://{host}:{port}/")[0] == 200
    p.stop()
    assert json.loads(json.dumps(p.status()))["stage"] == "handing over to the app"
    app = ThreadingHTTPServer((host, port), _Plain)  # raises "Address already in use" if the port were held
    try:
        threading.Thread(target=app.serve_forever, daemon=True).start()
        code, _, body = _get(f"http://{host}:{port}/")
        assert (code, body) == (200, b"app")
    finally:
        app.shutdown()
        app.server_close()


def test_a_taken_port_exits_at_once_saying_what_to_do(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
        with pytest.raises(SystemExit) as exit_:
            boot.serve_while_starting(time.perf_counter(), environ=env)
        assert str(exit_.value.code) == (
            f"kvgraft: cannot serve on 127.0.0.1:{port} (Address already in use). Another program, perhaps another "
            "kvgraft, is using that port: stop it, or start with GRADIO_SERVER_PORT set to a free port."
        )
        assert (
            capsys.readouterr().out
            == f"kvgraft: http://127.0.0.1:{port}  (bound to 127.0.0.1:{port}; the page comes first, the model loads behind it)\n"
        )


def test_the_handover_frees_the_port_before_launching_and_a_failed_launch_exits_non_zero():
    p = boot.Placeholder("127.0.0.1", 0).start()
    host, port = p.address
    where = hosting.detect({"GRADIO_SERVER_NAME": host, "GRADIO_SERVER_PORT": str(port)})
    bound = []

    def launch():  # the app binds the very port the placeholder held
        app = ThreadingHTTPServer((host, port), _Plain)
        bound.append(app.server_address)
        app.server_close()

    boot.hand_over(p, where, launch)
    assert bound == [(host, port)]

    def refused():
        raise OSError("Cannot find empty port in range: 7860-7860.")

    with pytest.raises(SystemExit) as exit_:
        boot.hand_over(boot.NOT_SERVING, where, refused)
    assert str(exit_.value.code).startswith(f"kvgraft: cannot serve on {host}:{port} (Cannot find empty port in range")


def test_serving_the_placeholder_prints_the_url_first_and_imports_only_the_standard_library(tmp_path):
    """`python app.py` runs this before Gradio's import, so nothing heavy may load with it."""
    code = (
        "import sys, time; before = set(sys.modules); from web import placeholder as boot; p = boot.serve_while_starting(time.perf_counter()); "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names)); p.stop()"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), **{boot.SLOW_IMPORT_ENV: "0.5"})
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"kvgraft: http://127.0.0.1:{port}  (bound to 127.0.0.1:{port}")
    assert lines[1].startswith("kvgraft: a placeholder page answers there after ")
    assert lines[2] == "['errors', 'settings', 'web', 'web.hosting', 'web.placeholder']"  # the ground floor is stdlib-only
    assert time.monotonic() - t >= 0.5  # the test hook held the first stage


def test_first_page_tells_the_placeholder_from_the_app_and_from_nobody(placeholder):
    """scripts/first_page reports two numbers (first HTTP 200, the app's page): it must tell them apart."""
    from scripts.first_page import _page

    p, url = placeholder
    assert _page(url + "/") == "placeholder"
    host, port = p.address
    p.stop()
    assert _page(url + "/") is None  # connection refused: the gap of the handover
    app = ThreadingHTTPServer((host, port), _Plain)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    try:
        assert _page(url + "/") == "app"
    finally:
        app.shutdown()
        app.server_close()


def test_on_a_space_the_placeholder_binds_every_interface_as_the_app_will(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"SYSTEM": "spaces", "SPACE_ID": "someone/kvgraft", "GRADIO_SERVER_PORT": str(port)}  # the port: the test's
    p = boot.serve_while_starting(time.perf_counter(), environ=env)
    try:
        assert p.address == ("0.0.0.0", port)  # hosting.detect's Space default, as Gradio will bind
        assert _get(f"http://127.0.0.1:{port}/")[0] == 200
    finally:
        p.stop()
    assert capsys.readouterr().out.startswith(f"kvgraft: http://127.0.0.1:{port}  (bound to 0.0.0.0:{port};")
