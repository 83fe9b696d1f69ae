"""The web app as the front end of a deployment (serving/remote.py, web/connecting.py), without Ray: `RemoteLibrary` against a
stdlib HTTP stub on loopback (request shapes, the admin header, error mapping, the connecting stage), and the
`from_json` inverses of the result types on real results of the tiny model. The Ray end-to-end test is in
tests/test_serving_ray.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import services
from errors import ArtifactNotFound, KvgraftError, VerificationFailed
from retrieval import HashEmbedder
from services import AnswerOptions
from serving.client import ADMIN_HEADER, BackendRefused, BackendUnavailable
from serving.remote import NotAvailable, RemoteLibrary
from web.connecting import RemoteStartup, connect

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "front-admin-token"
FACT = "The Quendel tower of Marrowby is 4242 metres tall and built from blue basalt."


def _normal(d) -> str:
    """JSON text as a client sees it (tuples become lists), keys sorted: equality of this is equality of the JSON."""
    return json.dumps(d, sort_keys=True, default=str)


class Stub:
    """A loopback HTTP server that records each request and answers from `routes[(method, path)]`:
    (status, JSON-able body) or (status, raw bytes); a list of them is served one per request."""

    def __init__(self):
        self.requests: list[dict] = []
        self.routes: dict[tuple[str, str], object] = {}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                stub.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
                route = stub.routes.get(
                    (self.command, self.path.split("?")[0]), (404, {"error": "ArtifactNotFound", "message": "no route"})
                )
                if isinstance(route, list):
                    route = route.pop(0) if len(route) > 1 else route[0]
                status, payload = route
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("X-Kvgraft-Replica", "stub-replica")
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


@pytest.fixture(scope="module")
def real(tiny_gemma, tmp_path_factory):
    """Real results of the tiny model: an answer with check and baseline, one without, a deposit, a verify."""
    from tests.conftest import accepting_judge

    lib = services.Library(home=tmp_path_factory.mktemp("remote-real"), lm=tiny_gemma, embedder=HashEmbedder())
    with pytest.MonkeyPatch.context() as mp:
        accepting_judge(mp)
        item = lib.deposit_item("How tall is the Quendel tower?", FACT, None, "exact", "4242", title="tower", admin=True)
    text = lib.deposit_text(FACT + " It has 12 floors.", title="floors")
    checked = lib.answer("How tall is the Quendel tower?", AnswerOptions(max_new_tokens=4, check=True, compare=True))
    plain = lib.answer("Who built the tower?", AnswerOptions(max_new_tokens=3, graft=False))
    report = lib.exactness_report(2, seed=0, decode_steps=2)
    return {"lib": lib, "item": item, "text": text, "checked": checked, "plain": plain, "verify": report}


def test_results_round_trip_through_their_json(real):
    """from_json is to_json's exact inverse on real results: every field, the check, proof and baseline."""
    checked, plain = real["checked"], real["plain"]
    assert checked.check is not None and checked.baseline is not None and checked.proof is not None
    for r in (checked, plain):
        wire = json.loads(_normal(r.to_json()))
        back = services.AnswerResult.from_json(wire)
        assert _normal(back.to_json()) == _normal(r.to_json())
        assert back.output_token_ids == r.output_token_ids and back.savings == r.savings
    back = services.AnswerResult.from_json(json.loads(_normal(checked.to_json())))
    from web.views import evidence_html, evidence_summary

    assert evidence_html(back) == evidence_html(checked) and evidence_summary(back) == evidence_summary(checked)
    assert back.check.exact is checked.check.exact and back.check.fresh_sha256 == checked.check.fresh_sha256
    assert back.ttft_speedup == checked.ttft_speedup and back.baseline.token_ids == checked.baseline.token_ids
    for d in (real["item"], real["text"]):
        assert services.Deposited.from_json(json.loads(_normal(d.to_json()))) == d
    rep = real["verify"]
    for every in (True, False):
        wire = json.loads(_normal(rep.to_json(every_field=every)))
        assert _normal(services.ExactnessReport.from_json(wire).to_json(every_field=every)) == _normal(wire)
    lib = real["lib"]
    for e in lib.entries():
        assert services.LibraryEntry.from_json(json.loads(_normal(e.to_json()))) == e
    shown = lib.show(real["item"].id)
    assert shown.verifications, "the gated item should carry its verification record"
    assert services.ShowReport.from_json(json.loads(_normal(shown.to_json()))) == shown


