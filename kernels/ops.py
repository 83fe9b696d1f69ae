"""The Python side of the kernels besides the products (fma16.py) and the build (build.py): the library handle
with an error a user can act on, one key/value head's attention call (`attend`, kv_attention in c/attention.c) and its mask rows, and
transformers' boolean mask without its causal shortcut. Shared by graft_core.numerics (the language
model's forward) and retrieval.encoder (the embedder's); it knows neither model.
"""

from __future__ import annotations

import torch

from . import build


def lib(isa: str | None = None):
    """The kernels' library (variant `isa`, default `build.variant()`): this module's entry points live in c/
    and are declared where the library is loaded (build.lib)."""
    name = isa or build.variant()
    handle = build.lib(name)
    if handle is None:
        raise RuntimeError(f"kvgraft's kernels are unavailable: {build.failure(name) or 'kernels/c/kernels.c did not build'}")
    return handle


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"kvgraft {what} failed ({rc})")


def ours(x: torch.Tensor) -> bool:
    """Whether a call is the engine's: float32 on the CPU, no gradient wanted."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad)


def expf(x: float) -> float:
    """kvgraft's exp of one float32 (the softmax's), for tests."""
    return lib().kv_expf(x)


def mask_rows(mask: torch.Tensor | None, b: int, h: int, sq: int, sk: int):
    """(keep, add) for batch row b and query head h (any head where the mask is shared): [sq, >= sk] rows
    whose last dimension is contiguous, bool viewed as uint8 (no copy where it already is)."""
    if mask is None:
        if sq == 1:
            return None, None
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)  # causal, the last query sees every key
        return keep.view(torch.uint8), None
    m = mask[b if mask.shape[0] > 1 else 0]
    m = m[h if m.shape[0] > 1 else 0][:, :sk]
    if m.stride(-1) != 1 or (sq > 1 and m.stride(0) < sk):
        m = m.contiguous()
    if m.dtype == torch.bool:
        return m.view(torch.uint8), None
    return None, m if m.dtype == torch.float32 else m.to(torch.float32).contiguous()


def attend(
    q, k, v, keep, add, scale: float, out, *, reference: bool = False, isa: str | None = None, _profiled: bool = False
) -> None:
    """One key/value head's attention (kv_attention in c/attention.c): q [H, Sq, D] (any head and position
    strides, D contiguous), k and v [Sk, D] (rows contiguous), `keep` uint8 or `add` float32 [Sq, >= Sk]
    mask rows (or neither: every key), into out [H, Sq, D] (a strided view). `reference` computes it one
    operation at a time (the definition; slow); `isa` names the build (default: build.variant())."""
    h, sq, d = q.shape
    sk = k.shape[0]
    for t in (q, k, v, out):
        assert t.dtype == torch.float32 and t.stride(-1) == 1, "kvgraft attention takes float32 rows with contiguous values"
    mask = keep if keep is not None else add
    if not _profiled and torch._C._autograd._profiler_enabled():  # a profiled run (bench.kernels) sees the call as one op
        with torch.profiler.record_function("kvgraft::attention"):
            return attend(q, k, v, keep, add, scale, out, reference=reference, isa=isa, _profiled=True)
    rc = lib(isa).kv_attention(
        q.data_ptr(), h, sq, d, q.stride(0), q.stride(1),
        k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), sk,
        keep.data_ptr() if keep is not None else None,
        add.data_ptr() if add is not None else None,
        mask.stride(0) if mask is not None else 0,
        scale, out.data_ptr(), out.stride(0), out.stride(1), torch.get_num_threads(), int(reference),
    )  # fmt: skip
    check(rc, "attention")


def full_mask(*args, **kwargs):
    """transformers' boolean mask (True: attend), never skipped for a causal shortcut: kvgraft's attention
    takes the mask it is given and nothing else."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)
