"""kvgraft-f32-v2 (graft_core/numerics.py): the attention, softmax, exp, rotary tables, RMSNorm and GELU
of one definition. Against float64 references these compare within float32 rounding (another definition,
so a tolerance); where the claim is identity (a row's bytes alone and beside others) they compare bytes."""

from __future__ import annotations

import math

import pytest
import torch

from graft_core import numerics
from kernels import build, fma16, ops

pytestmark = pytest.mark.skipif(bool(fma16.why_not("fma16")), reason="fma16 cannot run on this machine")


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Module:
    """What the attention reads from its module: nothing but the head layout (passed as tensors)."""

    training = False


def _reference(q, k, v, keep, scaling):
    """eager_attention_forward in float64 with a boolean mask: the float64 reference."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    s = (q.double() @ k64.transpose(2, 3)) * scaling
    s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v64).transpose(1, 2)


def _inputs(sq=7, sk=19, hq=4, hkv=1, d=40, seed=0):
    g = _g(seed)
    return (
        torch.randn(2, hq, sq, d, generator=g),
        torch.randn(2, hkv, sk, d, generator=g),
        torch.randn(2, hkv, sk, d, generator=g),
    )


def _causal(sq, sk, window=None):
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep = j <= i
    if window is not None:
        keep &= j > i - window
    return keep[None, None].expand(2, 1, sq, sk)


@pytest.mark.parametrize("window", [None, 5])
def test_attention_equals_a_float64_reference_within_float32_rounding(window):
    q, k, v = _inputs()
    keep = _causal(7, 19, window)
    got, weights = numerics.attention(_Module(), q, k, v, keep, scaling=0.125)
    want = _reference(q, k, v, keep, 0.125)
    assert weights is None and got.shape == (2, 7, 4, 40) and got.dtype == torch.float32
    err = (got.double() - want).abs().max().item()
    assert err < 2e-6, f"max abs difference {err:.3g} from the float64 reference"
    # an additive mask (0 / a large negative, as transformers' eager mask) gives the same bytes as the boolean one
    add = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    again, _ = numerics.attention(_Module(), q, k, v, add, scaling=0.125)
    assert torch.equal(got, again), (got - again).abs().max()


def test_a_query_row_gets_the_same_bytes_alone_and_beside_others():
    """What makes grafted equal fresh: a row's output depends on its own query, the keys and its mask row."""
    q, k, v = _inputs(sq=9, sk=33, hq=4, hkv=2, d=64, seed=1)
    keep = _causal(9, 33)
    full, _ = numerics.attention(_Module(), q, k, v, keep, scaling=0.1)
    for i in range(9):
        row, _ = numerics.attention(_Module(), q[:, :, i : i + 1], k, v, keep[:, :, i : i + 1], scaling=0.1)
        assert torch.equal(row[:, 0], full[:, i]), f"row {i}: {(row[:, 0] - full[:, i]).abs().max()}"


F32 = fma16.FORMATS["F32"]


def _definition(q, k, v, keep, add, scale):
    """kv_attention's definition (kernels/c/reference.c), composed here from fma16's C reference product and numpy float32
    arithmetic, one row at a time: q [H, Sq, D], k and v [Sk, D], keep (bool) or add (float) [Sq, Sk]."""
    import numpy as np

    h_n, sq, d = q.shape
    sk = k.shape[0]
    out = torch.zeros(h_n, sq, d)
    for i in range(sq):
        kept = keep[i].numpy() if keep is not None else np.ones(sk, dtype=bool)
        if not kept.any():
            continue
        j0, j1 = int(kept.argmax()) // 16 * 16, sk - int(kept[::-1].argmax())
        for h in range(h_n):
            dots = fma16.linear(q[h, i : i + 1].contiguous(), k[j0:j1].contiguous(), F32, j1 - j0, reference=True)[0]
            t = (dots.numpy() * np.float32(scale)).astype(np.float32)
            if add is not None:
                t = (t + add[i, j0:j1].numpy()).astype(np.float32)
            kr = kept[j0:j1]
            m = t[kr].max()
            if m == -np.inf:
                continue
            e = np.array([ops.expf(float(np.float32(x - m))) if c else 0.0 for x, c in zip(t, kr)], dtype=np.float32)
            lanes = np.zeros(16, dtype=np.float32)
            for j, x in enumerate(e):  # key j0 + j in lane j mod 16 (j0 is a multiple of 16)
                lanes[j % 16] = np.float32(lanes[j % 16] + x)
            for half in (8, 4, 2, 1):
                lanes = (lanes[:half] + lanes[half : 2 * half]).astype(np.float32)
            p = torch.from_numpy((e / lanes[0]).astype(np.float32))
            out[h, i] = fma16.linear(p[None].contiguous(), v[j0:j1].t().contiguous(), F32, d, reference=True)[0]
    return out


