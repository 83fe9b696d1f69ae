"""No input breaks the API or the page: bodies nested past any sane depth, text that is not valid Unicode in any field,
hypothesis-generated JSON, slow and half-sent bodies, clients that leave mid-body and bursts over the rate all get a
4xx in the documented shape (OpenAI's under /v1, `{"detail": ...}` on the page), never a 500 or a traceback, and the
server keeps answering. And text is text: a control token's name written by a caller is never that control token."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

import services
from access.admission import Admission
from access.arrivals import BodyDeadline
from access.guard import FairTurns, Guard
from retrieval import HashEmbedder
from serving.openai_api import OpenAIServer, app

TOKEN = "inputs-admin-token"
CHAT = {"model": "kvgraft", "messages": [{"role": "user", "content": "Who built the lighthouse?"}], "max_tokens": 2}
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/kvgraft/deposits")


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_gemma):
    lib = services.Library(home=tmp_path_factory.mktemp("inputs") / "home", lm=tiny_gemma, embedder=HashEmbedder())
    server = OpenAIServer(lib, Guard(TOKEN, turns=FairTurns(slots=1, depth=4)), Admission(depth=4))
    with TestClient(app(server), client=("10.0.0.9", 5000), raise_server_exceptions=False) as client:
        yield client, lib, server
    lib.close()


def _post(client, route: str, raw: bytes) -> httpx.Response:
    auth = {"authorization": f"Bearer {TOKEN}"} if "deposits" in route else {}
    return client.post(route, content=raw, headers={"content-type": "application/json"} | auth)


def _openai_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("depth", [900, 10_000])
def test_json_nested_past_the_bound_is_a_400_on_every_route(api, route, depth):
    client, *_ = api
    for raw in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        err = _openai_error(_post(client, route, raw))
        assert "nested deeper than 32 levels" in err["message"]
    assert client.get("/v1/models").status_code == 200


@pytest.mark.parametrize(
    "route, body, field",
    [
        ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": "bell \ud800"}]}, "messages[0].content"),
        ("/v1/chat/completions", CHAT | {"model": "\udc00"}, "model"),
        (
            "/v1/chat/completions",
            CHAT | {"stream": True, "messages": [{"role": "user", "content": "\udfff"}]},
            "messages[0].content",
        ),
        ("/v1/completions", {"model": "kvgraft", "prompt": "a \ud800 b"}, "prompt"),
        ("/v1/completions", {"model": "kvgraft", "prompt": ["fine", "\ud800"]}, "prompt[1]"),
        ("/v1/completions", {"model": "kvgraft", "prompt": "x", "stop": ["\ud800"]}, "stop[0]"),
        ("/v1/kvgraft/deposits", {"text": "The bell \ud800 rang."}, "text"),
        ("/v1/kvgraft/deposits", {"question": "q", "solution": "s", "verifier": "exact", "reference": "\udbff"}, "reference"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_its_field_before_the_tokenizer(api, route, body, field):
    """Every field, streamed or not: the 400 names where the surrogate is (a stream is refused before it starts)."""
    client, lib, _ = api
    before = (lib.count(), len(lib.ledger()))
    err = _openai_error(_post(client, route, json.dumps(body).encode()))  # json.dumps writes \\ud800 escapes
    assert err["param"] == field and "lone surrogate" in err["message"]
    assert (lib.count(), len(lib.ledger())) == before


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(alphabet=st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model": _JSON,
        "prompt": _JSON,
        "messages": _JSON,
        "max_tokens": _JSON,
        "logprobs": _JSON,
        "echo": _JSON,
        "stop": _JSON,
        "stream": _JSON,
        "kvgraft": _JSON,
        "top_logprobs": _JSON,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES[:2]), body=_FIELDS | _JSON)
def test_no_generated_body_gives_a_500(api, route, body):
    """Any JSON (lone surrogates among its characters, any types in any field): a 4xx in OpenAI's shape, or an
    answer; never a 500."""
    client, *_ = api
    raw = json.dumps(body).encode()
    r = _post(client, route, raw)
    assert r.status_code < 500, (r.status_code, r.text[:300], raw[:300])
    if r.status_code >= 400:
        _openai_error(r, r.status_code)


# ---- the page and the API on one real port -----------------------------------------------------------------


@pytest.fixture(scope="module")
def port(tmp_path_factory, tiny_gemma):
    import server
    from tests.served import serve

    lib = services.Library(home=tmp_path_factory.mktemp("port") / "home", lm=tiny_gemma, embedder=HashEmbedder())
    demo = server.build(lib, admin_token=TOKEN, guard=Guard(TOKEN))
    serve(demo, joins=(2.0, 2))
    yield demo
    demo.close()
    lib.close()


def test_the_page_refuses_deep_and_unencodable_bodies_in_its_own_shape(port, caplog):
    demo = port
    base = demo.local_url.rstrip("/")
    fn = next(i for i, d in demo.fns.items() if d.api_name == "answer")
    headers = {"content-type": "application/json", "x-forwarded-for": "10.3.0.1"}
    deep = b'{"data": ' + b"[" * 10_000 + b"]" * 10_000 + b', "fn_index": %d, "session_hash": "s"}' % fn
    with caplog.at_level(logging.INFO, logger="kvgraft.refused"):
        r = httpx.post(base + "/gradio_api/queue/join", content=deep, headers=headers, timeout=30)
    assert r.status_code == 400 and "nested deeper than 32 levels" in r.json()["detail"]
    surrogate = {"data": ["bell \ud800"], "fn_index": fn, "session_hash": uuid.uuid4().hex}
    r = httpx.post(
        base + "/gradio_api/queue/join", content=json.dumps(surrogate), headers=headers | {"x-forwarded-for": "10.3.0.2"}
    )
    assert r.status_code == 400 and "lone surrogate" in r.json()["detail"]
    api = httpx.post(base + "/v1/chat/completions", content=b"[" * 10_000, headers=headers | {"x-forwarded-for": "10.3.0.3"})
    assert _openai_error(api)["param"] == "body"
    assert httpx.get(base + "/v1/models", timeout=30).status_code == 200


def test_numbers_that_are_not_finite_are_refused_on_the_page_and_the_api(port):
    """NaN, Infinity and 1e999 (Python's json reads them; FastAPI's error echo then cannot encode them: a 500 that
    hypothesis found on the page's routes) are a 400 naming the number, in each front end's own shape."""
    base = port.local_url.rstrip("/")
    for i, raw in enumerate((b"NaN", b"Infinity", b"-Infinity", b"1e999")):
        who = {"content-type": "application/json", "x-forwarded-for": f"10.5.0.{i + 1}"}
        page = httpx.post(base + "/gradio_api/call/answer", content=b'{"data": [' + raw + b"]}", headers=who, timeout=60)
        assert page.status_code == 400 and "not finite" in page.json()["detail"], page.text[:300]
        api = httpx.post(base + "/v1/completions", content=b'{"prompt": "x", "temperature": ' + raw + b"}", headers=who)
        assert api.status_code == 400 and "not finite" in _openai_error(api)["message"], api.text[:300]
    assert httpx.get(port.local_url, timeout=60).status_code == 200


_SENT = iter(range(1, 60_000))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(("/gradio_api/queue/join", "/gradio_api/call/answer", "/gradio_api/run/answer")), body=_JSON)
def test_no_generated_body_gives_the_page_a_500(port, route, body):
    """The page's own routes under any JSON (surrogates among its characters): a 4xx or an answer, never a 500,
    and the page still serves."""
    n = next(_SENT)
    who = {"content-type": "application/json", "x-forwarded-for": f"10.4.{n // 250}.{n % 250 + 1}"}
    r = httpx.post(port.local_url.rstrip("/") + route, content=json.dumps(body), headers=who, timeout=60)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert httpx.get(port.local_url, timeout=60).status_code == 200


def test_the_rate_limit_speaks_openais_shape_under_v1_and_the_pages_elsewhere(port):
    """Over the per-address rate (2 a second, a burst of 2 here), /v1 gets OpenAI's rate_limit_error, the page's
    routes keep `{"detail": ...}`; both with Retry-After."""
    base = port.local_url.rstrip("/")
    who = {"x-forwarded-for": "10.3.9.9"}
    codes = [httpx.post(base + "/v1/completions", json={"prompt": "x"}, headers=who, timeout=30) for _ in range(4)]
    limited = [r for r in codes if r.status_code == 429]
    assert limited and "retry-after" in limited[0].headers
    err = _openai_error(limited[0], 429)
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
    page = [httpx.post(base + "/gradio_api/queue/join", json={}, headers={"x-forwarded-for": "10.3.9.8"}) for _ in range(4)]
    assert any(r.status_code == 429 and "detail" in r.json() for r in page)


# ---- slow and broken senders ----------------------------------------------------------------------------------


@pytest.fixture
def slow_port(api):
    """The API behind `BodyDeadline` (1 s to send a body, 2 bodies arriving per address) on a real socket."""
    import uvicorn

    from tests.served import free_port

    _, _, server = api
    gate = BodyDeadline(app(server), read_s=1.0, per_address=2)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(gate, host="127.0.0.1", port=port, log_level="info"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port, gate
    uv.should_exit = True
    thread.join(timeout=10)


def _half_sent(port: int, sent: bytes = b'{"model": "kvg', declared: int = 200) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    s.sendall(head.encode() + sent)
    return s


def _reply(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out or len(out) < out.find(b"\r\n\r\n") + 4 + int(
        out.split(b"content-length: ")[1].split(b"\r\n")[0]
    ):
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_a_half_sent_body_is_cut_at_its_deadline_and_an_address_holds_few_of_them(slow_port, caplog):
    port, gate = slow_port
    with caplog.at_level(logging.INFO):
        t0 = time.monotonic()
        a, b = _half_sent(port), _half_sent(port)
        time.sleep(0.2)
        c = _half_sent(port)  # a third body arriving from the same address: refused at once
        third = _reply(c)
        assert third.startswith(b"HTTP/1.1 429") and b"rate_limit_error" in third
        first = _reply(a)
        waited = time.monotonic() - t0
        assert first.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in first and 0.9 <= waited < 10
        assert _reply(b).startswith(b"HTTP/1.1 408")
        for s in (a, b, c):
            s.close()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 200
    assert gate.cut == 2 and not gate.arriving
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_a_client_that_leaves_mid_body_is_one_log_line(slow_port, caplog):
    port, gate = slow_port
    with caplog.at_level(logging.INFO):
        s = _half_sent(port)
        time.sleep(0.2)
        s.close()
        deadline = time.monotonic() + 10
        while gate.left == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert gate.left == 1 and not gate.arriving
    lines = [r.getMessage() for r in caplog.records if "left before its request body arrived" in r.getMessage()]
    assert len(lines) == 1 and "POST /v1/completions" in lines[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


# ---- text is text ------------------------------------------------------------------------------------------------


def test_a_control_tokens_name_in_caller_text_is_never_the_control_token(api):
    """The plain form (the tiny Gemma's, as the packaged Gemma's): `<eos>`, `<bos>`, `<pad>` written in a question,
    a raw prompt or a deposit are their characters, tokenised as text; text without one tokenises as before."""
    from graft_core import templates

    client, lib, _ = api
    tok = lib.lm.tokenizer
    controls = {tok.convert_tokens_to_ids(t) for t in ("<eos>", "<bos>", "<pad>")}
    text = "A <eos> B <bos><pad> C"
    for ids in (
        templates.encode_prompt(tok, text, grafted=True, raw=True),
        templates.encode_prompt(tok, text, grafted=True),
        templates.deposit_ids(tok, text, root=False),
    ):
        assert not controls & set(ids), ids
    assert templates.encode_prompt(tok, "A B", grafted=False, raw=True) == tok("A B")["input_ids"]  # unchanged
    r = client.post(
        "/v1/completions",
        json={"model": "kvgraft", "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0, "kvgraft": {"graft": False}},
    ).json()
    tokens = r["choices"][0]["logprobs"]["tokens"]
    assert r["usage"]["prompt_tokens"] == len(tokens) and "".join(tokens[1:]).replace(" ", "") == text.replace(" ", "")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["packaged:gemma-3-270m", "packaged:smollm2-135m-instruct"])
def test_no_control_token_from_caller_text_on_a_packaged_model(name):
    """Per packaged model, every control token its tokenizer has: in the plain form (Gemma) it is tokenised as
    text in a question, a raw prompt and a deposit; in a chat template (SmolLM2) a question or deposit holding it
    is refused (it would forge a turn), and a raw prompt tokenises it as text."""
    from errors import InvalidInput
    from graft_core import model, templates

    tok = model.load(name).tokenizer
    template = templates.of(tok)
    controls = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert controls and (template.chat == (name.endswith("instruct")))
    for c, cid in list(controls.items())[:400]:
        text = f"Who said {c} first?"
        assert cid not in templates.encode_prompt(tok, text, grafted=True, raw=True), c
        if template.chat:
            with pytest.raises(InvalidInput, match="control token"):
                templates.encode_prompt(tok, text, grafted=True)
            with pytest.raises(InvalidInput, match="control token"):
                templates.deposit_ids(tok, text, root=True)
        else:
            assert cid not in templates.encode_prompt(tok, text, grafted=False)[1:], c  # the first: the tokenizer's BOS
            assert cid not in templates.deposit_ids(tok, text, root=True)[1:], c
