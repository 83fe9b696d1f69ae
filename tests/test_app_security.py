"""The security findings at the web-app level, against the running app (gradio_client and raw HTTP on loopback):
who may do what, the bounds of each anonymous call, failed-token lockout, one request at a time per
session, a flood that cannot fill the queue, exports that stream and expire, bounded and cleaned
uploads, and the load test (8 anonymous clients of one host against one chatting user, tiny model).
The server trusts X-Forwarded-For from 127.0.0.1 here (KVGRAFT_TRUST_PROXY=127.0.0.1, as behind a proxy on
loopback) so that each test speaks from its own address."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.served import attested_store, serve

gradio_client = pytest.importorskip("gradio_client")
import httpx  # noqa: E402
from gradio_client.exceptions import AppError, ValidationError  # noqa: E402

from access.guard import AdminToken, Client, FairTurns, Guard, Refused, backend_slots  # noqa: E402
from errors import InvalidSetting  # noqa: E402

TOKEN = "sec-admin-token"
FACT = "The lighthouse of Varnek Isle was built by the engineer Talia Brennic in 1871."


@pytest.fixture(scope="module")
def library(tiny_gemma, tmp_path_factory):
    return attested_store(tmp_path_factory, tiny_gemma, "sec-home", FACT, "Varnek")


@pytest.fixture(scope="module")
def guard():
    return Guard(TOKEN, tokens=AdminToken(TOKEN, per_address=3, window_s=600), turns=FairTurns(depth=8))


@pytest.fixture(scope="module")
def served(library, guard):
    from web import app

    demo = app.build_app(library, admin_token=TOKEN, guard=guard)
    serve(demo, max_file_size="64kb")
    try:
        yield demo
    finally:
        demo.close()


def _client(demo, address: str):
    return gradio_client.Client(demo.local_url, verbose=False, headers={"X-Forwarded-For": address})


def _fn_index(demo, name: str) -> int:
    (index,) = [i for i, f in demo.fns.items() if f.name == name]
    return index


def _raw_call(demo, name: str, data: list, address: str) -> dict:
    """Run handler `name` by fn_index through /gradio_api/queue/join, as a caller who ignores the API docs."""
    return _raw_call_index(demo, _fn_index(demo, name), data, address)


def _raw_call_index(demo, fn_index: int, data: list, address: str) -> dict:
    session = uuid.uuid4().hex
    headers = {"X-Forwarded-For": address}
    base = demo.local_url.rstrip("/") + "/gradio_api"
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    r = httpx.post(f"{base}/queue/join", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": session}, headers=headers, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    return msg
    raise AssertionError("no process_completed message")


# ---- authority -------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["", "wrong"])
def test_anonymous_may_not_export_import_delete_or_deposit(served, library, token):
    ref = library.artifact_ids()[0]
    calls = [
        ((token, ""), "/export"),  # the whole store, as the security review found it
        ((token, ref), "/export"),
        ((token, ref), "/delete"),
        ((token, None), "/import"),
        ((token, "q?", "s", "a", "exact", "a"), "/deposit"),
    ]
    for i, (args, api) in enumerate(calls):
        with pytest.raises(AppError, match="Admin token refused"):
            _client(served, f"10.0.1.{10 * len(token) + i}").predict(*args, api_name=api)
    assert library.artifact_ids() == [ref]  # nothing deleted


def test_private_handlers_check_their_own_authority_by_fn_index(served):
    """api_visibility='private' hides the UI's handlers from the docs only; each refuses on its own."""
    msg = _raw_call(served, "verify_ui", [1000, False, 0], "10.0.2.1")
    assert not msg["success"] and "Value 1000 is greater than maximum value 5." in msg["output"]["error"]  # the slider
    msg = _raw_call(served, "verify_ui", [5, True, 2**63], "10.0.2.1")  # a Number without a maximum: the handler
    assert (
        not msg["success"]
        and "relocate offset must be between 0 and 511, got 9,223,372,036,854,775,808" in msg["output"]["error"]
    )
    msg = _raw_call(served, "deposit_ui", ["", "free text", "", "", "", "exact", "", FACT + " again", "t", ""], "10.0.2.2")
    assert not msg["success"] and "Admin token refused" in msg["output"]["error"]
    msg = _raw_call(served, "export_bundle", ["", ""], "10.0.2.3")
    assert not msg["success"] and "Admin token refused" in msg["output"]["error"]