def _case(h, sq, sk, d, mask, seed):
    g = _g(seed)
    q = torch.randn(sq, h, d, generator=g).transpose(0, 1)  # [H, Sq, D] strided as transformers lays queries out
    k, v = torch.randn(sk, d, generator=g), torch.randn(sk, d, generator=g)
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep, add = j <= i, None
    if mask == "sliding":
        keep &= j > i - 21
    elif mask == "holes":
        keep &= torch.rand(sq, sk, generator=g) > 0.4
        keep[0] = False  # a row with nothing kept: all +0
    elif mask == "additive":
        add, keep = torch.zeros(sq, sk).masked_fill(~keep, float("-inf")), None
    elif mask == "none":
        keep = None
    return q, k, v, keep, add


def _attend(q, k, v, keep, add, scale, **kw):
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2]).transpose(0, 1)  # [H, Sq, D] over an [Sq, H, D] buffer
    ops.attend(q, k, v, keep.contiguous().view(torch.uint8) if keep is not None else None, add, scale, out, **kw)
    return out


@pytest.mark.parametrize(
    "h,sq,sk,d,mask",
    [(4, 37, 60, 64, "causal"), (2, 20, 50, 40, "sliding"), (3, 18, 40, 32, "holes"), (1, 5, 33, 16, "additive"),
     (5, 1, 70, 48, "none"), (4, 17, 17, 256, "causal"),
     (4, 1, 700, 256, "none"), (4, 1, 700, 256, "sliding"), (3, 1, 2100, 96, "additive"), (4, 1, 600, 272, "holes"),
     (4, 1, 530, 256, "causal")],
)  # fmt: skip
def test_attention_is_its_written_definition_in_every_build(h, sq, sk, d, mask):
    """Every build (the CPU's vector ones, portable) and the plain C reference give, byte for byte, the
    definition recomputed here from fma16's reference product and numpy: per row, the keys from its first
    kept one rounded down to 16 to its last, scale, mask, max, kvgraft's exp, a 16-lane sum and its tree,
    a division, P.V with key j in lane j mod 16. Strided queries and outputs, D with and without a ragged
    16, heads that do not fill a tile, blocks of 16 positions and a last short one, holes in the mask, a row
    with nothing kept, an additive mask, no mask; and a decode step's one position over hundreds of keys,
    which the vector builds split over threads by keys and by values."""
    q, k, v, keep, add = _case(h, sq, sk, d, mask, seed=sq * sk + d)
    want = _definition(q, k, v, keep, add, 0.125)
    for isa in build.runnable():
        for reference in (False, True):
            got = _attend(q, k, v, keep, add, 0.125, isa=isa, reference=reference)
            assert torch.equal(got, want), f"{isa} reference={reference}: max difference {(got - want).abs().max()}"


def test_attention_bytes_do_not_depend_on_the_build_or_the_threads():
    """Gemma 3 270M's shape (4 query heads on 1 key/value head of 256) over 600 keys, sliding window and
    causal: every build the CPU has, on 1 and 2 threads, the same bytes as the plain C reference."""
    before = torch.get_num_threads()
    try:
        for sq in (100, 17):  # 17: a question after a restore, in two blocks of 9 and 8 positions on 2 threads
            _same_over_builds_and_threads(sq)
    finally:
        torch.set_num_threads(before)


