"""The edges of a public deployment, against the running app on loopback (tiny model): whose forwarded
headers are believed, the per-address lockout with backoff, one log line per refusal, text that cannot be
encoded refused before any work, and a page root that no Host header can change."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest

from tests.served import attested_store, serve

gradio_client = pytest.importorskip("gradio_client")
import httpx  # noqa: E402

from access.guard import AdminToken, Client, FairTurns, Guard, Refused  # noqa: E402
from errors import InvalidSetting  # noqa: E402
from web import hosting  # noqa: E402

TOKEN = "edge-admin-token"
FACT = "The bell of Orsk harbour was cast by the founder Mirela Vost in 1902."


@pytest.fixture(scope="module")
def library(tiny_gemma, tmp_path_factory):
    return attested_store(tmp_path_factory, tiny_gemma, "edge-home", FACT, "Orsk")


def _serve(library, proxies: tuple[str, ...]):
    from web import app

    guard = Guard(TOKEN, tokens=AdminToken(TOKEN, per_address=3, window_s=600), turns=FairTurns(per_address=8))
    demo = app.build_app(library, admin_token=TOKEN, guard=guard)
    serve(demo, proxies)
    return demo, guard


@pytest.fixture(scope="module")
def plain(library):
    """The app as it starts by default: no proxy named, so no peer's forwarded headers are believed."""
    demo, guard = _serve(library, ())
    try:
        yield demo, guard
    finally:
        demo.close()


@pytest.fixture(scope="module")
def proxied(library):
    """The app behind a proxy on 127.0.0.1 (KVGRAFT_TRUST_PROXY=127.0.0.1)."""
    demo, guard = _serve(library, ("127.0.0.1/32",))
    try:
        yield demo, guard
    finally:
        demo.close()


def _fn_index(demo, name: str) -> int:
    index = min(i for i, f in demo.fns.items() if f.name == name)
    return index