def test_failed_tokens_lock_the_address_out(served, library):
    c = _client(served, "10.0.3.1")
    for _ in range(3):
        with pytest.raises(AppError, match="Admin token refused"):
            c.predict("guess", "", api_name="/export")
    with pytest.raises(AppError, match="Too many wrong admin tokens from your address; admin actions from it are locked for"):
        c.predict(TOKEN, "", api_name="/export")  # even the right token, from there
    path, message = _client(served, "10.0.3.2").predict(TOKEN, "", api_name="/export")  # another address is not locked
    assert message.startswith(f"Exported {library.count()} artifacts")


def test_gate_window_and_no_token():
    now = [0.0]
    gate = AdminToken("t", per_address=2, window_s=10, clock=lambda: now[0])
    a, b, c = Client("s1", "a"), Client("s2", "b"), Client("s3", "c")
    for who in (a, b, b):
        with pytest.raises(Refused, match="Admin token refused"):
            gate.check("x", who)
        now[0] += 6.0
    gate.check("t", a)  # its one failure is out of the window
    with pytest.raises(Refused, match="locked for 294 s"):
        gate.check("t", b)  # two within the window: locked
    gate.check("t", c)  # nobody else is
    assert gate.is_admin("", a) is False and gate.is_admin(None, a) is False  # no token: anonymous, not a guess
    for _ in range(5):
        with pytest.raises(Refused, match="Admin token refused"):
            gate.check("", a)  # nor for an admin action: it counts nothing
    gate.check("t", a)
    with pytest.raises(Refused, match="Admin actions are disabled: no admin token is configured"):
        AdminToken("").check("anything", a)


# ---- bounds -----------------------------------------------------------------------------------------


def test_verify_bounds(served):
    c = _client(served, "10.0.4.1")
    rep = c.predict(5, None, api_name="/verify")
    assert rep["samples"] == 5 and rep["byte_equal"] == 5
    with pytest.raises(AppError, match=r"samples must be between 1 and 5, got 6 \(more with the admin token\)"):
        c.predict(6, None, api_name="/verify")
    assert c.predict(8, None, TOKEN, api_name="/verify")["samples"] == 8
    with pytest.raises(AppError, match="samples must be between 1 and 1,000, got 1,001"):
        c.predict(1001, None, TOKEN, api_name="/verify")
    with pytest.raises(AppError, match="relocate offset must be between 0 and 511, got 9,223,372,036,854,775,808"):
        c.predict(1, 2**63, api_name="/verify")
    assert c.predict(1, 511, api_name="/verify")["relocate"] == 511  # the context's last position: a clean run
    for bad in ("-0", " 1_0 ", "1e3", "0x10", True):
        with pytest.raises(AppError, match="must be a whole number between"):
            c.predict(bad, None, api_name="/verify")


def test_anonymous_answer_is_bounded_and_check_or_compare_need_the_token(served):
    """Anonymous: the cheap probe proof only; the full check and the no-graft comparison (each a recomputation
    of the whole context) are refused with what to do, and run with the admin token."""
    c, q = _client(served, "10.0.5.1"), "Who built the lighthouse of Varnek Isle?"
    r = c.predict(q, api_name="/answer")
    assert r["check"] is None and r["baseline"] is None and r["proof"]["passed"] is True
    for check, compare, what in ((True, False, "check"), (False, True, "compare"), (True, True, "check and compare")):
        with pytest.raises(AppError, match=f"{what} needs the admin token: it recomputes the whole"):
            c.predict(q, 3, True, 4, check, compare, api_name="/answer")
    r = c.predict(q, 3, True, 4, True, True, TOKEN, api_name="/answer")
    assert r["check"]["exact"] is True and r["check"]["fresh_sha256"] == r["check"]["grafted_sha256"]
    assert r["baseline"]["measured"] is True and r["baseline"]["prefill_tokens"] > r["computed_tokens"]
    with pytest.raises(AppError, match="max_new_tokens must be between 1 and 32, got 33; larger answers need the admin token"):
        c.predict("Who?", 3, True, 33, api_name="/answer")
    with pytest.raises(AppError, match="k must be between 1 and 16, got 17"):
        c.predict("Who?", 17, api_name="/answer")
    r = c.predict("Who?", 3, True, 40, False, False, TOKEN, api_name="/answer")
    assert r["decode_tokens"] <= 40