def _same_over_builds_and_threads(sq: int) -> None:
    q, k, v, keep, _ = _case(4, sq, 600, 256, "causal", seed=3)
    i = torch.arange(sq)[:, None] + 600 - sq
    sliding = keep & (torch.arange(600)[None, :] > i - 512)
    for mask in (keep, sliding):
        want = _attend(q, k, v, mask, None, 0.0625, reference=True)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for isa in build.runnable():
                got = _attend(q, k, v, mask, None, 0.0625, isa=isa)
                assert torch.equal(got, want), f"{isa}, {threads} threads: {(got - want).abs().max()}"


def test_exp_is_correctly_rounded_on_a_sweep():
    xs = torch.linspace(-103.0, 88.0, 20_001).tolist() + [0.0, -1e-30, 1e-7, -87.3, 88.72]
    bad = [x for x in xs if ops.expf(x) != float(torch.tensor(math.exp(float(torch.tensor(x))), dtype=torch.float32))]
    assert len(bad) <= 2, f"{len(bad)} of {len(xs)} differ from the correctly rounded exp: {bad[:5]}"
    assert ops.expf(float("-inf")) == 0.0 and ops.expf(-200.0) == 0.0 and math.isinf(ops.expf(100.0))


def test_the_softmax_exp_gives_kv_expf_bytes_for_every_nonpositive_input():
    """The softmax's branch-free exp (x <= 0) against kv_expf, on a dense sweep and around the cut at -104."""
    lib = ops.lib()
    xs = torch.linspace(-120.0, 0.0, 200_001).tolist() + [-104.0, -103.99999, -104.00001, -103.97, -1e-38, -0.0, float("-inf")]
    bad = [x for x in xs if lib.kv_expf_neg_ref(x) != ops.expf(x)]
    assert not bad, f"{len(bad)} differ, first {bad[:5]}"


def test_the_vectorised_gelu_gives_the_bytes_of_its_plain_form():
    """kv_gelu_tanh's branch-free form against the plain one (kvgraft's exp with its range checks), on a
    sweep of every magnitude and the edges: +-inf, huge, tiny, the clamps of its exp."""
    import struct

    lib = ops.lib()
    xs = torch.linspace(-30.0, 30.0, 120_001).tolist()
    xs += [s * 10.0**e for e in range(-40, 39) for s in (1.0, -1.0, 3.3, -3.3)]
    xs += [float("inf"), float("-inf"), -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]
    xs += [float(v) for v in torch.linspace(-19.0, -20.5, 20_001)]  # where -2u crosses 708 and 709.78

    def bits(f: float) -> bytes:
        return struct.pack("<f", f)

    bad = [x for x in xs if bits(lib.kv_gelu_one(x)) != bits(lib.kv_gelu_ref(x))]
    assert not bad, f"{len(bad)} differ, first {bad[:5]}"
    y = torch.tensor(xs[:1000], dtype=torch.float32)
    from transformers.activations import GELUTanh

    got = numerics.Gelu(GELUTanh())(y)  # the vectorised loop itself
    assert all(bits(float(a)) == bits(lib.kv_gelu_ref(float(b))) for a, b in zip(got, y))


def test_rotary_tables_match_float64_and_inverse_frequencies_are_correctly_rounded():
    from decimal import Decimal

    inv = numerics.inverse_frequencies(10_000.0, 32)
    for i, f in enumerate(inv.tolist()):
        exact = Decimal(10_000) ** (-Decimal(2 * i) / 32)
        ulp = abs(float(torch.tensor(f).nextafter(torch.tensor(math.inf))) - f)
        assert abs(Decimal(f) - exact) <= Decimal(ulp) / 2
    from graft_core import tiny

    cfg = tiny.config("gemma3", 64)
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    module = Gemma3RotaryEmbedding(cfg)
    rotary = numerics.Rotary(module)
    pos = torch.tensor([[0, 1, 2, 511, 4096, 32767]])
    for kind in ("sliding_attention", "full_attention"):
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos, kind)
        inv = rotary.tables[kind][0].double()
        angle = (pos[0, :, None].float() * rotary.tables[kind][0]).double()  # the float32 angle, as transformers forms it
        assert torch.equal(cos[0, :, :16], cos[0, :, 16:]) and cos.shape == (1, 6, 32) and inv.numel() == 16
        assert (cos[0, :, :16].double() - angle.cos()).abs().max() < 6e-8
        assert (sin[0, :, :16].double() - angle.sin()).abs().max() < 6e-8


