"""The lean one-token forward (graft_core.step): its rows and caches are forward_chunk's, byte for byte."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from graft_core import layers, model, step
from graft_core.forward import forward_chunk, new_cache
from kernels import build

TEXT = "Fact: the lighthouse of Varnek Isle was built by Osric Pellamy in 1874.\n"


def _prompt(lm, n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.model.config.vocab_size, (n,), generator=gen).tolist()


def _step_both_ways(lm, stepper, lengths: list[int], steps: int, restored: bool = False) -> None:
    """Sessions of `lengths` prompt tokens decoded `steps` tokens: through transformers' own cache and
    forward_chunk one at a time, and through the stepper all together; every row and cache byte-equal."""
    plain, ours, frozen = [], [], []
    for i, n in enumerate(lengths):
        ids = _prompt(lm, n, seed=i)
        a, b = DynamicCache(config=lm.model.config), new_cache(lm.model)
        forward_chunk(lm.model, a, ids, 0)
        forward_chunk(lm.model, b, ids, 0)
        if restored:  # the states' own tensors in the cache, as a restore leaves them: they must stay as they are
            states = layers.export_cache(b, 0, n)
            frozen.append([(s.keys, s.keys.clone()) for s in states])
            b = new_cache(lm.model)
            layers.import_cache(b, states)
        plain.append(a)
        ours.append(b)
    toks, pos = [5 + i for i in range(len(lengths))], list(lengths)
    for k in range(steps):
        want = [forward_chunk(lm.model, c, [t], p)[-1] for c, t, p in zip(plain, toks, pos)]
        got = stepper.step(list(zip(ours, toks, pos)))
        for i, (w, g) in enumerate(zip(want, got)):
            assert torch.equal(w, g), f"step {k}, session {i}: max difference {(w - g).abs().max()}"
        toks, pos = [int(torch.argmax(w)) for w in want], [p + 1 for p in pos]
    for a, b in zip(plain, ours):
        assert layers.state_digest(a) == layers.state_digest(b)
    for pairs in frozen:
        assert all(torch.equal(t, before) for t, before in pairs), "a restored tensor was written"


@pytest.mark.parametrize("lengths", [[6], [3, 11, 7], [2, 9, 4, 13, 5, 8, 3, 10, 6]])
def test_steps_are_the_rows_of_forward_chunk(tiny_gemma, lengths):
    stepper = step.Stepper(tiny_gemma.model)
    assert stepper.why == ""
    _step_both_ways(tiny_gemma, stepper, lengths, steps=12)


def test_steps_on_restored_caches_past_the_window_never_write_the_restored_tensors(tiny_gemma):
    _step_both_ways(tiny_gemma, step.Stepper(tiny_gemma.model), [9, 4], steps=20, restored=True)


def test_every_build_steps_to_the_same_bytes(tiny_dirs, monkeypatch):
    for isa in build.runnable():
        monkeypatch.setenv("KVGRAFT_ISA", isa)
        lm = model.load(str(tiny_dirs["gemma3"]))
        stepper = step.Stepper(lm.model)
        assert stepper.why == "" and stepper.isa == isa
        _step_both_ways(lm, stepper, [7, 3], steps=6)


@pytest.mark.parametrize("heads", [3, 2, 1])
def test_llama_steps_with_wide_heads_are_the_rows_of_forward_chunk(tmp_path, heads):
    """SmolLM2's shape of attention (64 values a head, a few query heads per kv head) in a tiny Llama: a step's
    dot products take 16 keys at a time and P.V two lanes a pass (kernels/c/attention.c attend_step), over
    restored rows and the session's own, with the lanes' odd tails (41 and 22 keys, then one more a step)."""
    from graft_core import tiny

    folder = tiny.build("llama", tmp_path / "wide", hidden_size=2 * heads * 64, num_attention_heads=2 * heads, head_dim=64)
    lm = model.load(str(folder))
    stepper = step.Stepper(lm.model)
    assert stepper.why == ""
    _step_both_ways(lm, stepper, [41, 22], steps=7, restored=True)
    _step_both_ways(lm, stepper, [3], steps=2)


def test_torch_products_and_other_caches_take_the_modules_path(tiny_gemma, tiny_gemma_torch):
    assert "fma16" in step.Stepper(tiny_gemma_torch.model).why
    stepper = step.Stepper(tiny_gemma.model)
    cache = DynamicCache(config=tiny_gemma.model.config)  # transformers' own layers: not written in place
    forward_chunk(tiny_gemma.model, cache, _prompt(tiny_gemma, 5, 0), 0)
    assert stepper.step([(cache, 7, 5)]) is None and cache.get_seq_length() == 5


@pytest.mark.parametrize("prompts", [[17], [1, 5, 9], [3, 12, 1, 7]])
def test_prompts_after_a_prefix_are_the_rows_of_forward_chunk(tiny_gemma, prompts):
    """Prompts of several lengths (longer than the tiny model's window of 4, so a sliding layer's window
    moves inside the prompt) and steps, on prefilled and restored caches, in one run: each last row and
    each cache byte-equal to forward_chunk on transformers' own cache."""
    lm, stepper = tiny_gemma, step.Stepper(tiny_gemma.model)
    plain, ours, items = [], [], []
    for i, t in enumerate(prompts):
        prefix, ids = _prompt(lm, 6 + 3 * i, seed=i), _prompt(lm, t, seed=100 + i)
        a, b = DynamicCache(config=lm.model.config), new_cache(lm.model)
        forward_chunk(lm.model, a, prefix, 0)
        forward_chunk(lm.model, b, prefix, 0)
        if i % 2:
            restored = new_cache(lm.model)
            layers.import_cache(restored, layers.export_cache(b, 0, len(prefix)))
            b = restored
        plain.append((a, ids, len(prefix)))
        ours.append(b)
        items.append((b, ids, len(prefix)))
    got = stepper.run(items)
    for i, ((a, ids, start), g) in enumerate(zip(plain, got)):
        w = forward_chunk(lm.model, a, ids, start)[-1]
        assert torch.equal(w, g), f"prompt {i}: max difference {(w - g).abs().max()}"
    for (a, _, _), b in zip(plain, ours):
        assert layers.state_digest(a) == layers.state_digest(b)


