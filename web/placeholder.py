"""The page before the page: while `python app.py` imports Gradio (~5 s) a tiny stdlib HTTP server answers on
the app's own host and port with a self-contained "kvgraft is starting" page and a JSON status, then steps
aside so Gradio can bind the same port; the page reloads itself into the app once the app answers.

Standard library and the ground floor only (no Gradio, no engine): it must be importable and serving in a fraction of a second.
It knows the boot stages of the web process, not the engine's start-up stages (`startup` owns those).
"""

from __future__ import annotations

import html
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import settings

STATUS_PATH = "/kvgraft-boot-status"
SLOW_IMPORT_ENV = "KVGRAFT_TEST_SLOW_IMPORT_S"  # test-only: hold the "loading the web framework" stage this long
STAGES = ("loading the web framework", "building the page", "handing over to the app")
RETRY_AFTER_S = 2
_REQUEST_TIMEOUT_S = 5.0  # a client that sends nothing holds its thread at most this long

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvgraft is starting</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="3"></noscript>
<style>
body{{font-family:system-ui,sans-serif;margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;
background:#f7f7f8;color:#1f2328}}
main{{max-width:34rem;padding:2rem;background:#fff;border:1px solid #d0d7de;border-radius:8px}}
h1{{font-size:1.3rem;margin:0 0 .8rem}} progress{{width:100%;margin:.6rem 0}} p{{margin:.4rem 0}}
.small{{color:#59636e;font-size:.9rem}}
</style></head><body><main>
<h1>kvgraft is starting</h1>
<p id="kv-boot-stage">{stage_line}</p>
<progress id="kv-boot-bar"></progress>
<p class="small">This page reloads itself into the app as soon as the app answers. The app's own page then shows
each start-up stage of the model (converting, loading, seeding the built-in library, building the index) with
its progress.</p>
</main>
<script>
const STAGES = {stages};
const line = document.getElementById("kv-boot-stage");
function show(s) {{
  const i = STAGES.indexOf(s.stage) + 1;
  line.textContent = "Stage: " + s.stage + " (step " + i + " of " + STAGES.length + "), "
    + s.elapsed_s.toFixed(1) + " s since the start";
}}
async function tick() {{
  try {{
    const r = await fetch("{status}", {{cache: "no-store"}});
    const kind = r.headers.get("content-type") || "";
    if (r.ok && kind.startsWith("application/json")) {{
      const s = await r.json();
      if (s.starting) {{ show(s); return; }}
    }}
    const app = await fetch("config", {{cache: "no-store"}});  // the placeholder answers 503 here; the app 200
    if (app.ok) {{ line.textContent = "The app answers: opening it..."; location.reload(); }}
  }} catch (e) {{
    line.textContent = "Stage: " + STAGES[STAGES.length - 1] + " (the app is taking over the port)";
  }}
}}
setInterval(tick, 1000);
</script></body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    """GET/HEAD of the page and the status; 503 + Retry-After for any other path; 405 for any other method.
    Request bodies are never read (the stdlib already bounds the request line and the headers)."""

    server: _Server
    timeout = _REQUEST_TIMEOUT_S
    server_version = "kvgraft-boot"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # every other method, known or not
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED, b"Only GET and HEAD while kvgraft starts.\n", "text/plain", False, Allow="GET, HEAD"
        )

    def _answer(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        status = self.server.placeholder.status()
        if path == "/":
            body = self.server.placeholder.page(status).encode()
            self._send(HTTPStatus.OK, body, "text/html; charset=utf-8", head)
        elif path == STATUS_PATH:
            self._send(HTTPStatus.OK, json.dumps(status).encode(), "application/json", head)
        else:
            text = f"kvgraft is starting ({status['stage']}); try again in a few seconds.\n".encode()
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE, text, "text/plain; charset=utf-8", head, **{"Retry-After": str(RETRY_AFTER_S)}
            )

    def _send(self, code: HTTPStatus, body: bytes, kind: str, head: bool, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # the reload must reach the app, not a cached placeholder
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the stdlib's name)
        pass  # quiet: the terminal is for the URL and the start-up bars


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # the app binds the same port right after (sockets in TIME_WAIT must not block it)
    placeholder: Placeholder


class Placeholder:
    """The placeholder server on (host, port): `start()` binds (OSError if it cannot) and serves in a daemon
    thread, `stage()` says what the process is doing, `stop()` frees the port for the app."""

    def __init__(self, host: str, port: int, t0: float | None = None, clock: Callable[[], float] = time.perf_counter):
        self.host, self.port, self.clock = host, port, clock
        self.t0 = clock() if t0 is None else t0
        self._stage = STAGES[0]
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "start() the placeholder first"
        return self._server.server_address[:2]

    def status(self) -> dict:
        return {"starting": True, "stage": self._stage, "elapsed_s": round(self.clock() - self.t0, 1), "stages": list(STAGES)}

    def page(self, status: dict) -> str:
        step = STAGES.index(status["stage"]) + 1
        line = f"Stage: {status['stage']} (step {step} of {len(STAGES)}), {status['elapsed_s']:.1f} s since the start"
        return _PAGE.format(stage_line=html.escape(line), stages=json.dumps(list(STAGES)), status=STATUS_PATH.lstrip("/"))

    def stage(self, label: str) -> None:
        assert label in STAGES, f"unknown boot stage {label!r}; one of {STAGES}"
        self._stage = label

    def start(self) -> Placeholder:
        server_class = _Server
        if ":" in self.host:
            server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._server = server_class((self.host, self.port), _Handler)
        self._server.placeholder = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (requests in flight finish on their own threads)."""
        if self._server is None:
            return
        self.stage(STAGES[-1])
        self._server.shutdown()
        self._server.server_close()
        self._server = None


class _NotServing:
    """What `app.main()` holds when the app was imported rather than run: every call does nothing."""

    def stage(self, label: str) -> None:
        pass

    def stop(self) -> None:
        pass


NOT_SERVING = _NotServing()


def url_line(where) -> str:
    """The first line `python app.py` prints: where to point the browser."""
    return f"kvgraft: {where.url}  (bound to {where.host}:{where.port}; the page comes first, the model loads behind it)"


def _cannot_bind(where, exc: OSError) -> SystemExit:
    return SystemExit(
        f"kvgraft: cannot serve on {where.host}:{where.port} ({exc.strerror or exc}). Another program, perhaps another "
        f"kvgraft, is using that port: stop it, or start with GRADIO_SERVER_PORT set to a free port."
    )


def serve_while_starting(t0: float, environ: dict | None = None) -> Placeholder:
    """For `python app.py`, before Gradio is imported: print the URL, serve the placeholder on the app's host
    and port (SystemExit with what to do if the port is taken)."""
    from web import hosting  # stdlib-only settings, light

    env = os.environ if environ is None else environ
    where = hosting.detect(env)
    print(url_line(where), flush=True)
    try:
        placeholder = Placeholder(where.host, where.port, t0=t0).start()
    except OSError as exc:
        raise _cannot_bind(where, exc) from exc
    print(f"kvgraft: a placeholder page answers there after {time.perf_counter() - t0:.1f} s; {STAGES[0]}...", flush=True)
    slow = settings.get(SLOW_IMPORT_ENV, env)
    if slow > 0:  # test-only hook: a web-framework import that takes `slow` seconds
        time.sleep(slow)
    return placeholder


def hand_over(placeholder: Placeholder | _NotServing, where, launch: Callable[[], object]) -> None:
    """Free the port and start the app on it; if the app cannot bind, say so and exit non-zero."""
    placeholder.stop()
    try:
        launch()
    except OSError as exc:
        raise _cannot_bind(where, exc) from exc
