"""What real clients of the OpenAI API expect, on the tiny model through Starlette's test client: log-probabilities
read off the answer's own logits (equal to the in-process rows, the same bytes twice), echo with max_tokens 0,
prompts as token ids and batches of prompts (lm-evaluation-harness's requests), the decoded continuation exactly,
`GET /v1/models/{id}`, and OpenAI's error shape for every /v1 404 and 405."""

from __future__ import annotations

import math

import pytest
import torch
from starlette.testclient import TestClient

import services
from access.admission import Admission
from access.guard import FairTurns, Guard
from retrieval import HashEmbedder
from serving.openai_api import OpenAIServer, app
from serving.openai_shapes import model_id

TOKEN = "logprobs-admin-token"
PROMPT = "The lighthouse keeper wrote"
NO_GRAFT = {"graft": False}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_gemma):
    lib = services.Library(home=tmp_path_factory.mktemp("lp") / "home", lm=tiny_gemma, embedder=HashEmbedder())
    lib.deposit_text("The Varnek lighthouse was built by Osric Pellamy in 1874.", attested_by="test", admin=True)
    guard = Guard(TOKEN, turns=FairTurns(per_address=1, slots=1, depth=4))
    server = OpenAIServer(lib, guard, Admission(per_session=1, depth=4))
    with TestClient(app(server), client=("10.0.0.8", 5000)) as client:
        yield client, lib
    lib.close()


def _complete(client, **kw) -> dict:
    body = {"model": "kvgraft", "prompt": PROMPT, "max_tokens": 4, "kvgraft": NO_GRAFT} | kw
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _in_process(lm, ids: list[int]) -> torch.Tensor:
    """Every position's log-softmax of `ids` forwarded from scratch in this process, float64."""
    from graft_core.forward import forward_chunk, new_cache

    with torch.inference_mode():
        rows = forward_chunk(lm.model, new_cache(lm.model), ids, 0, all_logits=True)
    rows = rows.reshape(len(ids), -1).to(torch.float64)
    return rows - torch.logsumexp(rows, dim=1, keepdim=True)