def _text(message: dict) -> str:
    c = message["content"]
    return c if isinstance(c, str) else "".join(p.get("text", "") for p in c if isinstance(p, dict))


def test_chat_check_needs_the_token_also_by_fn_index(served, library):
    q = "Who built the lighthouse of Varnek Isle?"
    before = len(library.ledger())
    history, _evidence, _box = _client(served, "10.0.5.2").predict(q, [], True, 3, 8, True, False, "", api_name="/chat")
    assert "check needs the admin token" in _text(history[-1]) and len(library.ledger()) == before  # nothing ran
    for index in [i for i, f in served.fns.items() if f.name == "chat"]:  # the Enter key's and the button's
        msg = _raw_call_index(served, index, [q, [], True, 3, 8, False, True, ""], "10.0.5.3")
        assert "compare needs the admin token" in json.dumps(msg["output"]["data"][0])
    assert len(library.ledger()) == before
    history, evidence, _box = _client(served, "10.0.5.4").predict(q, [], True, 3, 8, True, True, TOKEN, api_name="/chat")
    assert 'class="kv-badge kv-pass">EXACT<' in evidence and "(measured)" in evidence
    assert len(library.ledger()) == before + 1


def test_anonymous_exactness_reports_are_bounded_per_sample(served, library, monkeypatch):
    """Without the token each sample compares 2 greedy steps, skips the monolithic schedule and draws only
    artifacts of at most ANON_REPORT_TOKENS tokens; with it, the full sample. Checked on the reports' rows."""
    from services import limits

    seen = []
    real = library.exactness_report

    def spy(*args, **kwargs):
        rep = real(*args, **kwargs)
        seen.append(rep)
        return rep

    monkeypatch.setattr(library, "exactness_report", spy)
    c = _client(served, "10.0.4.2")
    assert c.predict(2, None, api_name="/verify")["byte_equal"] == 2
    assert c.predict(2, None, TOKEN, api_name="/verify")["byte_equal"] == 2
    anon, admin = seen
    assert [r.check.decode_steps for r in anon.rows] == [2, 2] and {r.check.monolithic_kl for r in anon.rows} == {None}
    assert [r.check.decode_steps for r in admin.rows] == [4, 4] and None not in {r.check.monolithic_kl for r in admin.rows}
    monkeypatch.setattr(limits, "ANON_REPORT_TOKENS", 3)  # shorter than every artifact here (limits.report_bounds)
    with pytest.raises(AppError, match="no artifact in the store has a chain of at most 3 tokens; verifying longer"):
        c.predict(1, None, api_name="/verify")
    assert c.predict(1, None, TOKEN, api_name="/verify")["samples"] == 1


# ---- fairness ---------------------------------------------------------------------------------------


def test_one_request_in_flight_per_session(served, guard):
    c = _client(served, "10.0.6.1")
    with guard.turns.turn(Client("holder", "10.0.6.99")):  # the model is busy: requests wait
        first = c.submit(1, None, api_name="/verify")
        deadline = time.monotonic() + 30
        while guard.turns.in_flight() < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(ValidationError, match="One request at a time per session"):  # refused when it joins
            c.predict(1, None, api_name="/verify")
    assert first.result(timeout=60)["samples"] == 1


