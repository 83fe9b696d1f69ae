"""Integration tier: the real default model (packaged Gemma 3 270M), loaded once per session.

Ten (artifact, query) samples, exact tier, byte-equal; a sample longer than the 512-token sliding
window and a chain; and a fictional fact the model cannot know, recalled only with its graft.
"""

from __future__ import annotations

import pytest

from graft_core import exactness, generate, templates
from graft_core.capture import capture

pytestmark = pytest.mark.integration

FACTS = [
    (
        "Who built the lighthouse of Varnek Isle?",
        "The lighthouse of Varnek Isle was built by the engineer Osric Pellamy in 1874.",
        "Osric Pellamy",
    ),
    ("What is the capital of the island of Quenmora?", "The capital of the island of Quenmora is Tessaly Port.", "Tessaly Port"),
]
REAL_RELOCATION_BOUND = 1e-3  # max |logit diff| of a relocated graft on the real model (measured 1.7e-4)
QUERIES = ["Who built it?", "What year was it?", "Summarise the fact.", "Where is it?", "Why does it matter?"]


def _ids(lm, text, bos=True):
    return lm.tokenizer(text, add_special_tokens=bos)["input_ids"]


def test_ten_samples_are_byte_equal(real_lm):
    lm = real_lm
    arts = [capture(lm, _ids(lm, templates.item_text(q, s, a)))[0] for q, s, a in FACTS]
    long_text = " ".join(f"Entry {i}: the ship Ardel-{i} carried {i * 7} barrels of salt to Quenmora." for i in range(40))
    long_art, _ = capture(lm, _ids(lm, long_text))
    assert long_art.length > lm.info.sliding_window
    child, _ = capture(lm, _ids(lm, "\nFact: the keeper was Mira Tolland.\n", bos=False), parents=[arts[0]])
    chains = [[arts[0]], [arts[1]], [long_art], [arts[0], child]]
    results = []
    for i in range(10):
        chain = chains[i % len(chains)]
        q = generate.encode_prompt(lm, QUERIES[i % len(QUERIES)], grafted=True)
        c = exactness.check(lm, chain, q, decode_steps=3, monolithic=(i < 2))
        results.append(c)
        assert c.exact, f"sample {i}: max |diff| {c.max_abs_diff}, KL {c.kl}"
        assert c.fresh_sha256 == c.grafted_sha256 and c.kl == 0.0 and c.argmax_agreement == 1.0
    # the monolithic schedule (everything in one forward) is reported beside: under the one definition every
    # row's value is fixed whatever the chunks (kvgraft-f32-v2: each product and attention row in its own
    # order), so it is byte-equal too; under MKL's class (KVGRAFT_LINEAR=torch) it differs
    mono = results[0].monolithic_max_abs_diff
    one_definition = dict(lm.config.numerics).get("numerics") == "kvgraft-f32-v2"
    assert mono is not None and (mono == 0.0 if one_definition else mono > 0), (mono, dict(lm.config.numerics))


def test_fictional_fact_is_recalled_only_with_its_graft(real_lm):
    lm = real_lm
    q, s, a = FACTS[0]
    art, _ = capture(lm, _ids(lm, templates.item_text(q, s, a)))
    with_graft = generate.answer(lm, [art], q, max_new_tokens=16)
    without = generate.answer(lm, [], q, max_new_tokens=16)
    assert a in with_graft.text, with_graft.text
    assert a not in without.text, without.text
    assert with_graft.decode_tokens <= 8
    paraphrase = generate.answer(lm, [art], "Which engineer was the builder of the Varnek Isle lighthouse?", max_new_tokens=16)
    assert a in paraphrase.text, paraphrase.text


def test_relocated_tier_diverges_and_is_labelled(real_lm):
    lm = real_lm
    q, s, a = FACTS[1]
    art, _ = capture(lm, _ids(lm, templates.item_text(q, s, a)))
    r = exactness.check_relocated(lm, art, generate.encode_prompt(lm, q, grafted=True), offset=1000)
    assert r.tier == "relocated" and not r.exact
    assert r.max_abs_diff > 0 and r.fresh_sha256 != r.grafted_sha256
    # bounded, not just labelled: measured max |diff| 1.7e-4, KL 2e-10 at offset 1,000 over 10 samples
    # (docs/bench/relocate.json); a relocation that forgot to re-rotate the keys moves the logits by whole units
    assert r.max_abs_diff <= REAL_RELOCATION_BOUND, f"max |diff| {r.max_abs_diff} over the measured bound"
    assert r.kl <= 1e-8 and r.argmax_agreement == 1.0, r
    # offset 0 through the same relocation path is the artifact's own position: byte-equal
    zero = exactness.check_relocated(lm, art, generate.encode_prompt(lm, q, grafted=True), offset=0)
    assert zero.exact and zero.fresh_sha256 == zero.grafted_sha256, zero.max_abs_diff
