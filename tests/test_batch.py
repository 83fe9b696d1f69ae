"""graft_core.batch: several sessions' decode steps in one pass give each session's own rows and caches, byte for byte."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from graft_core import batch, stepgroup
from graft_core.forward import forward_chunk, new_cache
from kernels import fma16
from services import AnswerOptions

# Each tiny test runs on both product paths: fma16 (kernels/fma16.py: AVX-512, AVX2 or portable C, the same bits) and
# torch's MKL products with the checked widths and stacked sizes (KVGRAFT_LINEAR=torch).
BOTH = pytest.mark.parametrize("which", ["tiny_gemma", "tiny_gemma_torch"], ids=["fma16", "torch"])


def _sessions(lm, lengths: list[int], seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for n in lengths:
        cache = new_cache(lm.model)
        ids = torch.randint(3, lm.model.config.vocab_size, (n,), generator=gen).tolist()
        if ids:  # 0: an empty cache (a first prompt goes into it)
            forward_chunk(lm.model, cache, ids, 0)
        caches.append(cache)
    return caches


def _same_cache(a, b) -> bool:
    return all(
        x.keys.numpy().tobytes() == y.keys.numpy().tobytes() and x.values.numpy().tobytes() == y.values.numpy().tobytes()
        for x, y in zip(a.layers, b.layers, strict=True)
    )


def _decode_both_ways(lm, b: batch.Batcher, lengths: list[int], steps: int) -> tuple[bool, int]:
    """Greedy-decode every session `steps` tokens alone and together; (all rows and caches byte-equal, passes taken together)."""
    caches = _sessions(lm, lengths)
    alone, together = [copy.deepcopy(c) for c in caches], [copy.deepcopy(c) for c in caches]
    tok_a = tok_t = [7 + i for i in range(len(lengths))]
    pos = list(lengths)
    passes = 0
    real_step = b._step

    def counting(sessions):
        nonlocal passes
        passes += 1
        return real_step(sessions)

    b._step = counting
    equal = True
    try:
        for _ in range(steps):
            rows_a = [forward_chunk(lm.model, alone[i], [tok_a[i]], pos[i])[-1] for i in range(len(lengths))]
            rows_t = b.step([batch.Session(together[i], tok_t[i], pos[i]) for i in range(len(lengths))])
            equal &= all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(rows_a, rows_t, strict=True))
            tok_a = [int(torch.argmax(r)) for r in rows_a]
            tok_t = [int(torch.argmax(r)) for r in rows_t]
            pos = [p + 1 for p in pos]
        equal &= all(_same_cache(x, y) for x, y in zip(alone, together, strict=True))
    finally:
        b._step = real_step
    return equal, passes


def assert_grafts_exactly_and_batches(lm) -> None:
    """A real model's two promises on one short fact: grafted equals fresh (bytes and tokens), and sessions decoded
    together equal each decoded alone."""
    from graft_core import exactness
    from graft_core.capture import capture

    fact = lm.tokenizer("Fact: the lighthouse of Varnek Isle was built by Osric Pellamy in 1874.\n")["input_ids"]
    art, _ = capture(lm, list(fact))
    got = exactness.check(lm, [art], [7, 8, 9], decode_steps=3)
    assert got.exact and got.tokens_equal, got
    equal, passes = _decode_both_ways(lm, batch.Batcher(lm.model), [5, 9, 3], steps=2)
    assert equal and passes == 2


@BOTH
@pytest.mark.parametrize("lengths", [[5, 9], [3, 12, 7], [6, 2, 11, 4, 9], [3, 5, 7, 9, 11, 13, 15, 17, 19, 21]])
def test_tiny_sessions_decoded_together_match_each_alone(request, which, lengths):
    lm = request.getfixturevalue(which)
    b = batch.Batcher(lm.model)
    assert bool(b.fma16) == (which == "tiny_gemma" and not fma16.why_not())
    equal, passes = _decode_both_ways(lm, b, lengths, steps=4)
    assert equal
    if b.widths:  # on a machine where no width is checked equal, sessions step alone (and still match)
        assert passes == 4 * -(-len(lengths) // b.most)  # one pass per step per group of up to `most` sessions


def test_a_width_whose_columns_differ_is_not_used(tiny_gemma_torch, monkeypatch):
    real_mm = torch.mm

    def mm(a, b):
        out = real_mm(a, b)
        if b.dim() == 2 and b.shape[1] == 8:  # 8 padded columns compute one other bit
            out = out.clone()
            out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf")))
        return out

    monkeypatch.setattr(batch.torch, "mm", mm)
    b = batch.Batcher(tiny_gemma_torch.model)
    assert 8 not in b.widths


def _row_by_row_products(monkeypatch, lm):
    """Every torch product computed one row at a time (each row the 1-row product's bytes; the model's linears
    too, which load() may have given other products for some row counts), so the products' width and stacking
    checks pass on any CPU and what is left to measure is the rest of the pass."""
    real = F.linear

    def linear(x, w, b=None):
        rows = x.reshape(-1, x.shape[-1])
        out = torch.cat([real(rows[i : i + 1], w, b) for i in range(rows.shape[0])]) if rows.shape[0] else real(rows, w, b)
        return out.reshape(*x.shape[:-1], w.shape[0])

    monkeypatch.setattr(F, "linear", linear)
    monkeypatch.setattr(batch, "column_product", lambda w, x, width: linear(x, w))
    for lin in batch._linears(lm.model):
        monkeypatch.setattr(lin, "forward", lambda x, lin=lin: linear(x, lin.weight, lin.bias))


def _nudge_rows(monkeypatch, lm, at: int):
    """Make one layer's last norm compute other bits in its row `at` of a stacked input: a row-position
    dependence in the elementwise rest of a pass (vector code that treats a tail, or another row count,
    otherwise), which the products' width checks cannot see."""
    norm = lm.model.model.layers[0].post_feedforward_layernorm
    real = norm.forward

    def forward(x):
        out = real(x)
        if x.dim() == 3 and x.shape[1] > at:
            out = out.clone()
            out[0, at] *= 1.001
        return out

    monkeypatch.setattr(norm, "forward", forward)