def _raw_call(demo, name: str, data: list, headers: dict | None = None) -> list[dict]:
    """Run handler `name` through /gradio_api/queue/join; every message of its stream, to the last."""
    session = uuid.uuid4().hex
    base = demo.local_url.rstrip("/") + "/gradio_api"
    body = {"data": data, "fn_index": _fn_index(demo, name), "session_hash": session, "event_data": None, "trigger_id": None}
    r = httpx.post(
        f"{base}/queue/join",
        content=json.dumps(body),
        headers={"content-type": "application/json", **(headers or {})},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    messages = []
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": session}, headers=headers, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                messages.append(json.loads(line[5:]))
                if messages[-1].get("msg") == "process_completed":
                    return messages
    raise AssertionError(f"no process_completed message: {messages}")


def _export(demo, token: str, xff: str) -> dict:
    return _raw_call(demo, "export_bundle", [token, ""], {"X-Forwarded-For": xff})[-1]


LOCKED = "Too many wrong admin tokens from your address; admin actions from it are locked for"


def _error(message: dict) -> str:
    assert message["msg"] == "process_completed" and not message["success"], message
    return message["output"]["error"]


# ---- whose address -----------------------------------------------------------------------------


def test_spoofed_forwarded_for_from_a_peer_that_is_no_proxy_counts_under_the_peer(plain):
    """The attack as found: wrong tokens from 127.0.0.1, each claiming another X-Forwarded-For address."""
    demo, guard = plain
    for i in range(3):
        assert _error(_export(demo, "guess", f"10.0.0.{i}")).startswith("Admin token refused")
    assert _error(_export(demo, TOKEN, "10.0.0.99")).startswith(LOCKED)  # the peer is locked, whatever it claims
    assert set(guard.tokens._seen) == {"127.0.0.1"}


def test_forwarded_for_is_believed_from_a_configured_proxy_nearest_hop_first(proxied, library):
    demo, guard = proxied
    for _ in range(3):
        assert _error(_export(demo, "guess", "10.0.1.1")).startswith("Admin token refused")
    assert _error(_export(demo, TOKEN, "10.0.1.1")).startswith(LOCKED)
    # a client that prepends a forged hop is still the address the proxy appended (the nearest that is no proxy)
    assert _error(_export(demo, TOKEN, "10.0.1.2, 10.0.1.1")).startswith(LOCKED)
    done = _export(demo, TOKEN, "10.0.1.1, 10.0.1.2")  # forged 10.0.1.1 first: this is 10.0.1.2, not locked
    assert done["success"], done
    assert done["output"]["data"][1].startswith(f"Exported {library.count()} artifacts")
    assert set(guard.tokens._seen) == {"10.0.1.1", "10.0.1.2"}


def test_hosting_names_the_proxies_and_the_old_1_is_refused():
    assert hosting.detect({}).proxies == ()
    assert hosting.detect({"KVGRAFT_TRUST_PROXY": "127.0.0.1, 10.0.0.0/8"}).proxies == ("127.0.0.1/32", "10.0.0.0/8")
    assert hosting.detect({"SYSTEM": "spaces"}, data_root=Path("/nonexistent")).proxies == hosting.PRIVATE_NETWORKS
    assert hosting.detect({"SYSTEM": "spaces", "KVGRAFT_TRUST_PROXY": "0"}, data_root=Path("/nonexistent")).proxies == ()
    with pytest.raises(InvalidSetting) as e:
        hosting.detect({"KVGRAFT_TRUST_PROXY": "1"})
    assert str(e.value) == (
        "KVGRAFT_TRUST_PROXY must be the proxies' addresses or networks, comma-separated (like 127.0.0.1 or "
        "10.0.0.0/8), or 0 for none, got '1'"
    )


# ---- lockout -----------------------------------------------------------------------------------


def test_a_burst_locks_its_address_with_doubling_backoff_and_never_the_admin_elsewhere():
    now = [0.0]
    gate = AdminToken("t", per_address=3, window_s=60, lockout_s=100, max_lockout_s=350, clock=lambda: now[0])
    attacker, admin = Client("s1", "10.0.0.1"), Client("s2", "10.0.0.2")

    def burst(n=100):
        for _ in range(n):
            with pytest.raises(Refused):
                gate.check("guess", attacker)

    def locked_for() -> str:
        with pytest.raises(Refused) as e:
            gate.check("t", attacker)
        return str(e.value)

    burst()  # 100 wrong tokens: the found attack
    gate.check("t", admin)  # the admin elsewhere is unaffected
    assert locked_for() == f"{LOCKED} 100 s. Try again later."
    now[0] = 100.0
    gate.check("t", attacker)  # the lockout is over
    burst(3)
    assert locked_for() == f"{LOCKED} 200 s. Try again later."  # doubled
    now[0] = 300.0
    burst(3)
    assert locked_for() == f"{LOCKED} 350 s. Try again later."  # capped
    gate.check("t", admin)
    now[0] = 650.0 + 350.0  # quiet for the longest lockout after the last one ended: a fresh start
    burst(3)
    assert locked_for() == f"{LOCKED} 100 s. Try again later."


def test_ipv6_addresses_of_one_slash_64_share_a_count():
    gate = AdminToken("t", per_address=2)
    for host in ("2001:db8::1", "2001:db8::2"):
        with pytest.raises(Refused, match="Admin token refused"):
            gate.check("guess", Client(host, host))
    with pytest.raises(Refused, match="Too many wrong admin tokens"):
        gate.check("t", Client("x", "2001:db8::ffff"))
    gate.check("t", Client("y", "2001:db8:0:1::1"))  # the next /64 is another host


# ---- refusals in the log -----------------------------------------------------------------------


def test_a_refusal_is_one_log_line_and_a_real_error_keeps_its_traceback(proxied, caplog, capfd, monkeypatch):
    demo, _ = proxied
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="kvgraft.refused"):
        msg = _raw_call(demo, "verify_ui", [5, True, 2**63], {"X-Forwarded-For": "10.0.2.1"})[-1]
        assert "relocate offset must be between 0 and" in _error(msg)
        assert _error(_export(demo, "guess", "10.0.2.1")).startswith("Admin token refused")
    refused = [r.getMessage() for r in caplog.records if r.name == "kvgraft.refused"]
    assert len(refused) == 2, refused
    assert refused[0].startswith("refused: relocate offset must be between 0 and 511, got 9,223,372,036,854,775,808")
    assert refused[1] == "refused: Admin token refused: give the value of KVGRAFT_ADMIN_TOKEN set on the server."
    assert "Traceback" not in capfd.readouterr().err

    import services

    def broken(*a, **k):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(services, "export_bundle", broken)
    assert _error(_export(demo, TOKEN, "10.0.2.2")) is None  # a real error: the user sees no internals
    err = capfd.readouterr().err
    assert "Traceback" in err and "RuntimeError: a real bug" in err


# ---- text that cannot be encoded ---------------------------------------------------------------

LONE = "The text holds 1 lone surrogate character(s) (U+D800-U+DFFF), which cannot be encoded: send valid Unicode text."


def _join(demo, name: str, data: list) -> httpx.Response:
    """POST one call to /gradio_api/queue/join as raw JSON (a lone surrogate travels as its \\u escape)."""
    body = {"data": data, "fn_index": _fn_index(demo, name), "session_hash": uuid.uuid4().hex, "event_data": None}
    url = demo.local_url.rstrip("/") + "/gradio_api/queue/join"
    return httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("chat", ["who cast the bell? \ud800", [], True, 3, 8, False, False, ""]),
        ("chat", ["who cast the bell?", [{"role": "user", "content": "\udfff"}], True, 3, 8, False, False, ""]),
        ("deposit_ui", [TOKEN, "free text", "", "", "", "exact", "", "bell \ud800", "t", ""]),
        ("deposit_ui", [TOKEN, "verified item", "q", "s", "a", "\ud800", "a", "", "t", ""]),  # a dropdown echoes it
        ("deposit_api", [TOKEN, "", "", "", "exact", "", "bell \ud800", "t", ""]),
        ("answer_api", ["who cast the bell? \ud800", 3, True, 8, False, False, ""]),
        ("verify_api", [1, None, "\ud800"]),
        ("solve_admin", [TOKEN, "2+2? \ud800", "numeric", "4", 64, 0]),
        ("solve_public", ["\ud800", 64, 0]),
        ("delete_artifact", [TOKEN, "\ud800"]),
    ],
)
def test_a_lone_surrogate_is_refused_at_the_edge_in_every_text_input(plain, library, name, data, caplog):
    demo, _ = plain
    before = library.count()
    with caplog.at_level(logging.INFO, logger="kvgraft.refused"):
        r = _join(demo, name, data)
    assert (r.status_code, r.json()) == (400, {"detail": LONE})
    assert [rec.getMessage() for rec in caplog.records if rec.name == "kvgraft.refused"] == [f"refused: {LONE}"]
    assert library.count() == before


