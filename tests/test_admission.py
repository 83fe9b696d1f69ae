"""Fairness against one address with many sessions: model requests counted when they JOIN Gradio's queue
(one per session, a depth per address, refused at once over it, released exactly when the event ends),
anonymous questions bounded in prompt tokens, and an anonymous solve bounded to one chat per turn with its
seed parsed safely. Against the running app on loopback with the tiny model; the server trusts
X-Forwarded-For so that each test speaks from its own address."""

from __future__ import annotations

import json
import math
import time
import uuid

import pytest

from tests.served import attested_store, serve

gradio_client = pytest.importorskip("gradio_client")
import httpx  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from access.admission import ADDRESS_REFUSAL, SESSION_REFUSAL, Admission  # noqa: E402
from access.guard import AdminToken, Client, FairTurns, Guard, Refused  # noqa: E402

TOKEN = "fair-admin-token"
FACT = "The lighthouse of Varnek Isle was built by the engineer Talia Brennic in 1871."
DEPTH = 4


@pytest.fixture(scope="module")
def library(tiny_gemma, tmp_path_factory):
    return attested_store(tmp_path_factory, tiny_gemma, "fair-home", FACT, "Varnek")


@pytest.fixture(scope="module")
def guard():
    return Guard(TOKEN, tokens=AdminToken(TOKEN), turns=FairTurns(depth=DEPTH))


@pytest.fixture(scope="module")
def admission():
    return Admission(per_session=1, depth=DEPTH)


@pytest.fixture(scope="module")
def served(library, guard, admission):
    from web import app

    demo = app.build_app(library, admin_token=TOKEN, guard=guard, admission=admission)
    serve(demo)
    try:
        yield demo
    finally:
        demo.close()


def _index(demo, name: str) -> int:
    (index,) = [i for i, f in demo.fns.items() if f.name == name]
    return index


def _join(demo, name: str, data: list, address: str, session: str | None = None) -> tuple[httpx.Response, str]:
    """POST /gradio_api/queue/join for handler `name` (as a browser tab or a script would); returns the response
    and the session hash."""
    session = session or uuid.uuid4().hex
    body = {"data": data, "fn_index": _index(demo, name), "session_hash": session, "event_data": None, "trigger_id": None}
    url = demo.local_url.rstrip("/") + "/gradio_api/queue/join"
    headers = {"X-Forwarded-For": address, "Content-Type": "application/json"}
    return httpx.post(url, content=json.dumps(body), headers=headers, timeout=30), session  # NaN allowed, as Python sends it