def test_a_pass_whose_rows_differ_from_alone_is_not_used(tiny_gemma_torch, monkeypatch):
    """The Batcher measures whole passes before it batches: where a pass of 3 sessions changes a bit that
    stepping alone does not, decoding together is off (and says why), and every session still gets its own bytes."""
    _row_by_row_products(monkeypatch, tiny_gemma_torch)
    assert batch.Batcher(tiny_gemma_torch.model).widths == (4, 8)  # unfaulted, the whole passes agree
    _nudge_rows(monkeypatch, tiny_gemma_torch, at=2)
    b = batch.Batcher(tiny_gemma_torch.model)
    assert b.widths == () and b.most == 1 and b.stack_sizes == frozenset()
    assert b.why == "a batched decode pass differed from stepping alone on this machine (3 sessions)"
    assert b.describe().startswith("one by one: a batched decode pass differed")
    equal, passes = _decode_both_ways(tiny_gemma_torch, b, [5, 9, 12, 4], steps=2)
    assert equal and passes == 0
    # the fault is real: a Batcher that skipped the measurement would have served other bytes
    forced = batch.Batcher.__new__(batch.Batcher)
    forced.__dict__.update({k: v for k, v in b.__dict__.items() if k != "_step"}, widths=(4, 8))
    assert not _decode_both_ways(tiny_gemma_torch, forced, [5, 9, 12, 4], steps=2)[0]


