"""kvgraft-f32-v2: one numerical definition for the whole float32 forward of a Gemma 3 or Llama-family model.

fma16 (kernels/fma16.py) fixes the order of the weight products. This module puts the rest of a forward on code
whose bits do not depend on the CPU's vendor or vector width, so that the definition, not the machine,
decides every byte:
- attention (`attention`, registered with transformers as "kvgraft"): one fused C call per key/value head
  (`kv_attention` in kernels/c/attention.c; its definition is written in kernels/c/reference.c): Q.K^T and
  P.V in fma16's order (16 lanes of fmaf along the reduced dimension, then the fixed tree), a softmax of
  scale, mask, max, kvgraft's own exp, a sum in fma16's order and a division; the query heads of a group
  (GQA) share the keys' loads;
- the rotary tables (`Rotary`): inverse frequencies correctly rounded to float32 from a 60-digit decimal
  power, cos and sin by kvgraft's own double-precision code, rounded once (no matmul, no libm);
- the rotary tables scaled linearly or as Llama 3 scales them: on the exact 60-digit values, rounded once;
- RMSNorm (`Norm`): the mean of squares as fma16's dot of the row with itself, then 1/sqrtf, then Gemma's
  (1 + w) or the Llama family's w;
- the tanh GELU (`Gelu`, Gemma 3) and SiLU (`Silu`, the Llama family): in double with kvgraft's own exp,
  rounded once.
What is left to ATen is elementwise float32 arithmetic (adds, products, negation, concatenation, the
embedding lookup): one correctly rounded IEEE-754 operation per element on every CPU and vector width.

It knows the module layout of transformers' Gemma 3 and Llama family (Llama, Mistral, Qwen2: their rotary,
RMSNorm, activation and attention modules) and nothing about artifacts or caches; anything else is outside
it (`why_not` says what it lacks): graft_core.model refuses to load one with `outside`'s line unless
KVGRAFT_MACHINE_BOUND opts into torch's attention and a record bound to the machine class.
"""

from __future__ import annotations

import decimal

import numpy as np
import torch

from kernels import build, ops

VERSION = "kvgraft-f32-v2"  # the definition's name: change it when any order here or in fma16 (fma16.VERSION) changes
NAME = "kvgraft"  # the attention implementation's name in transformers' registries


# ---- attention -------------------------------------------------------------------------------------


def attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract (eager_attention_forward's): query [B, Hq, Sq, D], key and value
    [B, Hkv, Sk, D], a boolean (True: attend) or additive mask [B or 1, 1 or Hq, Sq, >= Sk]; returns
    ([B, Sq, Hq, D], None). One fused C call per key/value head over all of its query heads (GQA without
    copies), per query head where the mask differs by head; the definition is kv_attention's (kernels/c/reference.c)."""
    if dropout:
        raise ValueError("kvgraft attention is for inference: dropout must be 0")
    if softcap is not None:
        raise ValueError("kvgraft attention has no logit soft-capping (kvgraft-f32-v2 covers Gemma 3 without it)")
    if not (ops.ours(query) and key.dtype == value.dtype == torch.float32):
        raise TypeError(f"kvgraft attention takes float32 CPU tensors, got {query.dtype} on {query.device}")
    b_n, hq, sq, d = query.shape
    hkv, sk = key.shape[1], key.shape[2]
    group = hq // hkv
    scale = float(scaling if scaling is not None else d**-0.5)
    isa = getattr(module, "kvgraft_isa", None)  # the build the model was loaded on (take_over), else the default
    per_head_mask = attention_mask is not None and attention_mask.shape[1] > 1
    out = torch.empty((b_n, sq, hq, d), dtype=torch.float32)
    if query.stride(-1) != 1:
        query = query.contiguous()
    for b in range(b_n):
        for g in range(hkv):
            keys, values = key[b, g], value[b, g]
            keys = keys if keys.stride(-1) == 1 else keys.contiguous()
            values = values if values.stride(-1) == 1 else values.contiguous()
            heads = [(h, 1) for h in range(g * group, (g + 1) * group)] if per_head_mask else [(g * group, group)]
            for h0, n in heads:
                keep, add = ops.mask_rows(attention_mask, b, h0, sq, sk)
                ops.attend(query[b, h0 : h0 + n], keys, values, keep, add, scale, out[b, :, h0 : h0 + n].transpose(0, 1), isa=isa)
    return out, None


def register() -> None:
    """Make "kvgraft" an attention implementation (and its mask) transformers' models can load with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, ops.full_mask)


# ---- rotary tables, norms, GELU ----------------------------------------------------------------------


def _nearest_f32(d: decimal.Decimal) -> np.float32:
    """The float32 nearest to the decimal `d` (compared exactly, no double rounding)."""
    c = np.float32(float(d))
    around = (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf)))
    return min(around, key=lambda f: abs(decimal.Decimal(float(f)) - d))


def inverse_frequencies(base: float, dim: int, scaling: dict | None = None) -> torch.Tensor:
    """base^(-e_i), e_i = float32(2i) / float32(dim) as transformers forms it, each correctly rounded to
    float32 from a 60-digit decimal power (pure software: the same digits on every machine). `scaling` (a
    rope_parameters dict) applies linear scaling (the power / factor) or Llama 3's (transformers'
    `_compute_llama3_parameters` formula) to the exact power, in the same 60 digits, rounded once."""
    ctx = decimal.Context(prec=60)
    kind = (scaling or {}).get("rope_type", "default")
    out = []
    for i in range(0, dim, 2):
        e = decimal.Decimal(float(np.float32(i) / np.float32(dim)))
        inv = ctx.power(decimal.Decimal(base), -e)
        if kind == "linear":
            inv = ctx.divide(inv, decimal.Decimal(float(scaling["factor"])))
        elif kind == "llama3":
            inv = _llama3(ctx, inv, scaling)
        out.append(_nearest_f32(inv))
    return torch.tensor(np.array(out, dtype=np.float32))


_PI = decimal.Decimal("3.14159265358979323846264338327950288419716939937510582097494459")


def _llama3(ctx: decimal.Context, inv: decimal.Decimal, p: dict) -> decimal.Decimal:
    """Llama 3's scaled inverse frequency of `inv` (transformers' formula, the comparisons on exact values)."""
    d = decimal.Decimal
    factor, low, high = d(float(p["factor"])), d(float(p["low_freq_factor"])), d(float(p["high_freq_factor"]))
    old = d(int(p["original_max_position_embeddings"]))
    low_wavelen, high_wavelen = ctx.divide(old, low), ctx.divide(old, high)
    wavelen = ctx.divide(2 * _PI, inv)
    if wavelen > low_wavelen:
        return ctx.divide(inv, factor)
    if wavelen < high_wavelen:
        return inv
    smooth = ctx.divide(ctx.subtract(ctx.divide(old, wavelen), low), ctx.subtract(high, low))
    return ctx.add(ctx.divide(ctx.multiply(1 - smooth, inv), factor), ctx.multiply(smooth, inv))


def _rope_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _rope_sets(cfg) -> dict:
    """{layer type: rope_parameters} for Gemma 3's per-type dicts, {None: rope_parameters} for one dict."""
    ropes = getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(ropes, dict):
        return {}
    if "rope_type" in ropes or "rope_theta" in ropes:
        return {None: ropes}
    return {kind: p or {} for kind, p in ropes.items()}


