"""The integer definition (i8dot-v1, kernels/c/int8ref.c): each build against the plain C definition byte for byte,
the C definition against an independent one written here in Python, a row's bytes against the same row alone and
under another thread count, and the record of a model whose products run under it (KVGRAFT_LINEAR=int8).
Skipped where fma16 cannot run (no compiler)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from kernels import fma16
from tests.test_fma16 import ISAS, blocks

pytestmark = pytest.mark.skipif(bool(fma16.why_not()), reason=f"fma16 unavailable here: {fma16.why_not()}")

COVERED = {"Q8_0": 32, "Q5_0": 32, "Q4_K": 256, "Q6_K": 256}


def _rows(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows as a forward holds them, and the cases a quantiser gets wrong: a block of zeros, one of a single value
    (every q the same), values far apart in size in one block (most round to 0), subnormals, ties at .5."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(4).add(0.01)
    x[0, : min(k, 32)] = 0.0
    if m > 1:
        x[1, : min(k, 64)] = 3.0
    if m > 2:
        x[2, :k:7] = x[2, :k:7] * 1e6
    if m > 3:
        x[3] = x[3] * 1e-40  # subnormal float32s
    if m > 4:
        x[4, :32] = torch.arange(32, dtype=torch.float32) - 15.5  # amax 15.5: x * 127 / 15.5 has ties
    return x.contiguous()


def _product(x, w, fmt, n, **kw):
    return fma16.linear(x, torch.from_numpy(w), fma16.FORMATS[fmt] | fma16.I8_FLAG, n, **kw)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", sorted(COVERED))
def test_each_build_computes_the_definitions_bytes(isa, fmt):
    """Every tile (1, 2, 4, 8, 16 rows of x; one or a few weight rows; an odd number of Q8_0 blocks, whose last is
    paired with zeros) against the plain C definition, one output at a time."""
    per = COVERED[fmt]
    for case, (m, k, n) in enumerate(((1, per, 1), (2, 3 * per, 7), (5, 5 * per, 9), (19, 2 * per, 5), (70, 4 * per, 3))):
        w = blocks(fmt, n, k, seed=case)
        x = _rows(m, k, seed=case)
        fast = _product(x, w, fmt, n, isa=isa)
        ref = _product(x, w, fmt, n, isa=isa, reference=True)
        assert torch.equal(fast.view(torch.int32), ref.view(torch.int32)), (fmt, isa, m, k, n)


@pytest.mark.parametrize("fmt", sorted(COVERED))
def test_a_rows_bytes_do_not_depend_on_its_neighbours_or_the_thread_count(fmt):
    per = COVERED[fmt]
    w = blocks(fmt, 37, 6 * per, seed=3)
    x = _rows(24, 6 * per, seed=4)
    together = _product(x, w, fmt, 37, threads=2)
    for i in range(24):
        alone = _product(x[i : i + 1].contiguous(), w, fmt, 37, threads=1)
        assert torch.equal(alone.view(torch.int32), together[i : i + 1].view(torch.int32)), i


def _f32(v) -> np.float32:
    """The float32 nearest the exact rational v, ties to even: one correctly rounded operation."""
    v = Fraction(v)
    f = np.float32(float(v))  # within one float32 step of the answer (the double is correctly rounded)
    best = None
    for c in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):
        d = abs(Fraction(float(c)) - v)
        if best is None or d < best[0] or (d == best[0] and int(c.view(np.uint32)) % 2 == 0):
            best = (d, c)
    return best[1]


def _quantise(x: np.ndarray, per: int) -> tuple[np.ndarray, list[np.float32]]:
    q, d = np.zeros(x.size, dtype=np.int64), []
    for b in range(x.size // per):
        block = x[b * per : (b + 1) * per]
        amax = np.float32(np.max(np.abs(block)))
        tiny = amax < 2.0**-100
        idv = np.float32(0) if tiny else _f32(Fraction(127) / Fraction(float(amax)))
        d.append(np.float32(0) if tiny else _f32(Fraction(float(amax)) / 127))
        scaled = [_f32(Fraction(float(v)) * Fraction(float(idv))) for v in block]
        q[b * per : (b + 1) * per] = np.clip(np.rint(np.array(scaled, dtype=np.float64)), -127, 127)  # rint: ties to even
    return q, d


def _half(b: np.ndarray) -> np.float32:
    return np.float32(b.view(np.float16)[0])


def _definition(fmt: str, x: np.ndarray, row: np.ndarray) -> np.float32:
    """int8ref.c's header, in Python: exact integers, then fmaf as one rounding of the exact a * b + c."""
    per = COVERED[fmt]
    q, d = _quantise(x, per)
    acc, am = [np.float32(0)] * 16, [np.float32(0)] * 4

    def fma(a, b, c):
        return _f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))

    if fmt in ("Q8_0", "Q5_0"):
        nb, size = x.size // 32, 34 if fmt == "Q8_0" else 22
        for b in range(nb + nb % 2):
            real = b < nb
            blk = row[size * b : size * (b + 1)] if real else None
            dd = _f32(Fraction(float(_half(blk[:2]))) * Fraction(float(d[b]))) if real else np.float32(0)
            if not real:
                w = np.zeros(32, np.int64)
            elif fmt == "Q8_0":
                w = blk[2:].view(np.int8).astype(np.int64)
            else:  # Q5_0: value j the low nibble of byte j, j + 16 its high one, each with bit j (j + 16) of qh, - 16
                qh, qs = int(blk[2:6].view(np.uint32)[0]), blk[6:].astype(np.int64)
                w = np.array([((qs[j % 16] >> (4 * (j // 16))) & 0xF | ((qh >> j) & 1) << 4) - 16 for j in range(32)])
            xs = q[32 * b : 32 * b + 32] if real else np.zeros(32, np.int64)
            for lane in range(8):
                s = int(np.dot(w[4 * lane : 4 * lane + 4], xs[4 * lane : 4 * lane + 4]))
                acc[8 * (b % 2) + lane] = fma(s, dd, acc[8 * (b % 2) + lane])
    elif fmt == "Q4_K":
        for b in range(x.size // 256):
            blk = row[144 * b : 144 * b + 144]
            s12, qs, xq = blk[4:16].astype(np.int64), blk[16:].astype(np.int64), q[256 * b : 256 * b + 256]
            sc = [s12[j] & 63 if j < 4 else (s12[j + 4] & 0xF) | ((s12[j - 4] >> 6) << 4) for j in range(8)]
            mn = [s12[j + 4] & 63 if j < 4 else (s12[j + 4] >> 4) | ((s12[j] >> 6) << 4) for j in range(8)]
            lanes = [0] * 16
            for p in range(128):
                c4, lane = p // 32, (p % 64) // 4
                v = 64 * c4 + p % 32
                lanes[lane] += sc[2 * c4] * (qs[p] & 0xF) * xq[v] + sc[2 * c4 + 1] * (qs[p] >> 4) * xq[v + 32]
            bs = [int(xq[32 * j : 32 * j + 32].sum()) for j in range(8)]
            dd = _f32(Fraction(float(_half(blk[0:2]))) * Fraction(float(d[b])))
            dm = _f32(Fraction(float(_half(blk[2:4]))) * Fraction(float(d[b])))
            acc = [fma(lanes[i], dd, acc[i]) for i in range(16)]
            am = [fma(mn[2 * i] * bs[2 * i] + mn[2 * i + 1] * bs[2 * i + 1], dm, am[i]) for i in range(4)]
    else:  # Q6_K
        for b in range(x.size // 256):
            blk = row[210 * b : 210 * b + 210]
            ql, qh, sc = blk[:128].astype(np.int64), blk[128:192].astype(np.int64), blk[192:208].view(np.int8)
            xq, lanes = q[256 * b : 256 * b + 256], [0] * 16
            for i in range(256):
                h, t = i // 128, i % 128
                lo = (ql[h * 64 + t % 64] >> (4 * (t // 64))) & 0xF
                hb = (qh[h * 32 + t % 32] >> (2 * (t // 32))) & 3
                lanes[(i % 64) // 4] += int(sc[i // 16]) * int((lo | (hb << 4)) - 32) * int(xq[i])
            dd = _f32(Fraction(float(_half(blk[208:210]))) * Fraction(float(d[b])))
            acc = [fma(lanes[i], dd, acc[i]) for i in range(16)]

    def add(a, b):
        return _f32(Fraction(float(a)) + Fraction(float(b)))

    t = [add(acc[j], acc[j + 8]) for j in range(8)]
    u = [add(t[j], t[j + 4]) for j in range(4)]
    v = [add(u[j], u[j + 2]) for j in range(2)]
    return _f32(Fraction(float(add(v[0], v[1]))) - Fraction(float(add(add(am[0], am[2]), add(am[1], am[3])))))


@pytest.mark.parametrize("fmt", sorted(COVERED))
def test_the_c_definition_is_the_one_written_in_its_header(fmt):
    """An independent reading of the definition (exact rationals, each float step rounded once) gives the C
    reference's bytes, so the reference is the definition its header states, not merely self-consistent."""
    per = COVERED[fmt]
    k = 3 * per if per == 32 else 2 * per  # the 32-value formats: an odd number of blocks
    w = blocks(fmt, 3, k, seed=11)
    x = _rows(5, k, seed=12)
    ref = _product(x, w, fmt, 3, reference=True).numpy()
    for m in range(5):
        for n in range(3):
            mine = _definition(fmt, x[m].numpy(), w[n])
            assert mine.view(np.uint32) == ref[m, n].view(np.uint32), (fmt, m, n, mine, ref[m, n])


@pytest.mark.parametrize("fmt", sorted(COVERED))
def test_the_integer_products_stay_near_the_float32_ones(fmt):
    """Not the same bytes (another definition), but the same products to within int8's rounding: a broken scale or
    lane would be off by far more."""
    per = COVERED[fmt]
    w = blocks(fmt, 64, 4 * per, seed=5)
    x = torch.randn(8, 4 * per, generator=torch.Generator().manual_seed(6))
    exact = fma16.linear(x, torch.from_numpy(w), fma16.FORMATS[fmt], 64)
    ours = _product(x, w, fmt, 64)
    rel = (ours - exact).norm() / exact.norm()
    assert rel < 0.02, float(rel)
    assert not torch.equal(ours, exact)


def test_a_flag_on_a_format_the_definition_does_not_cover_is_refused():
    w = blocks("Q4_0", 4, 64, seed=1)
    with pytest.raises(ValueError):
        fma16.linear(torch.zeros(1, 64), torch.from_numpy(w), fma16.FORMATS["Q4_0"] | fma16.I8_FLAG, 4)


@pytest.mark.integration
def test_the_packaged_model_under_int8_names_it_in_its_record_and_grafts_exactly(monkeypatch):
    """KVGRAFT_LINEAR=int8: the covered products run under it, the record says so (another fingerprint than the
    float32 load's, so neither's artifacts are taken for the other's), a graft is still byte-identical to the
    fresh computation, and steps taken together equal steps taken alone."""
    from graft_core import model
    from tests.test_batch import assert_grafts_exactly_and_batches

    monkeypatch.setenv("KVGRAFT_LINEAR", "fma16")
    f32 = model.load()
    monkeypatch.setenv("KVGRAFT_LINEAR", "int8")
    lm = model.load()
    assert ("linear", fma16.I8_VERSION) in lm.config.numerics and ("linear", fma16.I8_VERSION) not in f32.config.numerics
    assert fma16.I8_VERSION in lm.products
    assert lm.fingerprint != f32.fingerprint
    assert_grafts_exactly_and_batches(lm)
