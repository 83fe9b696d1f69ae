"""The OpenAI-compatible API (serving/openai_api.py) on the tiny model, through Starlette's test client: the
shapes OpenAI's clients read, the proof and cached tokens in every response, a stream byte-identical to the
whole answer, the admission and bounds of the chat, the admin's deposits and the metrics' text format."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import services
from access.admission import Admission
from access.guard import FairTurns, Guard
from retrieval import HashEmbedder
from serving.openai_api import OpenAIServer, app
from serving.openai_shapes import model_id

TOKEN = "s3cret-admin-token"
FACT = "The Varnek lighthouse was built by Osric Pellamy in 1874."


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dirs):
    from graft_core import model

    lib = services.Library(
        home=tmp_path_factory.mktemp("api") / "home", lm=model.load(str(tiny_dirs["gemma3"])), embedder=HashEmbedder()
    )
    art = lib.deposit_text(FACT).id
    guard = Guard(TOKEN, turns=FairTurns(per_address=1, slots=1, depth=4))
    server = OpenAIServer(lib, guard, Admission(per_session=1, depth=4))
    with TestClient(app(server), client=("10.0.0.7", 5000)) as client:
        yield client, server, lib, art
    lib.close()


def _chat(art: str | None = None, **kw) -> dict:
    body = {"model": "kvgraft", "messages": [{"role": "user", "content": "Who built the Varnek lighthouse?"}], "max_tokens": 6}
    if art:
        body["kvgraft"] = {"artifacts": [art]}
    return body | kw


def _events(text: str) -> list:
    lines = [ln[len("data: ") :] for ln in text.split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(x) for x in lines[:-1]]


def test_models_lists_the_one_model(served):
    client, _, lib, _ = served
    r = client.get("/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == model_id(lib)


def test_chat_carries_the_proof_and_the_grafted_tokens_as_cached(served):
    client, _, lib, art = served
    r = client.post("/v1/chat/completions", json=_chat(art))
    assert r.status_code == 200, r.text
    j = r.json()
    k = j["kvgraft"]
    assert j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant"
    assert k["tier"] == "exact" and k["artifact_ids"] == [art]
    grafted = lib.show(art).artifact.end_pos
    assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == k["grafted_tokens"] == grafted
    assert j["usage"]["prompt_tokens"] == grafted + k["computed_tokens"]
    assert j["usage"]["completion_tokens"] == len(k["output_token_ids"]) == k["decode_tokens"]
    assert k["state_proof"]["passed"] is True and k["state_proof"]["kind"] in ("probe", "state")
    assert k["ledger_id"] == lib.ledger(last=1)[0].id and k["logits_sha256"] == lib.ledger(last=1)[0].logits_sha256
    text = lib.lm.tokenizer.decode(k["output_token_ids"], skip_special_tokens=True)
    assert j["choices"][0]["message"]["content"] == (text[: text.find("\n")] if "\n" in text else text).strip()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 11, "top_p": 0.9}])
def test_a_stream_is_byte_identical_to_the_whole_answer(served, route, sampling):
    client, _, _, art = served
    body = (
        _chat(art, **sampling)
        if "chat" in route
        else {"model": "kvgraft", "prompt": "The lighthouse", "max_tokens": 8, **sampling}
    )
    whole = client.post(route, json=body).json()
    with client.stream("POST", route, json=body | {"stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = _events(r.read().decode())
    if "chat" in route:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        text = whole["choices"][0]["message"]["content"]
    else:
        streamed = "".join(c["choices"][0]["text"] for c in chunks)
        text = whole["choices"][0]["text"]
    last = chunks[-1]
    assert streamed.encode() == text.encode()
    assert last["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert last["kvgraft"]["output_token_ids"] == whole["kvgraft"]["output_token_ids"]
    assert last["kvgraft"]["logits_sha256"] == whole["kvgraft"]["logits_sha256"]
    assert last["usage"] == whole["usage"]
    assert all("kvgraft" not in c for c in chunks[:-1])


def test_the_stop_string_holds_the_stream_back_until_it_is_decided(served):
    client, _, lib, art = served
    base = client.post("/v1/completions", json={"model": "kvgraft", "prompt": "The lighthouse", "max_tokens": 8}).json()
    ids = base["kvgraft"]["output_token_ids"]
    full = lib.lm.tokenizer.decode(ids, skip_special_tokens=True)
    head = lib.lm.tokenizer.decode(ids[:3], skip_special_tokens=True)
    stop = full[len(head) : len(head) + 4]
    if not stop.strip() or stop not in full:
        pytest.skip("the tiny model's completion has no usable stop string")
    body = {"model": "kvgraft", "prompt": "The lighthouse", "max_tokens": 8, "stop": [stop]}
    whole = client.post("/v1/completions", json=body).json()
    with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
        streamed = "".join(c["choices"][0]["text"] for c in _events(r.read().decode()))
    assert stop not in whole["choices"][0]["text"] and streamed == whole["choices"][0]["text"]
    assert whole["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 2}, "n"),
        ({"logprobs": 3}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop": 5}, "stop"),
        ({"kvgraft": {"graft": "yes"}}, "kvgraft.graft"),
    ],
)
def test_what_is_not_supported_is_a_400_in_openai_shape(served, extra, param):
    client, *_ = served
    r = client.post("/v1/chat/completions", json=_chat() | extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error" and err["param"] == param


def test_bounds_are_the_chat_bounds(served, monkeypatch):
    client, *_ = served
    too_many = client.post("/v1/chat/completions", json=_chat(max_tokens=33)).json()["error"]
    assert "max_new_tokens must be between 1 and 32" in too_many["message"] and "admin token" in too_many["message"]
    monkeypatch.setenv("KVGRAFT_ANON_NEW_TOKENS", "40")  # the deployment's setting, read per request
    forty = client.post("/v1/completions", json={"model": "kvgraft", "prompt": "Count:", "max_tokens": 40})
    assert forty.status_code == 200 and forty.json()["usage"]["completion_tokens"] <= 40
    over = client.post("/v1/completions", json={"model": "kvgraft", "prompt": "Count:", "max_tokens": 41}).json()["error"]
    assert "max_new_tokens must be between 1 and 40" in over["message"]
    monkeypatch.delenv("KVGRAFT_ANON_NEW_TOKENS")
    check = client.post("/v1/chat/completions", json=_chat(kvgraft={"check": True}))
    assert check.status_code == 403 and check.json()["error"]["type"] == "permission_error"
    assert "check needs the admin token" in check.json()["error"]["message"]
    messages = [{"role": "user", "content": "x"}] * 33
    assert client.post("/v1/chat/completions", json=_chat(messages=messages)).status_code == 400
    long = client.post("/v1/chat/completions", json=_chat(messages=[{"role": "user", "content": "y" * 4001}]))
    assert long.status_code == 400 and "4,000" in long.json()["error"]["message"]
    big = client.post("/v1/completions", content=b"{" + b" " * (300 * 1024) + b"}", headers={"content-type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    assert client.post("/v1/chat/completions", json=_chat(model="gpt-4")).status_code == 404
    last = client.post(
        "/v1/chat/completions", json=_chat(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    )
    assert last.status_code == 400 and "last message" in last.json()["error"]["message"]


def test_the_admin_token_lifts_the_bounds_and_runs_the_check(served):
    client, _, _, art = served
    r = client.post(
        "/v1/chat/completions",
        json=_chat(art, max_tokens=40, kvgraft={"artifacts": [art], "check": True}),
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text
    check = r.json()["kvgraft"]["check"]
    assert check["exact"] is True and check["fresh_sha256"] == check["grafted_sha256"]
    no = client.post("/v1/chat/completions", json=_chat(), headers={"authorization": "Bearer anonymous"})
    assert no.status_code == 200  # a placeholder key is anonymous


def test_graft_false_answers_without_a_graft(served):
    client, *_ = served
    k = client.post("/v1/chat/completions", json=_chat(kvgraft={"graft": False})).json()
    assert k["kvgraft"]["tier"] == "none" and k["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_an_address_over_its_depth_is_refused_at_arrival(served):
    client, server, *_ = served
    from access.guard import Client

    held = [server.admission.reserve(Client(f"other-{i}", "10.0.0.7")) for i in range(4)]
    try:
        r = client.post("/v1/chat/completions", json=_chat())
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        for t in held:
            server.admission.release(t)
    assert client.post("/v1/chat/completions", json=_chat()).status_code == 200


def test_deposits_need_the_admin_token_and_say_the_gate_verdict(served):
    client, _, lib, _ = served
    item = {
        "question": "Who carved the Olvar stone?",
        "solution": "The Olvar stone was carved by Tessa Brin.",
        "answer": "Tessa Brin",
        "verifier": "exact",
        "reference": "Tessa Brin",
    }
    assert client.post("/v1/kvgraft/deposits", json=item).status_code == 401
    wrong = client.post("/v1/kvgraft/deposits", json=item, headers={"authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    ok = client.post("/v1/kvgraft/deposits", json=item, headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200, ok.text
    j = ok.json()
    assert j["verdict"] == "accepted" and j["deposit"]["verified"] is True and lib.show(j["id"]).artifact.id == j["id"]


@pytest.mark.real_gate
def test_a_refused_deposit_is_a_422_with_the_verdict(served):
    client, *_ = served
    item = {
        "question": "Who carved the Pell stone?",
        "solution": "The Pell stone was carved by Ada Brin.",
        "verifier": "exact",
        "reference": "Ada Brin",
    }
    r = client.post("/v1/kvgraft/deposits", json=item, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 422 and r.json()["kvgraft"]["verdict"] == "refused"


def test_metrics_parse_and_count(served):
    client, *_ = served
    client.post("/v1/chat/completions", json=_chat())
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "kvgraft_requests",
        "kvgraft_tokens",
        "kvgraft_grafts",
        "kvgraft_gate",
        "kvgraft_exactness_checks",
        "kvgraft_quarantines",
        "kvgraft_ttft_seconds",
        "kvgraft_request_seconds",
        "kvgraft_queue_depth",
    ):
        assert name in families, sorted(families)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("kvgraft_requests_total", (("outcome", "ok"), ("route", "/v1/chat/completions")))] >= 1
    assert samples[("kvgraft_requests_total", (("outcome", "error_400"), ("route", "/v1/chat/completions")))] >= 1
    assert samples[("kvgraft_tokens_total", (("kind", "decoded"),))] >= 1
    assert samples[("kvgraft_ttft_seconds_count", ())] >= 1
    assert samples[("kvgraft_queue_depth", ())] == 0


def test_every_metric_is_documented_and_every_documented_metric_exists():
    import re
    from pathlib import Path

    from serving.metrics import Metrics

    text = (Path(__file__).resolve().parents[1] / "docs" / "API.md").read_text(encoding="utf-8")
    documented = {re.sub(r"_total$", "", m) for m in re.findall(r"^\| `(kvgraft_\w+)`", text, flags=re.M)}
    families = text_string_to_metric_families(Metrics().render()[0].decode())
    served = {f.name for f in families if not f.name.endswith("_created")}  # the client's own start timestamps
    assert documented == served, documented ^ served


def test_a_client_that_leaves_mid_stream_frees_its_place_and_is_counted(served, tiny_dirs):
    """On a real server (uvicorn on loopback): a streamed answer whose client closes the connection after the
    first event still ends, frees its admission place and is counted."""
    import threading
    import time

    import httpx
    import uvicorn

    from tests.served import free_port

    _, server, _, art = served
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app(server), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not uv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        ok_before = _ok_count(server)
        body = _chat(art, max_tokens=24, stream=True)
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first event, then the client goes away
        deadline = time.monotonic() + 60
        while (server.admission.joined() or _ok_count(server) == ok_before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.admission.joined() == 0 and _ok_count(server) == ok_before + 1
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


def _ok_count(server) -> float:
    value = server.metrics.registry.get_sample_value("kvgraft_requests_total", {"route": "/v1/chat/completions", "outcome": "ok"})
    return value or 0.0