def test_a_surrogate_pair_is_text_and_passes(plain):
    demo, _ = plain
    msgs = _raw_call(demo, "chat", ["who cast the bell? \U0001f514", [], True, 3, 4, False, False, ""])
    assert msgs[-1]["success"], msgs[-1]


def test_an_oversized_json_body_is_refused(plain):
    url = plain[0].local_url.rstrip("/") + "/gradio_api/queue/join"
    r = httpx.post(url, content=b"[" + b"0," * (8 * 2**20) + b"0]", headers={"content-type": "application/json"}, timeout=60)
    assert (r.status_code, r.json()) == (413, {"detail": "The request is over 16 MiB: send less."})


def test_the_chat_handler_refuses_a_surrogate_itself(plain):
    """Behind the edge (a handler called in process): the chat says so in the stream and echoes nothing."""
    demo, _ = plain
    chat = demo.fns[_fn_index(demo, "chat")].fn
    history, _, box = list(chat("bell \ud800", [{"role": "user", "content": "hi"}], True, 3, 4, False, False, ""))[-1]
    assert history == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"⚠️ {LONE}"}] and box == ""
    history, _, _ = list(chat("bell?", [{"role": "user", "content": "\udfff"}], True, 3, 4, False, False, ""))[-1]
    assert history == [{"role": "assistant", "content": f"⚠️ {LONE}"}]


def test_text_problem_finds_nul_and_surrogates_anywhere():
    from access.bodies import text_problem

    assert text_problem("plain", ["ok", {"k": "v"}], None, 3) is None
    assert text_problem({"content": ["a", "\udc80\ud800"]}) == LONE.replace("1 lone", "2 lone")
    assert text_problem("a\x00b") == "The text holds 1 NUL bytes (binary data?): send plain text."
    assert text_problem("a\x00b", nul=False) is None  # the edge lets NUL through to the handlers' own check


# ---- the page root -----------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Host", "X-Forwarded-Host"])
def test_a_forged_host_is_not_echoed_as_the_root(plain, header):
    demo, _ = plain
    base = demo.local_url.rstrip("/")
    config = httpx.get(f"{base}/config", headers={header: "evil.example"}, timeout=30)
    assert config.status_code == 200 and config.json()["root"] == base
    page = httpx.get(f"{base}/", headers={header: "evil.example"}, timeout=30)
    assert page.status_code == 200 and base in page.text and "evil.example" not in page.text


def test_the_root_is_the_public_url_or_the_space_host():
    assert hosting.detect({"GRADIO_SERVER_PORT": "7861"}).root == "http://127.0.0.1:7861"
    assert hosting.detect({"KVGRAFT_PUBLIC_URL": "https://kv.example/app/"}).root == "https://kv.example/app"
    space = {"SYSTEM": "spaces", "SPACE_HOST": "me-kvgraft.hf.space"}
    assert hosting.detect(space, data_root=Path("/nonexistent")).root == "https://me-kvgraft.hf.space"


def test_a_nul_passes_the_edge_and_is_refused_by_the_handler_with_its_message(plain):
    demo, _ = plain
    msg = _raw_call(demo, "answer_api", ["who cast\x00 the bell?", 3, True, 8, False, False, ""])[-1]
    assert _error(msg) == "The text holds 1 NUL bytes (binary data?): send plain text."


def test_values_gradio_itself_refuses_are_one_log_line_each_without_a_traceback(proxied, caplog, capfd):
    demo, _ = proxied
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="kvgraft.refused"):
        errors = [
            _error(_raw_call(demo, "solve_public", ["not a trusted problem", 512, 0], {"X-Forwarded-For": "10.0.3.1"})[-1]),
            _error(_raw_call(demo, "solve_public", [None, 512, -5], {"X-Forwarded-For": "10.0.3.2"})[-1]),
            _error(_raw_call(demo, "solve_public", [None, 512, 1e300], {"X-Forwarded-For": "10.0.3.3"})[-1]),
        ]
    refused = [r.getMessage() for r in caplog.records if r.name == "kvgraft.refused"]
    assert "not in the list of choices" in errors[0] and "not in the list of choices" in refused[0]  # the dropdown's check
    assert "-5" in errors[1] and "-5" in refused[1]  # the seed field's minimum
    assert errors[2] == refused[2].removeprefix("refused: ")  # the handler's own bound on the seed
    assert len(refused) == 3, refused
    assert "Traceback" not in capfd.readouterr().err