class Rotary:
    """The forward of a rotary embedding module: (cos, sin) [B, S, D] for position_ids [B, S] (and a layer
    type where the model has one table per type, as Gemma3RotaryEmbedding does)."""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa
        cfg = module.config
        dim = _rope_dim(cfg)
        self.tables = {}
        for kind, params in _rope_sets(cfg).items():
            scaling = getattr(module, f"{kind}_attention_scaling") if kind else module.attention_scaling
            self.tables[kind] = (inverse_frequencies(float(params["rope_theta"]), dim, params), float(scaling))

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return self.plain(x, position_ids, layer_type) if layer_type else self.plain(x, position_ids)
        inv, scaling = self.tables[None if None in self.tables else layer_type]  # one table: every layer type's
        pos = position_ids.to(torch.int64).contiguous()
        f = inv.numel()
        cos = torch.empty((*pos.shape, 2 * f), dtype=torch.float32)
        sin = torch.empty_like(cos)
        ops.check(
            ops.lib(self.isa).kv_rotary(pos.data_ptr(), pos.numel(), inv.data_ptr(), f, scaling, cos.data_ptr(), sin.data_ptr()),
            "rotary",
        )
        return cos, sin


def norm_eps(module) -> float:
    """An RMSNorm module's epsilon (Gemma3RMSNorm's `eps`, LlamaRMSNorm's `variance_epsilon`)."""
    eps = getattr(module, "eps", None)
    return float(module.variance_epsilon if eps is None else eps)


def plus_one(module) -> bool:
    """Whether an RMSNorm module scales by (1 + w) (Gemma's) rather than w (the Llama family's)."""
    return type(module).__name__.startswith("Gemma")


class Norm:
    """The forward of an RMSNorm: Gemma3RMSNorm's y = x / rms(x) * (1 + w) with kv_rmsnorm's order, or the
    Llama family's y = x / rms(x) * w with kv_rmsnorm_mul's (the same order without the + 1)."""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa  # the build the model was loaded on (None: build.variant())
        self.plus_one = plus_one(module)
        self.eps = norm_eps(module)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.module.weight
        if not ops.ours(x) or w.dtype != torch.float32:
            return self.plain(x)
        n = x.shape[-1]
        flat = x.reshape(-1, n).contiguous()
        y = torch.empty_like(flat)
        weight = w.detach().contiguous()
        kernels = ops.lib(self.isa)
        norm = kernels.kv_rmsnorm if self.plus_one else kernels.kv_rmsnorm_mul
        rc = norm(flat.data_ptr(), flat.shape[0], n, weight.data_ptr(), self.eps, y.data_ptr(), torch.get_num_threads())
        ops.check(rc, "RMSNorm")
        return y.view(x.shape)