def test_echo_with_no_new_token_gives_the_prompts_logprobs_as_computed_in_process(served):
    """lm-evaluation-harness's loglikelihood: the prompt's own tokens scored. Each value equals the log-softmax of
    the row a fresh in-process forward computes for that position (==, not close), the first token has none, and
    the same request twice gives the same bytes."""
    client, lib = served
    j = _complete(client, max_tokens=0, echo=True, logprobs=2)
    again = _complete(client, max_tokens=0, echo=True, logprobs=2)
    assert j["choices"] == again["choices"]
    lp = j["choices"][0]["logprobs"]
    ids = lib.lm.tokenizer(PROMPT)["input_ids"]  # raw, nothing grafted: BOS and the prompt
    assert j["usage"]["completion_tokens"] == 0 and j["choices"][0]["text"] == PROMPT
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = _in_process(lib.lm, ids)
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == float(ref[i - 1, ids[i]]), i
        best = torch.topk(ref[i - 1], 2)
        top = lp["top_logprobs"][i]  # token text -> value: two tokens of one text keep the likelier one's
        assert max(top.values()) == float(best.values[0]) and set(top.values()) <= {float(v) for v in best.values}, i
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_generated_tokens_carry_the_logprob_of_the_row_that_chose_them(served):
    """Greedy decoding picks each row's argmax: every generated token's value is its row's best, and the
    alternatives are the row's top in order; chat reports the same numbers in its own shape."""
    client, lib = served
    j = _complete(client, max_tokens=5, logprobs=3)
    lp = j["choices"][0]["logprobs"]
    ids = j["kvgraft"]["output_token_ids"]
    assert len(lp["token_logprobs"]) == len(ids) == j["usage"]["completion_tokens"]
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert value == max(top.values()) and len(top) <= 3 and value <= 0
    prompt_ids = lib.lm.tokenizer(PROMPT)["input_ids"]
    ref = _in_process(lib.lm, prompt_ids + ids)
    assert lp["token_logprobs"] == [float(ref[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(ids)]
    chat = client.post(
        "/v1/chat/completions",
        json={"model": "kvgraft", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "logprobs": True}
        | {"top_logprobs": 2, "kvgraft": NO_GRAFT},
    ).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"] and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["logprob"] == c["top_logprobs"][0]["logprob"] and bytes(c["bytes"]).decode() == c["token"] for c in content)
    assert math.isclose(sum(math.exp(t["logprob"]) for t in content[0]["top_logprobs"]), 1.0) is False  # two of many


def test_the_harness_request_scores_the_continuation_after_its_context(served):
    """What lm-evaluation-harness's local-completions sends for a loglikelihood: token ids, echo, max_tokens 1,
    logprobs 1; it reads token_logprobs[ctxlen:-1] and compares each with its top's best (is it greedy)."""
    client, lib = served
    tok = lib.lm.tokenizer
    context, continuation = tok("The lighthouse", add_special_tokens=False)["input_ids"], tok(" keeper")["input_ids"][1:]
    ids = context + continuation
    j = _complete(client, prompt=[ids], max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234)
    lp = j["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt's, then the one new token's
    scored = lp["token_logprobs"][len(context) : -1]
    ref = _in_process(lib.lm, ids)
    assert scored == [float(ref[len(context) - 1 + i, t]) for i, t in enumerate(continuation)]
    greedy = all(v == max(t.values()) for v, t in zip(scored, lp["top_logprobs"][len(context) : -1], strict=True))
    assert greedy == all(int(torch.argmax(ref[len(context) - 1 + i])) == t for i, t in enumerate(continuation))


def test_token_ids_and_batches_answer_as_the_same_prompts_alone(served):
    """A prompt given as its token ids answers as its text does; a batch of prompts (strings or id lists) gives one
    choice per prompt, in order, each what that prompt gets alone, with the usage summed."""
    client, lib = served
    alone = [_complete(client, prompt=p) for p in (PROMPT, "Once upon a time")]
    ids = lib.lm.tokenizer(PROMPT)["input_ids"]
    by_ids = _complete(client, prompt=ids)
    assert by_ids["kvgraft"]["output_token_ids"] == alone[0]["kvgraft"]["output_token_ids"]
    batch = _complete(client, prompt=[PROMPT, "Once upon a time"])
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert [c["text"] for c in batch["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert batch["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    ids_batch = _complete(client, prompt=[ids, lib.lm.tokenizer("Once upon a time")["input_ids"]])
    assert [c["text"] for c in ids_batch["choices"]] == [c["text"] for c in batch["choices"]]


def test_a_completion_is_the_decoded_continuation_exactly(served):
    """Nothing stripped: the text is what the generated tokens decode to, spaces and newlines kept, whole and
    streamed alike."""
    client, lib = served
    j = _complete(client, max_tokens=8)
    text = j["choices"][0]["text"]
    assert text == lib.lm.tokenizer.decode(j["kvgraft"]["output_token_ids"], skip_special_tokens=True)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": [[1, 2], [True]], "max_tokens": 1}, "prompt"),
        ({"prompt": [], "max_tokens": 1}, "prompt"),
        ({"prompt": [10**9], "max_tokens": 1}, None),  # outside the vocabulary: the library's message
        ({"prompt": PROMPT, "max_tokens": 0}, None),  # no token asked for, and no echo
        ({"prompt": [PROMPT] * 17, "max_tokens": 1}, "prompt"),
        ({"prompt": PROMPT, "logprobs": 21}, "logprobs"),
        ({"prompt": PROMPT, "echo": "yes"}, "echo"),
        ({"prompt": PROMPT, "logprobs": 1, "stream": True}, "stream"),
        ({"prompt": PROMPT, "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_what_a_completions_request_cannot_ask_is_a_400_saying_so(served, body, param):
    client, _ = served
    r = client.post("/v1/completions", json={"model": "kvgraft", "kvgraft": NO_GRAFT} | body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_models_retrieve_and_every_unknown_route_or_method_speak_openais_error_shape(served):
    client, lib = served
    mid = model_id(lib)
    assert client.get(f"/v1/models/{mid}").json() == {"id": mid, "object": "model", "created": 0, "owned_by": "kvgraft"}
    assert client.get("/v1/models/kvgraft").status_code == 200
    for method, path, status in (
        ("GET", "/v1/models/gpt-4", 404),
        ("GET", "/v1/nothing", 404),
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v1/completions", 405),
        ("DELETE", "/v1/chat/completions", 405),
    ):
        r = client.request(method, path)
        assert r.status_code == status, (method, path, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], (method, path)
    assert "POST" in client.get("/v1/completions").headers["allow"]