def test_stacked_prompts_whose_rows_differ_run_alone_and_steps_still_batch(tiny_gemma_torch, monkeypatch):
    _row_by_row_products(monkeypatch, tiny_gemma_torch)
    assert batch.Batcher(tiny_gemma_torch.model).stack_sizes  # unfaulted, stacked passes agree
    _nudge_rows(monkeypatch, tiny_gemma_torch, at=20)  # no decode pass has 21 rows; stacked prompts do
    b = batch.Batcher(tiny_gemma_torch.model)
    assert b.widths and b.stack_sizes == frozenset()
    assert b.why.startswith("prompts run alone: a stacked pass differed from each prompt alone on this machine (0 steps")
    assert "prompts alone" in b.describe()
    same, passes, _ = _steps_and_prompts_both_ways(tiny_gemma_torch, [5, 9, 12], [4, 7], [16, 13], batcher=b)
    assert same and 5 not in passes  # no pass took steps and prompts together


def test_models_outside_gemma3_and_the_defined_llama_family_step_one_by_one(tiny_outside):
    b = batch.Batcher(tiny_outside.model)
    assert not b.supported() and b.widths == () and b.most == 1 and "not a Gemma 3" in b.why
    equal, passes = _decode_both_ways(tiny_outside, b, [4, 6, 3], steps=2)
    assert equal and passes == 0


def test_real_sessions_past_the_window_decoded_together_match_each_alone(real_lm):
    b = batch.Batcher(real_lm.model)
    window = real_lm.info.sliding_window
    equal, passes = _decode_both_ways(real_lm, b, [window + 90, 40, window - 1, 300, 7], steps=3)
    assert equal
    if b.widths:
        assert passes == 3


def test_a_step_group_takes_waiting_sessions_in_one_pass_with_their_own_bytes(tiny_gemma):
    b = batch.Batcher(tiny_gemma.model)
    if not b.widths:
        pytest.skip(f"no padded width here: {b.why}")
    lengths, steps = [5, 9, 3, 12], 5
    caches = _sessions(tiny_gemma, lengths)
    alone = [copy.deepcopy(c) for c in caches]
    expected = []
    for i, c in enumerate(alone):
        tok, rows = 7 + i, []
        for k in range(steps):
            rows.append(forward_chunk(tiny_gemma.model, c, [tok], lengths[i] + k)[-1])
            tok = int(torch.argmax(rows[-1]))
        expected.append(rows)
    group = stepgroup.StepGroup(b, wait_s=30.0)  # everyone registers before stepping: passes never time out
    start = threading.Barrier(len(lengths))
    got: list = [None] * len(lengths)

    def run(i: int) -> None:
        with group.session() as step:
            start.wait()
            tok, rows = 7 + i, []
            for k in range(steps):
                rows.append(step(caches[i], tok, lengths[i] + k))
                tok = int(torch.argmax(rows[-1]))
            got[i] = rows

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lengths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in got)
    assert all(
        x.numpy().tobytes() == y.numpy().tobytes() for e, g in zip(expected, got, strict=True) for x, y in zip(e, g, strict=True)
    )
    assert all(_same_cache(x, y) for x, y in zip(alone, caches, strict=True))
    assert (group.passes, group.steps) == (steps, steps * len(lengths))  # every step of all four in one pass


def test_a_failing_pass_fails_every_session_in_it(tiny_gemma, monkeypatch):
    b = batch.Batcher(tiny_gemma.model)
    monkeypatch.setattr(b, "step", lambda sessions: (_ for _ in ()).throw(RuntimeError("pass failed")))
    group = stepgroup.StepGroup(b, wait_s=0.01)
    with group.session() as step, pytest.raises(RuntimeError, match="pass failed"):
        step(new_cache(tiny_gemma.model), 7, 0)
    assert group.pending == [] and group.active == 0