def test_rmsnorm_and_gelu_match_float64():
    from transformers.activations import GELUTanh
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(40, eps=1e-6)
    norm.weight.data = torch.randn(40, generator=_g(4))
    x = torch.randn(5, 3, 40, generator=_g(5))
    with torch.inference_mode():
        got = numerics.Norm(norm)(x)
        x64 = x.double()
        want = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + norm.weight.double())
        assert (got.double() - want).abs().max() < 4e-6 * want.abs().max()
        y = torch.randn(1000, generator=_g(6)) * 6
        gelu = numerics.Gelu(GELUTanh())(y).double()
        y64 = y.double()
        u = math.sqrt(2 / math.pi) * (y64 + 0.044715 * y64**3)
        ref = y64 / (1 + torch.exp(-2 * u))  # = 0.5 y (1 + tanh u), without its cancellation for u < 0
        assert ((gelu - ref).abs() <= 1.2e-7 * ref.abs() + 1e-45).all()  # rounded once: half an ulp (or subnormal)
    # rows are independent: a row normed alone gives the bytes it gets among others
    assert torch.equal(numerics.Norm(norm)(x[2:3, 1:2]), got[2:3, 1:2])


def test_gemma3_without_softcapping_and_the_llama_family_are_taken():
    from graft_core import tiny

    assert numerics.why_not(tiny.config("gemma3", 64)) == ""
    assert numerics.why_not(tiny.config("llama", 64)) == ""  # the family's cases: tests/test_llama.py
    assert numerics.why_not(tiny.config("gemma2", 64)) == "architecture 'gemma2'"
    capped = tiny.config("gemma3", 64)
    capped.final_logit_softcapping = 30.0
    assert numerics.why_not(capped) == "logit soft-capping (final_logit_softcapping)"
    exact_gelu = tiny.config("gemma3", 64)
    exact_gelu.hidden_activation = "gelu"
    assert numerics.why_not(exact_gelu) == "activation 'gelu'"


def test_no_mkl_or_onednn_call_in_a_forward_and_the_bits_do_not_follow_aten_or_threads(tiny_dirs, tiny_gemma):
    """A deposit and an answer (the golden cases: three artifacts, grafted and fresh answers with decode
    steps, a question's logits) in a subprocess under MKL_VERBOSE and ONEDNN_VERBOSE, with ATen on its
    DEFAULT kernels and one thread: nothing from MKL or oneDNN is printed, and every hash equals this
    process's (native capability, the pinned thread count)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from graft_core import selftest

    script = (
        "import json,sys,torch; from graft_core import model, selftest; lm=model.load(sys.argv[1]);"
        "torch.set_num_threads(1); print('KVGRAFT-BEGIN', flush=True);"
        "cases=selftest.compute(lm); print('KVGRAFT-END', flush=True);"
        "print(json.dumps([torch.backends.cpu.get_cpu_capability(), lm.fingerprint, cases]))"
    )
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1", ATEN_CPU_CAPABILITY="default")
    done = subprocess.run(
        [sys.executable, "-c", script, str(tiny_dirs["gemma3"])],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    printed = done.stdout + done.stderr
    vendor = [line for line in printed.splitlines() if "MKL_VERBOSE" in line or "onednn_verbose" in line.lower()]
    assert not vendor, f"{len(vendor)} MKL/oneDNN calls, first: {vendor[:3]}"
    capability, fingerprint, cases = json.loads(done.stdout.strip().splitlines()[-1])
    assert capability == "DEFAULT" and fingerprint == tiny_gemma.fingerprint
    assert cases == selftest.compute(tiny_gemma)
