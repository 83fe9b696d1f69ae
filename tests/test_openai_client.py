"""The official `openai` client against the web app's OpenAI-compatible API on the real default model: a real
server on a free loopback port (`server.serve`, the product's launch), chat and completions, whole and
streamed; the deposit over HTTP through the real gate; the proof and cached tokens in every response."""

from __future__ import annotations

import httpx
import pytest

from tests.served import serve

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")

TOKEN = "integration-admin-token"


@pytest.fixture(scope="module")
def server(real_lm, tmp_path_factory):
    import server
    import services
    from retrieval import HashEmbedder
    from services import seed
    from serving.openai_shapes import model_id

    lib = services.Library(home=tmp_path_factory.mktemp("openai-real"), lm=real_lm, embedder=HashEmbedder())
    demo = server.build(lib, admin_token=TOKEN)
    serve(demo)
    item = seed.seed_items()[0][0]
    base = demo.local_url.rstrip("/") + "/v1"
    try:
        yield base, model_id(lib), item, lib
    finally:
        demo.close()
        lib.close()


@pytest.fixture(scope="module")
def deposited(server):
    base, _, item, _ = server
    fields = {k: item[k] for k in ("question", "solution", "answer", "verifier", "reference")}
    r = httpx.post(base + "/kvgraft/deposits", json=fields, headers={"authorization": f"Bearer {TOKEN}"}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "accepted"
    return r.json()["id"]


def _client(base: str, key: str = "anonymous"):
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)


def test_models_and_chat_whole_and_streamed_are_the_same_bytes(server, deposited):
    base, mid, item, lib = server
    client = _client(base)
    assert [m.id for m in client.models.list()] == [mid]
    messages = [{"role": "user", "content": item["question"]}]
    whole = client.chat.completions.create(model=mid, messages=messages, max_tokens=16)
    k = whole.model_extra["kvgraft"]
    assert k["tier"] == "exact" and k["artifact_ids"][-1] == deposited and k["state_proof"]["passed"] is True
    assert whole.usage.prompt_tokens_details.cached_tokens == k["grafted_tokens"] == lib.show(deposited).artifact.end_pos
    assert whole.choices[0].message.content.strip().rstrip(".") == item["answer"], whole.choices[0].message.content
    pieces, last = [], None
    for chunk in client.chat.completions.create(model=mid, messages=messages, max_tokens=16, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        last = chunk
    assert "".join(pieces).encode() == whole.choices[0].message.content.encode()
    assert last.model_extra["kvgraft"]["output_token_ids"] == k["output_token_ids"]
    assert last.model_extra["kvgraft"]["logits_sha256"] == k["logits_sha256"]
    assert last.usage.prompt_tokens_details.cached_tokens == k["grafted_tokens"]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason


def test_completions_whole_and_streamed_with_sampling_and_the_admin_check(server, deposited):
    base, mid, item, lib = server
    admin = _client(base, TOKEN)
    args = dict(model=mid, prompt=f"Question: {item['question']}\nAnswer:", max_tokens=12, temperature=0.7, seed=3, stop=["\n"])
    ext = {"kvgraft": {"artifacts": [deposited], "check": True}}
    whole = admin.completions.create(**args, extra_body=ext)
    k = whole.model_extra["kvgraft"]
    assert k["check"]["exact"] is True and k["check"]["fresh_sha256"] == k["check"]["grafted_sha256"]
    assert k["sampling"] == {"temperature": 0.7, "top_p": 1.0, "seed": 3} and "\n" not in whole.choices[0].text
    streamed = list(admin.completions.create(**args, extra_body=ext, stream=True))
    assert "".join(c.choices[0].text for c in streamed).encode() == whole.choices[0].text.encode()
    assert streamed[-1].model_extra["kvgraft"]["output_token_ids"] == k["output_token_ids"]
    plain = dict(model=mid, prompt=f"Question: {item['question']}\nAnswer:", max_tokens=12)  # greedy, no stop: opens on a space
    whole = _client(base).completions.create(**plain)
    streamed = list(_client(base).completions.create(**plain, stream=True))
    assert "".join(c.choices[0].text for c in streamed).encode() == whole.choices[0].text.encode()
    decoded = lib.lm.tokenizer.decode(whole.model_extra["kvgraft"]["output_token_ids"], skip_special_tokens=True)
    assert whole.choices[0].text == decoded and decoded.startswith(" ")  # the continuation exactly, its space kept


def test_logprobs_and_an_echoed_prompt_through_the_client(server):
    """The client's own types read what the legacy completions and chat return: the prompt scored (echo,
    max_tokens 0) with each value the row's, the same twice; chat's per-token entries."""
    base, mid, item, _ = server
    client = _client(base)
    prompt = f"Question: {item['question']}\nAnswer:"
    one = client.completions.create(
        model=mid, prompt=prompt, max_tokens=0, echo=True, logprobs=1, extra_body={"kvgraft": {"graft": False}}
    )
    two = client.completions.create(
        model=mid, prompt=prompt, max_tokens=0, echo=True, logprobs=1, extra_body={"kvgraft": {"graft": False}}
    )
    lp = one.choices[0].logprobs
    assert one.choices[0].text == prompt and lp.token_logprobs[0] is None and len(lp.tokens) == one.usage.prompt_tokens
    assert lp.token_logprobs == two.choices[0].logprobs.token_logprobs and all(v < 0 for v in lp.token_logprobs[1:])
    chat = client.chat.completions.create(
        model=mid, messages=[{"role": "user", "content": item["question"]}], max_tokens=4, logprobs=True, top_logprobs=2
    )
    entries = chat.choices[0].logprobs.content
    assert len(entries) == chat.usage.completion_tokens and all(e.logprob == e.top_logprobs[0].logprob for e in entries)
    assert client.models.retrieve(mid).id == mid


def test_what_is_not_supported_raises_the_clients_bad_request(server):
    base, mid, *_ = server
    with pytest.raises(openai.BadRequestError) as e:
        _client(base).chat.completions.create(model=mid, messages=[{"role": "user", "content": "hi"}], n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.AuthenticationError):
        _client(base, "not-the-token").completions.create(model=mid, prompt="x", extra_body={"kvgraft": {"check": True}})


def test_metrics_are_served_on_the_page_port(server, deposited):
    from prometheus_client.parser import text_string_to_metric_families

    base, *_ = server
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=30).text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"kvgraft_requests", "kvgraft_gate", "kvgraft_ttft_seconds"} <= names