def test_concurrent_answers_are_byte_identical_to_each_answer_alone(tmp_path, tiny_gemma):
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    try:
        assert lib.decode_group() is None  # not before a serving process starts it
        lib.start_decoding_together()
        ids = [lib.deposit_text(f"Fact {i}: the harbour of Quenmora{i} has {i * 7 + 3} cranes.\n").id for i in range(4)]
        questions = [f"How many cranes has the harbour of Quenmora{i}?" for i in range(4)]
        alone = [
            lib.answer(q, AnswerOptions(artifact=a, max_new_tokens=12, record=False)) for q, a in zip(questions, ids, strict=True)
        ]
        together: list = [None] * 4

        def ask(i: int) -> None:
            together[i] = lib.answer(questions[i], AnswerOptions(artifact=ids[i], max_new_tokens=12, record=False))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for a, t in zip(alone, together, strict=True):
            assert t is not None and t.tier == a.tier == "exact"
            assert (t.output_sha256, t.logits_sha256, t.answer) == (a.output_sha256, a.logits_sha256, a.answer)
        group = lib.decode_group()
        assert group is None or (group.active == 0 and not group.coming and group.steps > 0)
    finally:
        lib.close()


def test_an_answer_that_never_reaches_its_decode_loop_does_not_hold_up_the_others(tiny_gemma):
    b = batch.Batcher(tiny_gemma.model)
    if not b.widths:
        pytest.skip(f"no padded width here: {b.why}")
    group = stepgroup.StepGroup(b, wait_s=30.0)  # only a wake-up, not the bound, can end the wait below quickly
    cache = _sessions(tiny_gemma, [5])[0]
    entered, done = threading.Event(), threading.Event()

    def failing_answer() -> None:
        with contextlib.suppress(RuntimeError), group.arriving():
            entered.set()
            done.wait(10)
            raise RuntimeError("refused before decoding")

    t = threading.Thread(target=failing_answer)
    t.start()
    entered.wait(10)
    threading.Timer(0.2, done.set).start()
    t0 = time.monotonic()
    with group.session() as step:
        row = step(cache, 7, 5)  # waits for the coming answer, which fails instead of joining
    t.join(10)
    assert row is not None and time.monotonic() - t0 < 10
    assert not group.coming and group.active == 0


def _prefill_both_ways(lm, lengths: list[int], prompt_lengths: list[int]) -> tuple[bool, batch.Batcher]:
    b = batch.Batcher(lm.model)
    caches = _sessions(lm, lengths, seed=3)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, lm.model.config.vocab_size, (n,), generator=gen).tolist() for n in prompt_lengths]
    alone, together = [copy.deepcopy(c) for c in caches], [copy.deepcopy(c) for c in caches]
    rows_a = [forward_chunk(lm.model, alone[i], prompts[i], lengths[i])[-1] for i in range(len(lengths))]
    real_pass, b.passes_run = b._pass, 0

    def counting(items, product):
        b.passes_run += 1
        return real_pass(items, product)

    b._pass = counting
    rows_t = b.prefill([(together[i], prompts[i], lengths[i]) for i in range(len(lengths))])
    same = all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(rows_a, rows_t, strict=True))
    return same and all(_same_cache(x, y) for x, y in zip(alone, together, strict=True)), b


@BOTH
def test_tiny_prompts_stacked_in_one_pass_match_each_alone(request, which):
    # MKL: 3 rows is below every stacked size and 70 between the checked ones: those two run alone
    same, b = _prefill_both_ways(request.getfixturevalue(which), [5, 9, 3, 12, 7, 2], [16, 13, 3, 40, 70, 12])
    assert same
    if b.fma16:  # no row depends on another: all six in one pass, unpadded
        assert b.passes_run == 1
    elif {12, 13, 16, 40} <= b.stack_sizes:  # the four stackable prompts (81 rows) went in one pass
        assert 70 not in b.stack_sizes and b.passes_run == 1