def test_requests_carry_the_right_shapes_and_the_admin_token_only_where_due(stub, real):
    stub.routes[("POST", "/answer")] = (200, json.loads(_normal(real["checked"].to_json())))
    stub.routes[("POST", "/deposit")] = (200, real["item"].to_json())
    stub.routes[("POST", "/verify")] = (200, json.loads(_normal(real["verify"].to_json(every_field=False))))
    stub.routes[("GET", "/library")] = (200, [e.to_json() for e in real["lib"].entries()])
    item_id = real["item"].id
    stub.routes[("GET", f"/library/{item_id[:12]}")] = (200, real["lib"].show(item_id).to_json())
    remote = RemoteLibrary(stub.url, admin_token=TOKEN, retries=0)

    got = remote.answer("How tall?", AnswerOptions(k=2, graft=True, max_new_tokens=4, check=True, compare=False), on_token=print)
    assert _normal(got.to_json()) == _normal(real["checked"].to_json())
    remote.deposit_item("Q?", "S.", "", "exact", "R", title="t", admin=True)
    remote.deposit_text("free text", title="x", admin=False)
    remote.exactness_report(3, relocate=None, seed=1, decode_steps=2, monolithic=False, max_tokens=64)  # anonymous bounds
    remote.exactness_report(7, relocate=5, seed=0)  # the app passes no bounds for an admin
    entries = remote.entries(query="tower & co", limit=5)
    shown = remote.show(item_id[:12])

    answer, item, text, anon_verify, admin_verify, listing, show = stub.requests
    assert answer["method"] == "POST" and answer["path"] == "/answer"
    assert answer["body"] == {  # the replica's fields (serving/replica.py reads `no_graft`)
        "question": "How tall?",
        "k": 2,
        "artifact": None,
        "no_graft": False,
        "max_new_tokens": 4,
        "raw": False,
        "check": True,
        "compare": False,
        "relocated": False,
        "compose": False,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": None,
        "stop": [],
    }
    assert item["body"] == {
        "question": "Q?", "solution": "S.", "answer": None, "verifier": "exact", "reference": "R", "parent": None, "title": "t",
    }  # fmt: skip
    assert text["body"] == {"text": "free text", "parent": None, "title": "x", "attested_by": None}
    assert anon_verify["body"] == {"samples": 3, "relocate": None, "seed": 1}
    assert admin_verify["body"] == {"samples": 7, "relocate": 5, "seed": 0}
    with_token = {r["path"] for r in stub.requests if r["headers"].get(ADMIN_HEADER) == TOKEN}
    without = [r for r in stub.requests if ADMIN_HEADER not in r["headers"]]
    assert [r["method"] + " " + r["path"] for r in stub.requests if r["headers"].get(ADMIN_HEADER) == TOKEN] == [
        "POST /answer",
        "POST /deposit",
        "POST /verify",
    ], with_token
    assert [r["body"] for r in without if r["path"] in ("/deposit", "/verify")] == [text["body"], anon_verify["body"]]
    assert listing["path"] == "/library?query=tower+%26+co&limit=5&offset=0"
    assert [e.row.id for e in entries] == [e.row.id for e in real["lib"].entries()]
    assert show["path"] == f"/library/{item_id[:12]}" and shown.artifact.id == item_id


def test_replica_errors_come_back_as_the_same_kvgraft_errors(stub):
    remote = RemoteLibrary(stub.url, admin_token=TOKEN, retries=0)
    stub.routes[("POST", "/deposit")] = (422, {"error": "VerificationFailed", "message": "the gate refused it: x != y"})
    with pytest.raises(VerificationFailed, match=r"^the gate refused it: x != y$"):
        remote.deposit_text("t", admin=True)
    stub.routes[("POST", "/deposit")] = (403, {"error": "Forbidden", "message": "deposits need the admin token"})
    with pytest.raises(BackendRefused) as e:
        remote.deposit_text("t")
    assert e.value.status == 403 and e.value.kind == "Forbidden" and str(e.value) == "deposits need the admin token"
    with pytest.raises(ArtifactNotFound, match="^no route$"):
        remote.show("abc")
    stub.routes[("POST", "/answer")] = (200, {"answer": "4", "tier": "exact"})  # a replica of another version
    with pytest.raises(KvgraftError) as e:
        remote.answer("q")
    assert str(e.value) == (
        "the deployment's reply to POST /answer is not what this app reads (KeyError: 'grafted_tokens'): "
        "run the same kvgraft version in the app and the replicas"
    )
    stub.routes[("POST", "/answer")] = (500, b"Internal Server Error")  # a replica lost under the request
    with pytest.raises(BackendUnavailable, match=r"POST /answer: no replica completed the request in 1 attempts \(HTTP 500"):
        remote.answer("q")