def test_real_steps_are_the_rows_of_forward_chunk(real_lm):
    from graft_core import batch

    lean = batch.lean(real_lm.model)  # the model as the app loads it (from its GGUF blocks) takes the lean path
    assert lean is not None and lean.stepper is not None, lean and lean.why
    window = real_lm.info.sliding_window
    _step_both_ways(real_lm, step.Stepper(real_lm.model), [window + 3, 40], steps=4, restored=True)


def test_sessions_grafting_one_state_share_its_rows_and_each_steps_as_alone(tiny_gemma):
    """Three caches restored from the same states (one artifact grafted by three answers): the lean step reads
    the restored rows in place, one copy for all three (never written), while each session's own rows go into
    its buffers; every row equals forward_chunk's on a cache of its own, past the sliding window (the shared
    rows leave it first), and reading `keys` mid-way (transformers' modules, capture) joins the rows into the
    session's own buffers without changing a byte of what follows."""
    lm, stepper = tiny_gemma, step.Stepper(tiny_gemma.model)
    prefix = _prompt(lm, 11, seed=3)
    src = new_cache(lm.model)
    forward_chunk(lm.model, src, prefix, 0)
    states = layers.export_cache(src, 0, len(prefix))
    before = [(s.keys.clone(), s.values.clone()) for s in states]
    plain, ours = [], []
    for _ in range(3):
        a = DynamicCache(config=lm.model.config)
        forward_chunk(lm.model, a, prefix, 0)
        b = new_cache(lm.model)
        layers.import_cache(b, states)
        plain.append(a)
        ours.append(b)
    toks, pos = [5, 9, 14], [len(prefix)] * 3
    sliding = layers.sliding_flags(ours[0])
    for k in range(9):
        want = [forward_chunk(lm.model, c, [t], p)[-1] for c, t, p in zip(plain, toks, pos)]
        got = stepper.step(list(zip(ours, toks, pos)))
        for i, (w, g) in enumerate(zip(want, got)):
            assert torch.equal(w, g), f"step {k}, session {i}: max difference {(w - g).abs().max()}"
        if k == 0:  # after the first step every full layer reads the states' own tensors, the same for all three
            for li, slides in enumerate(sliding):
                if not slides:
                    assert all(c.layers[li]._rows.base_k is states[li].keys for c in ours)
                    assert all(c.layers[li]._rows.end - c.layers[li]._rows.start == 1 for c in ours)  # its own row only
        if k == 3:  # a reader of `keys` joins one session's rows; it steps on to the same bytes
            assert torch.equal(ours[1].layers[2].keys, plain[1].layers[2].keys)
            assert ours[1].layers[2]._rows.base_k is None and ours[0].layers[2]._rows.base_k is not None
        toks, pos = [int(torch.argmax(w)) for w in want], [p + 1 for p in pos]
    for li, slides in enumerate(sliding):  # past the window of 4 every sliding layer holds only its own rows
        assert not slides or all(c.layers[li]._rows.base_k is None for c in ours)
    for a, b in zip(plain, ours):
        assert layers.state_digest(a) == layers.state_digest(b)
    for s, (k, v) in zip(states, before):
        assert torch.equal(s.keys, k) and torch.equal(s.values, v), "a shared tensor was written"