@BOTH
def test_tiny_first_prompts_into_empty_caches_match_each_alone(request, which):
    # a cache that holds nothing yet takes the modules' path (the lean step writes only caches it grows):
    # its products, the vocabulary's included, must still be the ones a prompt alone gets
    lm = request.getfixturevalue(which)
    b = batch.Batcher(lm.model)
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, lm.model.config.vocab_size, (n,), generator=gen).tolist() for n in (16, 13, 12)]
    alone, together = [new_cache(lm.model) for _ in prompts], [new_cache(lm.model) for _ in prompts]
    rows_a = [forward_chunk(lm.model, alone[i], p, 0)[-1] for i, p in enumerate(prompts)]
    rows_t = b.prefill([(together[i], p, 0) for i, p in enumerate(prompts)])
    assert all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(rows_a, rows_t, strict=True))
    assert all(_same_cache(x, y) for x, y in zip(alone, together, strict=True))


def test_real_prompts_stacked_in_one_pass_match_each_alone(real_lm):
    window = real_lm.info.sliding_window
    same, _ = _prefill_both_ways(real_lm, [window + 90, 40, window - 1, 300], [16, 13, 20, 33])
    assert same


def _steps_and_prompts_both_ways(lm, step_lengths: list[int], prompt_at: list[int], prompt_lengths: list[int], batcher=None):
    """Decode steps of sessions and prompts of others, each alone and through one `Batcher.run`:
    (rows and caches byte-equal, passes the run took)."""
    b = batcher or batch.Batcher(lm.model)
    caches = _sessions(lm, step_lengths + prompt_at, seed=5)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, lm.model.config.vocab_size, (n,), generator=gen).tolist() for n in prompt_lengths]
    alone, together = [copy.deepcopy(c) for c in caches], [copy.deepcopy(c) for c in caches]
    ns = len(step_lengths)
    steps_a = [forward_chunk(lm.model, alone[i], [7 + i], step_lengths[i])[-1] for i in range(ns)]
    prompts_a = [forward_chunk(lm.model, alone[ns + i], prompts[i], prompt_at[i])[-1] for i in range(len(prompts))]
    real_pass, passes = b._pass, []

    def counting(items, product):
        passes.append(len(items))
        return real_pass(items, product)

    b._pass = counting
    prompts_t, steps_t = b.run(
        [(together[ns + i], prompts[i], prompt_at[i]) for i in range(len(prompts))],
        [batch.Session(together[i], 7 + i, step_lengths[i]) for i in range(ns)],
    )
    rows_same = all(
        x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(steps_a + prompts_a, steps_t + prompts_t, strict=True)
    )
    return rows_same and all(_same_cache(x, y) for x, y in zip(alone, together, strict=True)), passes, b


@BOTH
def test_tiny_steps_and_prompts_in_one_pass_match_each_alone(request, which):
    # 3 sessions step while 3 prompts arrive (MKL: one of 70 rows, an unchecked length, runs alone)
    same, passes, b = _steps_and_prompts_both_ways(request.getfixturevalue(which), [5, 9, 12], [4, 7, 2], [16, 70, 13])
    assert same
    if b.fma16:
        assert sorted(passes) == [6]  # all of them in one pass
    elif {13, 16} <= b.stack_sizes and 70 not in b.stack_sizes:
        assert sorted(passes) == [5]  # 3 steps and 2 prompts in one pass; the 70-row prompt alone, no pass


@BOTH
def test_tiny_steps_beside_first_prompts_into_empty_caches_match_each_alone(request, which):
    # a prompt into an empty cache keeps its pass on the modules' path (the lean step writes only caches that
    # hold rows), so the steps beside it go through the pass's own products: each still its own bytes
    same, passes, b = _steps_and_prompts_both_ways(request.getfixturevalue(which), [5, 9, 12], [0, 7], [16, 13])
    assert same
    if b.fma16:
        assert passes == [5]  # the three steps and both prompts in one pass