def test_what_has_no_route_says_what_to_use_instead(tmp_path):
    remote = RemoteLibrary("http://127.0.0.1:9", admin_token=TOKEN)
    where = "when the app fronts a deployment (KVGRAFT_BACKEND_URL=http://127.0.0.1:9)"
    with pytest.raises(NotAvailable) as e:
        remote.solve("q", "numeric", "4", budget=64, seed=0)
    assert str(e.value) == f"Solve and learn is not available {where}: use `kvgraft solve` on a machine with the store"
    with pytest.raises(NotAvailable, match="^Deleting an artifact .*use `kvgraft delete`"):
        remote.delete("abc")
    with pytest.raises(NotAvailable, match="^The dashboard is not available"):
        remote.stats()
    with pytest.raises(NotAvailable, match="^The dashboard is not available"):
        remote.flywheel()
    with pytest.raises(NotAvailable, match=r"^the store itself \(catalog, blobs\) is not available"):
        services.export_bundle(remote, ["a" * 64], tmp_path / "b.tar")
    assert not hasattr(remote, "__len__")  # dunder lookups stay AttributeError (copy, inspection)


def test_connecting_stage_shows_what_health_returned_until_healthy(stub):
    unhealthy = {"healthy": False, "problems": ["model not loaded: the replica is still starting"]}
    healthy = {"healthy": True, "problems": [], "replica": "r1", "store_artifacts": 3, "catalog_version": 9}
    stub.routes[("GET", "/health")] = [(503, unhealthy), (503, unhealthy), (200, healthy | {"model_fingerprint": "ab" * 32})]
    tracker, remote = RemoteStartup(), RemoteLibrary(stub.url)
    seen = []
    real_note = tracker.note
    tracker.note = lambda key, detail: (seen.append(detail), real_note(key, detail))
    assert not tracker.ready and [s.label for s in tracker.snapshot().stages] == ["connecting to the deployment"]
    connect(remote, tracker, poll_s=0.01)
    assert seen == ["poll 1: HTTP 503: model not loaded: the replica is still starting"] * 1 + [
        "poll 2: HTTP 503: model not loaded: the replica is still starting"
    ]
    snap = tracker.snapshot()
    assert snap.ready and snap.stages[0].detail.startswith("healthy: replica r1, 3 artifacts, catalog version 9, model abab")
    assert remote.count() == 3 and len(stub.requests) == 4
    stub.close()
    assert remote.count() == 3, "with nothing answering, the status line keeps the last count seen"


def test_front_end_app_builds_without_torch():
    """The page and the API (`server.build`) over a RemoteLibrary import neither torch nor transformers (nothing of the engine)."""
    code = (
        "import sys, server; from serving import remote; from web import connecting; "
        "lib = remote.RemoteLibrary('http://127.0.0.1:9'); server.build(lib, admin_token='t', startup=connecting.RemoteStartup()); "
        "print(sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_app_tabs_over_a_deployment_show_what_is_not_available(stub, real):
    """The app over a RemoteLibrary: answers come from the deployment; delete and export say what to use."""
    gradio_client = pytest.importorskip("gradio_client")
    from gradio_client.exceptions import AppError

    from web import app

    stub.routes[("GET", "/health")] = (200, {"healthy": True, "problems": [], "store_artifacts": 2})
    stub.routes[("POST", "/answer")] = (200, json.loads(_normal(real["plain"].to_json())))
    remote, tracker = RemoteLibrary(stub.url, admin_token=TOKEN, retries=0), RemoteStartup()
    connect(remote, tracker, poll_s=0.01)
    demo = app.build_app(remote, admin_token=TOKEN, startup=tracker)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        c = gradio_client.Client(demo.local_url, verbose=False)
        r = c.predict("Who built the tower?", max_new_tokens=3, api_name="/answer")
        assert r["output_sha256"] == real["plain"].output_sha256
        assert stub.requests[-1]["body"]["max_new_tokens"] == 3
        with pytest.raises(AppError, match=r"Deleting an artifact is not available .* use `kvgraft delete`"):
            c.predict(TOKEN, "abc", api_name="/delete")
        with pytest.raises(AppError, match=r"Exporting a bundle is not available .* use `kvgraft export`"):
            c.predict(TOKEN, "", api_name="/export")
    finally:
        demo.close()
