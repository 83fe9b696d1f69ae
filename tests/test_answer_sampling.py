"""An answer's decoding options (what the OpenAI-compatible API hands through): seeded sampling with
temperature and top_p, stop strings, and the streamed text ending as the finished answer. On the tiny model."""

from __future__ import annotations

import pytest

import services
from errors import InvalidInput
from retrieval import HashEmbedder
from services import AnswerOptions

FACT = "The Varnek lighthouse was built by Osric Pellamy in 1874."


@pytest.fixture
def lib(tmp_path, tiny_gemma):
    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    lib.art = lib.deposit_text(FACT).id
    yield lib
    lib.close()


def _ids(lib, **kw) -> tuple[int, ...]:
    return lib.answer(
        "Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, max_new_tokens=8, **kw)
    ).output_token_ids


def test_a_seed_draws_the_same_tokens_and_seeds_differ(lib):
    a = _ids(lib, temperature=1.0, seed=7)
    assert a == _ids(lib, temperature=1.0, seed=7)
    others = {_ids(lib, temperature=1.0, seed=s) for s in (8, 9, 10)}
    assert any(o != a for o in others), "four seeds drew the same 8 tokens from a random model"
    greedy = _ids(lib)
    assert any(o != greedy for o in (a, *others)), "sampling at temperature 1 chose the greedy tokens every time"


def test_temperature_zero_is_greedy_and_a_tiny_nucleus_is_the_argmax(lib):
    greedy = lib.answer("Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, max_new_tokens=8))
    assert greedy.seed is None and greedy.to_json()["seed"] is None and greedy.to_json()["temperature"] == 0.0
    nucleus = lib.answer(
        "Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, max_new_tokens=8, temperature=1.0, top_p=1e-9, seed=3)
    )
    assert nucleus.output_token_ids == greedy.output_token_ids  # the nucleus holds the most likely token only
    assert nucleus.logits_sha256 == greedy.logits_sha256
    j = nucleus.to_json()
    assert (j["temperature"], j["top_p"], j["seed"]) == (1.0, 1e-9, 3)
    assert services.AnswerResult.from_json(j).seed == 3


def test_a_missing_seed_is_drawn_and_reported_and_replay_draws_the_same(lib):
    r = lib.answer("Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, max_new_tokens=6, temperature=0.9))
    assert isinstance(r.seed, int)
    again = lib.answer(
        "Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, max_new_tokens=6, temperature=0.9, seed=r.seed)
    )
    assert again.output_token_ids == r.output_token_ids
    rep = services.replay_ledger(lib, last=2)
    assert rep.ok and rep.matched == 2, rep.to_json()


def test_a_stop_string_ends_decoding_and_is_left_out(lib):
    lm = lib.lm
    full = lib.answer("Who built?", AnswerOptions(artifact=lib.art, max_new_tokens=12, raw=True))
    tokens = list(full.output_token_ids)
    assert len(tokens) >= 4, full
    # a stop string the completion reaches after its third token
    head = lm.tokenizer.decode(tokens[:2], skip_special_tokens=True)
    third = lm.tokenizer.decode(tokens[:3], skip_special_tokens=True)[len(head) :]
    if not third.strip():
        pytest.skip("the tiny model's third token decodes to whitespace")
    stop = third.strip()[:3]
    cut = lib.answer("Who built?", AnswerOptions(artifact=lib.art, max_new_tokens=12, raw=True, stop=(stop,)))
    assert cut.stopped == "stop" and len(cut.output_token_ids) < len(tokens)
    assert stop not in cut.answer
    completion = lm.tokenizer.decode(list(cut.output_token_ids), skip_special_tokens=True)
    assert cut.answer == completion[: completion.find(stop)].strip()


def test_the_streamed_text_ends_as_the_answer(lib):
    seen: list[str] = []
    r = lib.answer(
        "Who built the Varnek lighthouse?",
        AnswerOptions(artifact=lib.art, max_new_tokens=8, temperature=1.0, seed=5, stop=("zz",)),
        on_token=seen.append,
    )
    assert seen and seen[-1] == r.answer and len(seen) == len(r.output_token_ids)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"temperature": True},
        {"top_p": 0},
        {"top_p": 1.5},
        {"seed": -1},
        {"stop": ("a",) * 5},
        {"stop": ("x" * 65,)},
        {"stop": ("",)},
        {"stop": ("a\x00",)},
        {"stop": ["a"]},
    ],
)
def test_decoding_options_out_of_bounds_are_refused_before_any_work(lib, bad):
    with pytest.raises(InvalidInput):
        lib.answer("Who built the Varnek lighthouse?", AnswerOptions(artifact=lib.art, **bad))


def test_options_round_trip_through_json():
    o = AnswerOptions(temperature=0.5, top_p=0.9, seed=4, stop=("\n", "Q:"))
    assert AnswerOptions.from_json(o.to_json()) == o


def test_a_whitespace_stop_string_is_a_stop_string(lib):
    r = lib.answer("Who built?", AnswerOptions(artifact=lib.art, max_new_tokens=4, raw=True, stop=("\n", " ")))
    assert "\n" not in r.answer and " " not in r.answer


def test_settled_holds_back_what_later_tokens_may_change():
    from graft_core.templates import settled

    assert settled("Paris is\ufffd") == "Paris is"  # half a character
    assert settled("Paris ") == "Paris"  # a trailing space is stripped unless text follows
    assert settled("one two th", ("three",)) == "one two"  # the start of a stop string
    assert settled("one two t", ("xt", "three")) == "one two"
    assert settled("one two", ("three",)) == "one two"
    # a raw continuation keeps its spaces: only a half character and the start of a stop string wait
    assert settled("Paris \ufffd", raw=True) == "Paris " and settled("one two th", ("three",), raw=True) == "one two "


@pytest.mark.parametrize("raw", [True, False])
def test_the_growing_text_is_the_answers_text_even_where_the_completion_opens_on_a_space(raw):
    from types import SimpleNamespace

    from graft_core import templates
    from services.answer import AnswerPipeline

    pieces = [" Osric", " Pellamy", "\n", "Question"]
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "".join(pieces[i] for i in ids))
    pipeline = AnswerPipeline.__new__(AnswerPipeline)
    pipeline._lm = lambda: SimpleNamespace(tokenizer=tokenizer)
    seen: list[str] = []
    callback = pipeline._token_callback(seen.append, raw)
    for i in range(len(pieces)):
        callback(i)
    assert seen[-1] == templates.answer_text("".join(pieces), raw)  # what the finished answer's text is
    if raw:  # a raw continuation is the decoded text exactly, its spaces and newlines kept
        assert seen == ["".join(pieces[: i + 1]) for i in range(len(pieces))]
    else:
        assert all(s == s.strip() for s in seen)