@BOTH
def test_tiny_steps_and_prompts_beyond_one_pass_match_each_alone(request, which):
    # 6 steps and 5 prompts: more than `most` (8) items, so more than one pass, each still each one's own bytes
    same, passes, b = _steps_and_prompts_both_ways(
        request.getfixturevalue(which), [3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6], [12, 13, 14, 15, 16]
    )
    assert same
    if b.most == 8 and {12, 13, 14, 15, 16} <= b.stack_sizes:
        assert passes == [8, 3]


def test_real_steps_and_prompts_in_one_pass_match_each_alone(real_lm):
    window = real_lm.info.sliding_window
    same, passes, _ = _steps_and_prompts_both_ways(real_lm, [window + 40, 30], [window - 3, 60], [16, 13])
    assert same and passes == [4]


def test_other_work_waits_for_a_decoding_answer_then_runs(tiny_gemma):
    group = stepgroup.StepGroup(batch.Batcher(tiny_gemma.model), wait_s=0.01)
    decoding, finish, order = threading.Event(), threading.Event(), []

    def answer() -> None:
        with group.session():
            decoding.set()
            finish.wait(10)
            order.append("answer done")

    t = threading.Thread(target=answer)
    t.start()
    decoding.wait(10)
    threading.Timer(0.3, finish.set).start()
    with group.after_answers(most_s=30.0) as waited:
        order.append("other work")
    t.join(10)
    assert order == ["answer done", "other work"]  # the verify sample or solve attempt went after the answer
    assert 0.2 < waited < 10  # woken by the answer's end, not by the 30 s bound


def test_other_work_waits_longer_for_a_chat_than_for_background_sessions_and_always_runs(tiny_gemma):
    group = stepgroup.StepGroup(batch.Batcher(tiny_gemma.model), wait_s=0.01)

    def decoding(background: bool):
        started, finish = threading.Event(), threading.Event()

        def session() -> None:
            with group.background() if background else contextlib.nullcontext(), group.session():
                started.set()
                finish.wait(10)

        t = threading.Thread(target=session)
        t.start()
        started.wait(10)
        return t, finish

    for background, low, high in ((True, 0.2, 0.5), (False, 0.6, 5.0)):
        t, finish = decoding(background)
        try:
            with group.after_answers(most_s=0.2, answers_s=0.6) as waited:
                assert group.busy() and group.busy(answers_only=True) is not background
        finally:
            finish.set()
            t.join(10)
        # a solve attempt holds a sample back for most_s only; a chat for answers_s, after which it goes anyway
        assert low <= waited < high, (background, waited)
    with group.after_answers(most_s=30.0) as waited:  # nothing decoding: no wait at all
        assert not group.busy()
    assert waited < 0.1


def test_gated_deposits_taken_together_decode_what_each_decodes_alone(tmp_path, tiny_gemma, monkeypatch):
    """The deposit gate's answers (fact run and graft run) decode in the answers' shared passes once the decode
    group is built: the same token ids, run by run, as the same deposits made one at a time; every judge says
    pass here, so that both runs of every deposit are taken (the verdicts are not what is compared)."""
    import services
    from retrieval import HashEmbedder
    from services import gate
    from verifiers.verdict import Verdict

    b = batch.Batcher(tiny_gemma.model)
    if not b.widths:
        pytest.skip(f"no padded width here: {b.why}")
    runs: dict[str, list] = {"alone": [], "together": []}
    real_run, where = gate._run, threading.local()

    def spy(lm, chain, run, item, prefill, steps=None):
        got = real_run(lm, chain, run, item, prefill, steps=steps)
        runs[where.name].append((item[0], run, got.generated_ids, steps is not None))
        return got

    monkeypatch.setattr(gate, "_run", spy)
    monkeypatch.setattr(gate, "judge", lambda answer, verifier, reference, question="": Verdict(True, verifier, "spy"))
    items = [(f"Who keeps lighthouse number {i}?", f"Lighthouse {i} is kept by Mira Tolland the {i}th.") for i in range(4)]

    def deposit(lib, i: int, name: str) -> str:
        where.name = name
        q, s = items[i]
        return lib.deposit_item(q, s, f"Mira Tolland the {i}th", "exact", f"Mira Tolland the {i}th").id

    alone_lib = services.Library(home=tmp_path / "alone", lm=tiny_gemma, embedder=HashEmbedder())
    together_lib = services.Library(home=tmp_path / "together", lm=tiny_gemma, embedder=HashEmbedder())
    try:
        alone_ids = [deposit(alone_lib, i, "alone") for i in range(len(items))]
        assert "together" in together_lib.start_decoding_together()
        with ThreadPoolExecutor(len(items)) as pool:
            together_ids = list(pool.map(lambda i: deposit(together_lib, i, "together"), range(len(items))))
        group = together_lib.turns.decode_group()
    finally:
        alone_lib.close()
        together_lib.close()
    assert together_ids == alone_ids  # the same artifacts (their ids name the bytes)
    assert sorted(runs["together"]) == sorted((q, r, ids, True) for q, r, ids, _ in runs["alone"])
    assert {r for _, r, _, _ in runs["alone"]} == {"fact", "graft"} and len(runs["alone"]) == 2 * len(items)
    assert group.steps > group.passes > 0  # some gate steps were taken in shared passes