def _completed(demo, session: str, address: str) -> dict:
    url = demo.local_url.rstrip("/") + "/gradio_api/queue/data"
    with httpx.stream("GET", url, params={"session_hash": session}, headers={"X-Forwarded-For": address}, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    return msg
    raise AssertionError("no process_completed message")


def _refusal(r: httpx.Response) -> str:
    assert r.status_code == 422, (r.status_code, r.text)
    (detail,) = r.json()["detail"]
    assert detail["is_valid"] is False
    return detail["message"]


def _wait_until(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pred(), "timed out"


# ---- the ledger ---------------------------------------------------------------------------------------


def test_admission_counts_per_session_and_address_and_releases_exactly_once():
    a = Admission(per_session=1, depth=2)
    t1 = a.reserve(Client("s1", "host"))
    with pytest.raises(Refused, match=f"^{SESSION_REFUSAL}$"):
        a.reserve(Client("s1", "host"))
    a.bind(t1, "event-1")
    t2 = a.reserve(Client("s2", "host"))
    with pytest.raises(Refused) as refused:
        a.reserve(Client("s3", "host"))
    assert str(refused.value) == (
        "Your address already has 2 requests queued or running; wait for your earlier requests to finish, then send again."
    )
    a.reserve(Client("s4", "other-host"))  # another address is not counted with this one
    assert a.joined("host") == 2 and a.joined() == 3
    a.release("event-1")
    a.release("event-1")  # twice: freed once
    a.release(t1)  # the reservation was bound to the event: nothing left under its number
    assert a.joined("host") == 1
    a.reserve(Client("s1", "host"))  # its session may send again
    a.release(t2)
    assert a.joined("host") == 1 and a.joined() == 2
    with pytest.raises(ValueError, match="per_session and depth must be at least 1, got 1 and 0"):
        Admission(depth=0)


def test_a_join_waits_out_a_finished_request_not_yet_dropped_and_refuses_one_still_running():
    """Gradio answers a client before it drops the finished event: a join in that window is admitted once the
    place frees (within joins.SETTLE_S); a place still held past it is refused with the session message."""
    import asyncio
    import threading

    from web import joins

    a = Admission(per_session=1, depth=4)
    held = a.reserve(Client("s1", "host"))
    threading.Timer(0.2, a.release, args=(held,)).start()  # the finished event leaves Gradio's table a moment later
    t0 = time.monotonic()
    again = asyncio.run(joins._reserve(a, Client("s1", "host")))
    assert 0.15 < time.monotonic() - t0 < joins.SETTLE_S and a.joined("host") == 1
    t0 = time.monotonic()
    with pytest.raises(Refused, match=f"^{SESSION_REFUSAL}$"):  # never released: still running
        asyncio.run(joins._reserve(a, Client("s1", "host")))
    assert time.monotonic() - t0 >= joins.SETTLE_S
    a.release(again)
    assert a.joined() == 0


def test_an_address_never_holds_every_slot_and_its_next_request_waits_while_others_run():
    """Eight slots, one address: at most seven at once (KVGRAFT_PER_ADDRESS 8 is brought below the slots);
    with the default share of two, its third request waits though slots are free."""
    import threading

    for per_address, slots, share in ((8, 8, 7), (2, 8, 2), (4, 1, 1)):
        turns = FairTurns(per_address=per_address, slots=slots, depth=16)
        assert turns.per_address == share
    turns, inside, release = FairTurns(per_address=2, slots=8, depth=8), threading.Semaphore(0), threading.Event()

    def run(who: Client) -> None:
        with turns.turn(who):
            inside.release()
            release.wait(10)

    threads = [threading.Thread(target=run, args=(Client(f"s{i}", "host"),)) for i in range(3)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=10) and inside.acquire(timeout=10)
    _wait_until(lambda: turns.in_flight() == 3)
    assert not inside.acquire(timeout=0.2)  # the third waits for one of its own
    release.set()
    assert inside.acquire(timeout=10)
    for t in threads:
        t.join(10)
    assert turns.in_flight() == 0


# ---- at join, against the running app -----------------------------------------------------------------


def test_sessions_of_one_address_past_its_depth_are_refused_when_they_join_and_others_are_not(served, guard, admission):
    """Eight sessions of one address while the model is busy: four join (the depth) and wait; the other four are
    refused by the join route itself (HTTP 422 with the message) without taking a place in Gradio's queue; another
    address joins as usual; every place is given back when the requests end."""
    busy, other = "10.1.0.1", "10.1.0.2"
    with guard.turns.turn(Client("holder", "10.1.0.99")):
        joined = [_join(served, "verify_api", [1, None, ""], busy) for _ in range(8)]
        assert [r.status_code for r, _ in joined] == [200] * DEPTH + [422] * 4
        assert {_refusal(r) for r, _ in joined[DEPTH:]} == {ADDRESS_REFUSAL.format(depth=DEPTH)}
        assert admission.joined(busy) == DEPTH
        queued = len(served._queue)  # Gradio holds only the admitted ones
        r, session = _join(served, "verify_api", [1, None, ""], other)
        assert r.status_code == 200 and admission.joined(other) == 1 and len(served._queue) <= queued + 1
        r2, _ = _join(served, "verify_api", [1, None, ""], other, session=session)  # the same session again
        assert _refusal(r2) == SESSION_REFUSAL
    assert _completed(served, session, other)["success"] is True
    for _r, s in joined[:DEPTH]:
        assert _completed(served, s, busy)["success"] is True
    _wait_until(lambda: admission.joined() == 0)
    assert guard.turns.in_flight() == 0


def test_a_failed_request_gives_its_place_back(served, admission):
    """A handler that refuses after joining (6 samples without the token) ends its event: the same session
    may send again at once, three times over."""
    session = uuid.uuid4().hex
    for _ in range(3):
        r, _ = _join(served, "verify_api", [6, None, ""], "10.1.1.1", session=session)
        assert r.status_code == 200, r.text
        msg = _completed(served, session, "10.1.1.1")
        assert msg["success"] is False and "samples must be between 1 and 5, got 6" in msg["output"]["error"]
        _wait_until(lambda: admission.joined("10.1.1.1") == 0)


def test_a_cancelled_request_gives_its_place_back(served, guard, admission):
    address = "10.1.2.1"
    with guard.turns.turn(Client("holder", "10.1.2.99")):
        r, session = _join(served, "verify_api", [1, None, ""], address)
        assert r.status_code == 200 and admission.joined(address) == 1
        cancel = {"session_hash": session, "fn_index": _index(served, "verify_api"), "event_id": r.json()["event_id"]}
        url = served.local_url.rstrip("/") + "/gradio_api/cancel"
        assert httpx.post(url, json=cancel, headers={"X-Forwarded-For": address}, timeout=30).status_code == 200
        _wait_until(lambda: admission.joined(address) == 0)
    _wait_until(lambda: guard.turns.in_flight() == 0)  # the handler's thread ends once it has had its turn
    r, session = _join(served, "verify_api", [1, None, ""], address, session=session)
    assert r.status_code == 200 and _completed(served, session, address)["success"] is True


# ---- bounds of one anonymous request --------------------------------------------------------------------


def test_an_anonymous_question_is_bounded_in_prompt_tokens(served, library, monkeypatch):
    from graft_core import generate

    monkeypatch.setenv("KVGRAFT_ANON_PROMPT_TOKENS", "64")
    question = "Who built the lighthouse of Varnek Isle, " + "and when, " * 40 + "?"
    n = len(generate.encode_prompt(library.lm, question, grafted=False))
    assert n > 64
    before = len(library.ledger())
    c = gradio_client.Client(served.local_url, verbose=False, headers={"X-Forwarded-For": "10.1.3.1"})
    message = f"the question is {n:,} prompt tokens; the limit without the admin token is 64: shorten it, or give the admin token"
    with pytest.raises(AppError) as refused:
        c.predict(question, 3, True, 4, api_name="/answer")
    assert str(refused.value) == message
    assert len(library.ledger()) == before  # nothing ran
    assert c.predict(question, 3, True, 4, False, False, TOKEN, api_name="/answer")["decode_tokens"] <= 4  # the admin's
    assert c.predict("Who built the lighthouse?", 3, True, 4, api_name="/answer")["decode_tokens"] <= 4
    history, _evidence, _box = c.predict(question, [], True, 3, 4, False, False, "", api_name="/chat")
    assert history[-1]["content"][0]["text"] == f"\u26a0\ufe0f Not answered: {message}"  # the chat says the same


def _first_problem(demo) -> str:
    (dropdown,) = [b for b in demo.blocks.values() if getattr(b, "label", "") and str(b.label).startswith("problem (")]
    return dropdown.choices[0][0]


def test_an_anonymous_solve_is_one_chat_per_turn_with_bounded_attempts(served, library, monkeypatch):
    """Without the token: at most ANON_SOLVE_ATTEMPTS attempts of at most KVGRAFT_ANON_NEW_TOKENS decode steps, and
    the model goes to the next waiting client between two attempts (one pause per attempt after the first)."""
    from access import guard as guard_mod
    from services.limits import ANON_SOLVE_ATTEMPTS, anon_max_new_tokens

    pauses, calls, real_pause, real_solve = [], [], guard_mod.Turn.pause, library.solve
    monkeypatch.setattr(guard_mod.Turn, "pause", lambda self: (pauses.append(1), real_pause(self)))

    def spy(*args, **kwargs):
        r = real_solve(*args, **kwargs)
        calls.append((kwargs, r))
        return r

    monkeypatch.setattr(library, "solve", spy)
    r, session = _join(served, "solve_public", [_first_problem(served), 1024, 7], "10.1.4.1")
    assert r.status_code == 200, r.text
    msg = _completed(served, session, "10.1.4.1")
    assert msg["success"] is True, msg
    ((kwargs, result),) = calls
    assert kwargs["attempts"] == ANON_SOLVE_ATTEMPTS and kwargs["max_new_tokens"] == anon_max_new_tokens() == 32
    assert 1 <= len(result.attempts) <= ANON_SOLVE_ATTEMPTS and len(pauses) == len(result.attempts) - 1
    assert len(msg["output"]["data"][1]["data"]) == len(result.attempts)  # the attempts table
    assert [a.seed for a in result.attempts if a.mode == "sampled"][:1] in ([], [7])


@pytest.mark.parametrize(
    "seed, message",
    [
        (1e300, "seed must be a whole number between 0 and 2,147,483,647, got '1e+300'"),
        (2.5, "seed must be a whole number between 0 and 2,147,483,647, got '2.5'"),
        (2**31, "seed must be between 0 and 2,147,483,647, got 2,147,483,648"),
        (-1, "Value -1 is less than minimum value 0."),
    ],
)
def test_a_solve_seed_is_refused_with_a_clear_message(served, seed, message):
    r, session = _join(served, "solve_public", [_first_problem(served), 512, seed], "10.1.5.1")
    assert r.status_code == 200, r.text
    msg = _completed(served, session, "10.1.5.1")
    assert msg["success"] is False and msg["output"]["error"] == message


def test_a_solve_seed_that_is_not_a_finite_number_is_refused_at_the_edge_before_the_queue(served):
    # JSON has no NaN; Python's encoder writes one anyway, and the edge refuses the body before Gradio's queue
    r, _ = _join(served, "solve_public", [_first_problem(served), 512, math.nan], "10.1.5.2")
    assert r.status_code == 400 and "not finite (NaN)" in r.json()["detail"], r.text


def test_one_address_past_its_rate_of_work_requests_is_answered_429_before_its_body_is_read():
    import asyncio
    import json as _json

    from access.limiter import JoinLimiter

    now = [0.0]
    reached = []

    async def app(scope, receive, send):
        reached.append((scope["client"][0], scope["path"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    held = []

    async def sleep(s: float) -> None:
        held.append(s)

    limiter = JoinLimiter(app, rate=1.0, burst=2, clock=lambda: now[0], hold_s=1.0, sleep=sleep)

    def call(address: str, path: str = "/gradio_api/queue/join") -> tuple[int, dict, bytes]:
        sent = []

        async def receive():
            raise AssertionError("a refused request's body is never read")

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": path, "client": (address, 5000), "method": "POST"}
        asyncio.run(limiter(scope, receive, send))
        start, body = sent
        return start["status"], dict(start["headers"]), body["body"]

    assert [call("203.0.113.7")[0] for _ in range(2)] == [200, 200]  # the burst
    status, headers, body = call("203.0.113.7")
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert _json.loads(body)["detail"] == "Too many requests from your address: at most 1 a second. Wait 1.0 s, then send again."
    assert call("198.51.100.2")[0] == 200  # another address is not affected
    assert call("203.0.113.7", "/gradio_api/queue/data")[0] == 200  # the event stream and pages are not limited
    now[0] += 1.0
    assert call("203.0.113.7")[0] == 200 and call("203.0.113.7")[0] == 429
    assert limiter.refused == 2 and len([r for r in reached if r[0] == "203.0.113.7"]) == 4
    assert held == [1.0, 1.0]  # every refusal held before its answer, no other request


def test_the_served_app_answers_an_address_past_its_rate_429_and_serves_the_others(library):
    """web.app.serve with its JoinLimiter at one every 10 s, bursts of 2: one address's third question in a row is
    answered 429 at the edge (held a second), while another address's question is answered."""
    import httpx

    from web import app

    demo = app.build_app(library, admin_token=TOKEN, guard=Guard(TOKEN, tokens=AdminToken(TOKEN), turns=FairTurns(depth=DEPTH)))
    serve(demo, joins=(0.1, 2))  # one more every 10 s
    try:
        fast = gradio_client.Client(demo.local_url, verbose=False, headers={"X-Forwarded-For": "10.9.0.1"})
        other = gradio_client.Client(demo.local_url, verbose=False, headers={"X-Forwarded-For": "10.9.0.2"})
        for _ in range(2):
            fast.predict("Who built the lighthouse?", 3, True, 4, api_name="/answer")
        t0 = time.monotonic()
        with pytest.raises(httpx.HTTPStatusError, match="429 Too Many Requests"):
            fast.predict("Who built the lighthouse?", 3, True, 4, api_name="/answer")
        assert time.monotonic() - t0 >= 1.0  # the refusal was held
        assert "answer" in other.predict("Who built the lighthouse?", 3, True, 4, api_name="/answer")
    finally:
        demo.close()