def test_flood_from_one_address_is_refused_at_once_and_others_are_served(served, guard):
    """64 requests of one address while the model is held: 8 wait (the address's depth), the rest are refused
    when they join, instead of filling Gradio's queue; another address's chat is then answered."""
    outcomes: list[str] = []

    def flood(i: int) -> None:
        try:
            _client(served, "10.0.7.1").predict(5, None, api_name="/verify")
            outcomes.append("ok")
        except (AppError, ValidationError) as exc:
            outcomes.append(str(exc))

    with ThreadPoolExecutor(16) as pool:
        with guard.turns.turn(Client("holder", "10.0.7.99")):
            futures = [pool.submit(flood, i) for i in range(64)]
            deadline = time.monotonic() + 120
            refusal = "Your address already has 8 requests queued or running; wait for your earlier requests to finish"
            while sum(refusal in o for o in outcomes) < 56 and time.monotonic() < deadline:
                time.sleep(0.05)
            refused_while_held = sum(refusal in o for o in outcomes)
            user = _client(served, "10.0.7.2").submit(
                "Who built the lighthouse?", [], True, 3, 8, False, False, "", api_name="/chat"
            )
        for f in futures:
            f.result(timeout=120)
        history, _evidence, _box = user.result(timeout=120)
    assert refused_while_held == 56 and outcomes.count("ok") == 8
    assert history[-1]["role"] == "assistant" and "Not answered" not in json.dumps(history)


def _wait_until(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pred(), "timed out"


def _recording_turn(turns: FairTurns, order: list, holding: threading.Event, release: threading.Event):
    """A model turn that records who got it; with `hold`, it signals `holding` and keeps the model until `release`."""

    def run(who: Client, hold: bool = False) -> None:
        with turns.turn(who):
            order.append(who.session)
            if hold:
                holding.set()
                release.wait(10)

    return run


def test_a_waiting_user_gets_the_next_turn_whatever_another_host_queued():
    """The user has used the model for a while; then 9 requests of another host arrive, one holding the model.
    The user's request, queued last, runs right after the current one (round robin over addresses), not
    after every queued request of the host that had used the model less so far."""
    turns, user, order = FairTurns(depth=16), Client("u", "user-host"), []
    for _ in range(10):
        with turns.turn(user):
            time.sleep(0.02)  # 0.2 s of model time in all, more than the attacker's first turn
    holding, release = threading.Event(), threading.Event()
    run = _recording_turn(turns, order, holding, release)

    threads = [threading.Thread(target=run, args=(Client("a0", "attacker-host"), True))]
    threads[0].start()
    holding.wait(10)
    time.sleep(0.05)
    threads += [threading.Thread(target=run, args=(Client(f"a{i}", "attacker-host"),)) for i in range(1, 9)]
    for t in threads[1:]:
        t.start()
    _wait_until(lambda: turns.in_flight() == 9)
    threads.append(threading.Thread(target=run, args=(user,)))
    threads[-1].start()
    _wait_until(lambda: turns.in_flight() == 10)
    release.set()
    for t in threads:
        t.join(10)
    assert order[:2] == ["a0", "u"] and sorted(order) == sorted(["u", *(f"a{i}" for i in range(9))])
    assert turns.in_flight() == 0


def test_sessions_of_one_address_take_turns():
    turns, order = FairTurns(depth=8), []
    holding, release = threading.Event(), threading.Event()
    run = _recording_turn(turns, order, holding, release)

    run(Client("s2", "host"))  # s2 was served before
    first = threading.Thread(target=run, args=(Client("s1", "host"), True))
    first.start()
    holding.wait(10)
    waiting = [threading.Thread(target=run, args=(Client(s, "host"),)) for s in ("s2", "s3")]  # s2 queues first
    for i, t in enumerate(waiting):
        t.start()
        _wait_until(lambda n=i: turns.in_flight() == 2 + n)
    release.set()
    for t in (first, *waiting):
        t.join(10)
    assert order == ["s2", "s1", "s3", "s2"]  # s3, never served, goes before s2's second request


def test_a_front_end_runs_as_many_turns_at_once_as_it_has_slots_and_queues_the_rest_fairly(monkeypatch):
    """Fronting a deployment, the app sends `slots` requests at once (KVGRAFT_BACKEND_CONCURRENCY); one address
    holds at most `per_address` of them (its next waits though a slot is free), so another host's request
    takes the free slot at once, though it came after; the address's waiting request runs when one of its own ends."""
    turns = FairTurns(per_address=2, depth=8, slots=3)
    inside, order = threading.Semaphore(0), []
    release = {s: threading.Event() for s in ("b1", "b2", "b3", "o1")}

    def run(who: Client) -> None:
        with turns.turn(who):
            order.append(who.session)
            inside.release()
            release[who.session].wait(10)

    threads = [threading.Thread(target=run, args=(Client(s, "busy-host"),)) for s in ("b1", "b2", "b3")]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=10) and inside.acquire(timeout=10)  # two at once: the address's share
    _wait_until(lambda: turns.in_flight() == 3)
    assert not inside.acquire(timeout=0.2) and sorted(order) == ["b1", "b2"]  # b3 waits, a slot free
    threads.append(threading.Thread(target=run, args=(Client("o1", "other-host"),)))
    threads[-1].start()
    assert inside.acquire(timeout=10) and order[2] == "o1"  # the other host, at once
    release["b1"].set()  # one of busy-host's ends: its waiting request goes
    assert inside.acquire(timeout=10) and order[3] == "b3"
    for e in release.values():
        e.set()
    for t in threads:
        t.join(10)
    assert turns.in_flight() == 0
    assert FairTurns(per_address=8, slots=8).per_address == 7 and FairTurns(per_address=8, slots=1).per_address == 1
    monkeypatch.setenv("KVGRAFT_BACKEND_CONCURRENCY", "3")
    assert backend_slots() == 3
    for bad in ("0", "17", "two", "-1"):
        monkeypatch.setenv("KVGRAFT_BACKEND_CONCURRENCY", bad)
        with pytest.raises(InvalidSetting, match="KVGRAFT_BACKEND_CONCURRENCY must be a whole number from 1 to 16, got "):
            backend_slots()
    with pytest.raises(ValueError, match="slots, per_address and depth must be at least 1, got 0, 1 and 4"):
        FairTurns(slots=0)