class _Elementwise:
    """The forward of an activation module through one of the kernels' elementwise entry points."""

    ENTRY = ""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa  # the build the model was loaded on (None: build.variant())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not ops.ours(x):
            return self.plain(x)
        flat = x.contiguous()
        y = torch.empty_like(flat)
        f = getattr(ops.lib(self.isa), self.ENTRY)
        ops.check(f(flat.data_ptr(), flat.numel(), y.data_ptr(), torch.get_num_threads()), self.ENTRY)
        return y


class Gelu(_Elementwise):
    """The forward of transformers' GELUTanh (gelu_pytorch_tanh) with kv_gelu_tanh."""

    ENTRY = "kv_gelu_tanh"


class Silu(_Elementwise):
    """The forward of SiLU (transformers' SiLUActivation, torch's nn.SiLU) with kv_silu: x / (1 + exp(-x)) in
    double with kvgraft's own exp, rounded once."""

    ENTRY = "kv_silu"


GEMMA = ("gemma3_text", "gemma3")
LLAMA = ("llama", "mistral", "qwen2")  # the Llama family: LlamaDecoderLayer's structure, RMSNorm without + 1, SiLU
ROPE_TYPES = ("default", "linear", "llama3")
COVERS = "covers gemma3 (tanh GELU) and llama, mistral and qwen2 (SiLU) without sliding window or soft-capping, RoPE default, linear or llama3"  # noqa: E501


def why_not(config) -> str:
    """ "" where a model with this (text) config can be computed under this definition, else what it lacks,
    as a phrase that `outside` puts in a sentence ("architecture 'gemma2'", "attention logit soft-capping")."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kind = getattr(cfg, "model_type", "")
    if kind not in GEMMA + LLAMA:
        return f"architecture {kind or '?'!r}"
    capped = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if getattr(cfg, k, None) is not None]
    if capped:
        return "logit soft-capping (" + ", ".join(capped) + ")"
    act = getattr(cfg, "hidden_activation", None) if kind in GEMMA else getattr(cfg, "hidden_act", None)
    if act != ("gelu_pytorch_tanh" if kind in GEMMA else "silu"):
        return f"activation {act!r}"
    if kind in LLAMA:
        types = tuple(getattr(cfg, "layer_types", None) or ())
        window = getattr(cfg, "sliding_window", None) if kind == "mistral" else None
        if "sliding_attention" in types or window is not None:
            return f"sliding-window attention (sliding_window={getattr(cfg, 'sliding_window', None)})"
        if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
            return f"pretraining_tp={cfg.pretraining_tp}"
    sets = _rope_sets(cfg)
    types = {kind: p.get("rope_type") for kind, p in sets.items()}
    partial = {kind: p.get("partial_rotary_factor") for kind, p in sets.items() if p.get("partial_rotary_factor", 1.0) != 1.0}
    if not types or any(t not in ROPE_TYPES for t in types.values()) or partial:
        shown = {k or "all": v for k, v in types.items()}
        return f"rotary embedding {shown}" + (f" with partial_rotary_factor {partial}" if partial else "")
    return ""


def outside(name: str, lack: str) -> str:
    """The one line that refuses model `name` lacking `lack` (`why_not`'s phrase) at load, and says how to opt in."""
    return (
        f"KVGRAFT_MODEL {name}: {lack} is outside the numerical definition {VERSION} ({COVERS}); "
        "set KVGRAFT_MACHINE_BOUND=1 to run it on this machine class only"
    )


def take_over(model, isa: str | None = None) -> str:
    """Route a loaded model's rotary tables, RMSNorms and activations (Gemma 3's tanh GELU, the Llama family's
    SiLU) through this definition on fma16's build `isa` (default `build.variant()`), and tell its attention
    modules that build (its attention is chosen at load: attn_implementation=NAME, after `register()`);
    returns a line for the log."""
    from torch import nn
    from transformers.activations import GELUTanh, SiLUActivation

    why = why_not(model.config)
    if why:
        raise ValueError(f"{why} is outside {VERSION}")
    isa = build.variant(isa)
    ops.lib(isa)
    counts = {"rotary": 0, "norms": 0, "gelu": 0, "silu": 0}
    for m in model.modules():
        name = type(m).__name__
        if name.endswith("RotaryEmbedding"):
            m.forward, counts["rotary"] = Rotary(m, isa), counts["rotary"] + 1
        elif name.endswith("RMSNorm"):
            m.forward, counts["norms"] = Norm(m, isa), counts["norms"] + 1
        elif isinstance(m, GELUTanh):
            m.forward, counts["gelu"] = Gelu(m, isa), counts["gelu"] + 1
        elif isinstance(m, (SiLUActivation, nn.SiLU)):
            m.forward, counts["silu"] = Silu(m, isa), counts["silu"] + 1
        elif name.endswith("Attention"):
            m.kvgraft_isa = isa
    model.kvgraft_definition = VERSION  # what graft_core.batch reads: every operation of a pass is this definition's
    return f"{VERSION}: attention {model.config._attn_implementation}, " + ", ".join(
        f"{v} {k}" for k, v in counts.items() if v or k in ("rotary", "norms")
    )
