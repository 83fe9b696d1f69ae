"""kvgraft-f32-v2: one numerical definition for the whole float32 forward of a Gemma 3 model.

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
- RMSNorm (`Norm`): the mean of squares as fma16's dot of the row with itself, then 1/sqrtf;
- the tanh GELU (`Gelu`): in double with kvgraft's own exp, rounded once.
What is left to ATen is elementwise float32 arithmetic (adds, products, negation, concatenation, the
embedding lookup): one correctly rounded IEEE-754 operation per element on every CPU and vector width.

It knows the module layout of transformers' Gemma 3 and nothing about artifacts or caches; another
architecture is outside it (`why_not` says what it lacks): graft_core.model refuses to load one with `outside`'s
line unless KVGRAFT_MACHINE_BOUND opts into torch's attention and a record bound to the machine class.
"""

from __future__ import annotations

import decimal

import numpy as np
import torch

from kernels import fma16, ops

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


def inverse_frequencies(base: float, dim: int) -> torch.Tensor:
    """base^(-e_i), e_i = float32(2i) / float32(dim) as transformers forms it, each correctly rounded to
    float32 from a 60-digit decimal power (pure software: the same digits on every machine)."""
    ctx = decimal.Context(prec=60)
    out = []
    for i in range(0, dim, 2):
        e = decimal.Decimal(float(np.float32(i) / np.float32(dim)))
        out.append(_nearest_f32(ctx.power(decimal.Decimal(base), -e)))
    return torch.tensor(np.array(out, dtype=np.float32))


class Rotary:
    """The forward of Gemma3RotaryEmbedding: (cos, sin) [B, S, D] for position_ids [B, S] and a layer type."""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa
        cfg = module.config
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.tables = {}
        for kind in module.layer_types:
            params = cfg.rope_parameters[kind]
            self.tables[kind] = (
                inverse_frequencies(float(params["rope_theta"]), dim),
                float(getattr(module, f"{kind}_attention_scaling")),
            )

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str):
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return self.plain(x, position_ids, layer_type)
        inv, scaling = self.tables[layer_type]
        pos = position_ids.to(torch.int64).contiguous()
        f = inv.numel()
        cos = torch.empty((*pos.shape, 2 * f), dtype=torch.float32)
        sin = torch.empty_like(cos)
        ops.check(
            ops.lib(self.isa).kv_rotary(pos.data_ptr(), pos.numel(), inv.data_ptr(), f, scaling, cos.data_ptr(), sin.data_ptr()),
            "rotary",
        )
        return cos, sin


class Norm:
    """The forward of Gemma3RMSNorm (y = x / rms(x) * (1 + w)) with kv_rmsnorm's order."""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa  # the build the model was loaded on (None: fma16.variant())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.module.weight
        if not ops.ours(x) or w.dtype != torch.float32:
            return self.plain(x)
        n = x.shape[-1]
        flat = x.reshape(-1, n).contiguous()
        y = torch.empty_like(flat)
        weight = w.detach().contiguous()
        rc = ops.lib(self.isa).kv_rmsnorm(
            flat.data_ptr(), flat.shape[0], n, weight.data_ptr(), float(self.module.eps), y.data_ptr(), torch.get_num_threads()
        )
        ops.check(rc, "RMSNorm")
        return y.view(x.shape)


class Gelu:
    """The forward of transformers' GELUTanh (gelu_pytorch_tanh) with kv_gelu_tanh."""

    def __init__(self, module, isa: str | None = None):
        self.module = module
        self.plain = module.forward
        self.isa = isa  # the build the model was loaded on (None: fma16.variant())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not ops.ours(x):
            return self.plain(x)
        flat = x.contiguous()
        y = torch.empty_like(flat)
        ops.check(ops.lib(self.isa).kv_gelu_tanh(flat.data_ptr(), flat.numel(), y.data_ptr(), torch.get_num_threads()), "GELU")
        return y


COVERS = "covers gemma3 with tanh GELU and default RoPE"  # what the definition computes, as refusals say it


def why_not(config) -> str:
    """ "" where a model with this (text) config can be computed under this definition, else what it lacks,
    as a phrase that `outside` puts in a sentence ("architecture 'llama'", "attention logit soft-capping")."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(cfg, "model_type", "") not in ("gemma3_text", "gemma3"):
        return f"architecture {getattr(cfg, 'model_type', '?')!r}"
    capped = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if getattr(cfg, k, None) is not None]
    if capped:
        return "logit soft-capping (" + ", ".join(capped) + ")"
    if getattr(cfg, "hidden_activation", None) != "gelu_pytorch_tanh":
        return f"activation {getattr(cfg, 'hidden_activation', None)!r}"
    ropes = getattr(cfg, "rope_parameters", None) or {}
    types = {kind: (p or {}).get("rope_type") for kind, p in ropes.items()} if isinstance(ropes, dict) else {}
    if not types or any(t != "default" for t in types.values()):
        return f"rotary embedding {types}"
    return ""


def outside(name: str, lack: str) -> str:
    """The one line that refuses model `name` lacking `lack` (`why_not`'s phrase) at load, and says how to opt in."""
    return (
        f"KVGRAFT_MODEL {name}: {lack} is outside the numerical definition {VERSION} ({COVERS}); "
        "set KVGRAFT_MACHINE_BOUND=1 to run it on this machine class only"
    )


def take_over(model, isa: str | None = None) -> str:
    """Route a loaded Gemma 3 model's rotary tables, RMSNorms and GELUs through this definition on fma16's
    build `isa` (default `fma16.variant()`), and tell its attention modules that build (its attention is
    chosen at load: attn_implementation=NAME, after `register()`); returns a line for the log."""
    from transformers.activations import GELUTanh
    from transformers.models.gemma3 import modeling_gemma3 as g3

    why = why_not(model.config)
    if why:
        raise ValueError(f"{why} is outside {VERSION}")
    isa = fma16.variant(isa)
    ops.lib(isa)
    counts = {"rotary": 0, "norms": 0, "gelu": 0}
    for m in model.modules():
        if isinstance(m, g3.Gemma3RotaryEmbedding):
            m.forward, counts["rotary"] = Rotary(m, isa), counts["rotary"] + 1
        elif isinstance(m, g3.Gemma3RMSNorm):
            m.forward, counts["norms"] = Norm(m, isa), counts["norms"] + 1
        elif isinstance(m, GELUTanh):
            m.forward, counts["gelu"] = Gelu(m, isa), counts["gelu"] + 1
        elif isinstance(m, g3.Gemma3Attention):
            m.kvgraft_isa = isa
    model.kvgraft_definition = VERSION  # what graft_core.batch reads: every operation of a pass is this definition's
    return f"{VERSION}: attention {model.config._attn_implementation}, " + ", ".join(f"{v} {k}" for k, v in counts.items())