def test_verify_yields_between_samples():
    turns, order = FairTurns(), []
    heavy, light = Client("h", "a1"), Client("l", "a2")
    gate = threading.Event()

    def run(who, tag):
        with turns.turn(who) as t:
            order.append(tag)
            if tag == "heavy-1":
                gate.set()
                _wait_until(lambda: turns.in_flight() == 2)
                t.pause()  # between two samples: the waiting client goes first
                order.append("heavy-2")
                t.pause()  # nobody waiting: keeps the model
                order.append("heavy-3")

    th = threading.Thread(target=run, args=(heavy, "heavy-1"))
    th.start()
    gate.wait(5)
    tl = threading.Thread(target=run, args=(light, "light"))
    tl.start()
    th.join(5)
    tl.join(5)
    assert order == ["heavy-1", "light", "heavy-2", "heavy-3"]
    assert turns.in_flight() == 0


# ---- exports and uploads ----------------------------------------------------------------------------


def test_export_streams_blobs_from_disk_byte_identical(library, tmp_path, monkeypatch):
    """Export never reads a whole blob into memory (`BlobStore.get` is not called) and writes the same bytes
    as a tar built from the blobs' bytes; a corrupt blob is refused, nothing written."""
    import services
    from db import bundles
    from db.blobs import BlobStore
    from errors import IntegrityError

    ids = library.artifact_ids()
    blobs = {p.name: p.read_bytes() for p in (library.home / "blobs").rglob("*.safetensors")}
    monkeypatch.setattr(BlobStore, "get", lambda self, h: pytest.fail("export read a whole blob into memory"))
    rep = services.export_bundle(library, ids, tmp_path / "a.tar")
    (tmp_path / "staged").mkdir()
    staged = bundles.stage(tmp_path / "a.tar", tmp_path / "staged")
    members = {name: path.read_bytes() for name, path in staged.items()}
    assert {n.split("/")[-1]: b for n, b in members.items() if n.startswith("blobs/")} == blobs
    bundles.write(tmp_path / "b.tar", members)
    assert (tmp_path / "b.tar").read_bytes() == (tmp_path / "a.tar").read_bytes() and rep.bytes == (
        tmp_path / "a.tar"
    ).stat().st_size
    victim = next((library.home / "blobs").rglob("*.safetensors"))
    original = victim.read_bytes()
    try:
        victim.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        with pytest.raises(IntegrityError, match="blob integrity check failed for .*nothing was exported"):
            services.export_bundle(library, ids, tmp_path / "c.tar")
        assert not (tmp_path / "c.tar").exists()
    finally:
        victim.write_bytes(original)