def test_a_solve_attempt_holds_the_model_lock(tmp_path, tiny_gemma, monkeypatch):
    import services
    from graft_core import sampling
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    real, held = sampling.attempt, []

    def attempt(*a, **kw):  # may another thread take the model while the attempt computes?
        probe = threading.Thread(target=lambda: held.append(not lib.store.lock.acquire(timeout=0) or lib.store.lock.release()))
        probe.start()
        probe.join(10)
        return real(*a, **kw)

    monkeypatch.setattr(sampling, "attempt", attempt)
    try:
        lib.solving.work("What is 2 + 2?", 2, 0.0, None)
        assert held == [True]  # the attempt ran under the model lock, not beside another request's forward
    finally:
        lib.close()


def test_solve_attempts_taken_together_draw_what_each_draws_alone(tiny_gemma):
    from graft_core import sampling

    b = batch.Batcher(tiny_gemma.model)
    if not b.widths:
        pytest.skip(f"no padded width here: {b.why}")
    group = stepgroup.StepGroup(b, wait_s=0.2)
    kinds = [dict(temperature=0.0), dict(temperature=0.9, seed=3), dict(temperature=1.3, seed=11, top_k=5)]
    questions = ["What is 2 + 2?", "Name a colour.", "Who built the lighthouse?"]
    alone = [sampling.attempt(tiny_gemma, q, 12, **kw) for q, kw in zip(questions, kinds, strict=True)]
    together: list = [None] * 3

    def run(i: int) -> None:
        together[i] = sampling.attempt(tiny_gemma, questions[i], 12, steps=group, **kinds[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [t.token_ids for t in together] == [a.token_ids for a in alone]
    assert group.steps > group.passes > 0  # some steps were taken in shared passes


def test_other_work_lets_an_answer_that_arrived_meanwhile_go_first_at_its_halfway_point(tiny_gemma):
    group = stepgroup.StepGroup(batch.Batcher(tiny_gemma.model), wait_s=0.01)
    order = []

    def answer() -> None:  # as AnswerPipeline.answer: on its way (arriving), then the model lock, then decoding
        with group.arriving(), group.cond, group.session():
            time.sleep(0.2)
            order.append("answer")

    with group.after_answers(most_s=30.0):
        order.append("first half")
        t = threading.Thread(target=answer)
        t.start()
        _wait = time.monotonic() + 10
        while not group.coming and time.monotonic() < _wait:
            time.sleep(0.005)
        waited = group.yield_to_answers(most_s=30.0)
        order.append("second half")
    t.join(10)
    assert order == ["first half", "answer", "second half"] and 0.15 < waited < 10