def test_export_file_expires(served, tmp_path, monkeypatch):
    from web import handlers

    monkeypatch.setattr(handlers, "EXPORT_TTL_S", 0.5)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path, message = _client(served, "10.0.8.1").predict(TOKEN, "", api_name="/export")
    assert message.startswith("Exported") and Path(path).stat().st_size > 0  # the client's download
    deadline = time.monotonic() + 10
    while list(tmp_path.glob("kvgraft-export-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(tmp_path.glob("kvgraft-export-*")) == []


def test_uploads_are_bounded_and_an_imported_upload_is_removed(served, library, tmp_path):
    from web import app

    assert app.launch_kwargs()["max_file_size"] == "256mb"
    url = served.local_url.rstrip("/") + "/gradio_api/upload"
    admin = {"X-Kvgraft-Admin-Token": TOKEN}  # uploads are the admin's (tests/test_uploads.py)
    r = httpx.post(url, files={"files": ("big.tar", b"\0" * (65 * 1024))}, headers=admin, timeout=30)
    assert r.status_code == 413  # the launch's max_file_size (64 KB in this test)
    c = gradio_client.Client(served.local_url, verbose=False, headers={"X-Forwarded-For": "10.0.9.1", **admin})
    path, _ = c.predict(TOKEN, library.artifact_ids()[0], api_name="/export")
    upload_dir = Path(served.app.uploaded_file_dir)
    before = set(upload_dir.rglob("*.tar"))
    msg, _table = c.predict(TOKEN, gradio_client.handle_file(path), api_name="/import")
    assert msg.startswith("Imported 1 artifacts (0 new")
    assert set(upload_dir.rglob("*.tar")) - before == set()  # the upload is gone after import


# ---- load --------------------------------------------------------------------------------------------


def test_eight_anonymous_attackers_and_one_chatting_user(tiny_gemma, tmp_path, monkeypatch):
    """bench.abuse on the tiny model (seconds per run, not figures): the user's chat p95 under attack is
    within 3x of idle, nobody sees an error, and nothing is written outside the store."""
    import services
    from bench import abuse
    from retrieval import HashEmbedder
    from web import app

    watch = (tmp_path / "gradio", tmp_path / "tmp")
    for folder in watch:
        folder.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(watch[0]))
    monkeypatch.setattr(tempfile, "tempdir", str(watch[1]))
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    abuse.seed_tiny(lib)
    demo = app.build_app(lib, admin_token=TOKEN, guard=Guard(TOKEN))
    serve(demo)
    try:
        rep = abuse.run(demo.local_url, chats=12, attackers=8, watch=watch, deadline_s=400)
    finally:
        demo.close()
    print(json.dumps({k: v for k, v in rep.to_json().items() if k not in ("idle_s", "loaded_s")}))
    assert rep.user_errors == () and rep.attacker_errors == ()
    assert rep.attacker_refusals > 0  # 8 sessions of one address, a depth of 4: the rest are refused when they join
    assert rep.attacker_calls >= 8 and len(rep.loaded_s) == 12
    assert rep.outside_files == ()
    assert rep.ratio <= 3.0, (rep.idle_s, rep.loaded_s)


def test_eight_anonymous_clients_of_the_openai_api_and_one_chatting_user(tiny_gemma, tmp_path):
    """bench.abuse's `api` attack on the tiny model: 8 clients of one address through /v1 (the longest anonymous
    completions, whole and streamed, an over-long question, the admin-only check) beside one chatting user: the
    chat's p95 within 3x of idle, no error on either side, the over-quota and admin-only requests refused."""
    import server
    import services
    from bench import abuse
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    abuse.seed_tiny(lib)
    demo = server.build(lib, admin_token=TOKEN, guard=Guard(TOKEN))
    serve(demo)
    try:
        rep = abuse.run(demo.local_url, chats=12, attackers=8, deadline_s=400, attack="api")
    finally:
        demo.close()
    print(json.dumps({k: v for k, v in rep.to_json().items() if k not in ("idle_s", "loaded_s")}))
    assert rep.user_errors == () and rep.attacker_errors == ()
    assert rep.attacker_refusals > 0 and rep.attacker_calls > rep.attacker_refusals  # some answered, some refused
    assert rep.ratio <= 3.0, (rep.idle_s, rep.loaded_s)
