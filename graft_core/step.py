"""The lean one-token forward: a decode step's decoder layers in one C call (kv_decode_layers in kernels/c/step.c).

A step through the model's modules makes ~50 small torch calls and a dozen ctypes calls per layer; at one
row per product the Python between them cost about a quarter of a step. `Stepper` keeps, per layer, a
table of what the C side reads (the weights' rows in their formats, the norms' weights, the shapes) and
per step hands it the sessions' rows, the rotary cos/sin of their positions and their caches' buffers
(graft_core.layers: the new key/value row is written in place, no copy of the cache; a restored artifact's
rows are read where the restore put them, one copy for every session that grafts it). The C code runs the
operations `graft_core.batch.Batcher._pass` runs, one for one, so every row and every cached byte is the
same (tests/test_step.py compares them with `forward_chunk`). The embedding lookup, the final norm and the
vocabulary product stay in Python: one call each per step.

Gemma 3 and the Llama family (the layer table says which norms, which activation and which biases a layer
has). Only where kvgraft-f32-v2 computes the whole forward (fma16 products over every linear layer, its
RMSNorm and activation) and the cache's layers are the growing ones; `Stepper.why` says why not otherwise.
"""

from __future__ import annotations

import ctypes

import torch

from kernels import build, fma16

from .layers import commit_rows, is_sliding, reserve_rows

_KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Layer(ctypes.Structure):
    """kv_layer in kernels/c/step.c: one decoder layer's weights (rows in their formats), norms and shapes."""

    _fields_ = [
        ("w", ctypes.c_void_p * 7),
        ("fmt", ctypes.c_int32 * 7),
        ("n", ctypes.c_int64 * 7),
        ("k", ctypes.c_int64 * 7),
        ("norm", ctypes.c_void_p * 6),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("inter", ctypes.c_int64),
        ("bias", ctypes.c_void_p * 7),
        ("plus_one", ctypes.c_int32),
        ("act", ctypes.c_int32),
    ]


def _declare(lib) -> None:
    if getattr(lib, "_kvgraft_step", False):
        return
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.kv_layer_size.restype = c_int
    lib.kv_decode_layers.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, c_int]
    lib._kvgraft_step = True


def _norms(layer) -> tuple:
    """A decoder layer's norms in kv_layer's order (input, q, k, post-attention, pre-feedforward,
    post-feedforward), None where it has none: the Llama family's post_attention_layernorm is the norm before
    its MLP (LlamaDecoderLayer), so it sits as the pre-feedforward one."""
    a = layer.self_attn
    pre = getattr(layer, "pre_feedforward_layernorm", None)
    if pre is None:  # the Llama family
        return (layer.input_layernorm, None, None, None, layer.post_attention_layernorm, None)
    return (
        layer.input_layernorm,
        a.q_norm,
        a.k_norm,
        layer.post_attention_layernorm,
        pre,
        layer.post_feedforward_layernorm,
    )


class Stepper:
    """One-token steps of one or several sessions through kv_decode_layers; `why` is "" where it runs."""

    def __init__(self, model):
        from .numerics import Gelu, Norm, Rotary, Silu

        self.model, self.why = model, ""
        m = model.model
        cfg = m.config
        ops, all_norms, acts = [], [], set()
        for layer in m.layers[: cfg.num_hidden_layers]:
            a, mlp = layer.self_attn, layer.mlp
            mods = [getattr(a, k) if k.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else getattr(mlp, k) for k in _KINDS]
            ops.append([fma16.product_of(x) for x in mods])
            norms = _norms(layer)
            all_norms.append(norms)
            act = type(mlp.act_fn.forward)
            acts.add(act)
            if not all(n is None or isinstance(n.forward, Norm) for n in norms) or act not in (Gelu, Silu):
                self.why = "the norms and activation are not kvgraft-f32-v2's"
        if not all(all(ops_) for ops_ in ops):
            self.why = "fma16 does not compute every product"
        elif not isinstance(m.rotary_emb.forward, Rotary) or not isinstance(m.norm.forward, Norm):
            self.why = self.why or "the rotary tables and final norm are not kvgraft-f32-v2's"
        if self.why:
            return
        isas = {op.isa for layer_ops in ops for op in layer_ops}
        if len(isas) != 1:
            self.why = "the products run on more than one build"
            return
        self.isa = isas.pop()
        self.lib = build.lib(self.isa)
        _declare(self.lib)
        assert self.lib.kv_layer_size() == ctypes.sizeof(_Layer), "kv_layer's layout differs between C and Python"
        self.keep = []  # every tensor a table points into, alive as long as the table
        table = (_Layer * len(ops))()
        eps, kinds = set(), set()
        for i, (layer, layer_ops, norms) in enumerate(zip(m.layers, ops, all_norms)):
            t, a = table[i], layer.self_attn
            for j, op in enumerate(layer_ops):
                src = op.source
                self.keep.append(src)
                t.w[j], t.fmt[j], t.n[j], t.k[j] = src.data_ptr(), op.fmt, op.n, op.k
                bias = op.module.bias
                if bias is not None:
                    b = bias.detach().contiguous()
                    self.keep.append(b)
                    t.bias[j] = b.data_ptr()
            for j, n in enumerate(norms):
                if n is None:
                    continue
                w = n.weight.detach().contiguous()
                self.keep.append(w)
                t.norm[j] = w.data_ptr()
                eps.add(n.forward.eps)
                kinds.add(n.forward.plus_one)
            t.eps, t.scale = float(norms[0].forward.eps), float(a.scaling)
            t.heads, t.kv_heads, t.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, a.head_dim
            t.hidden, t.inter = cfg.hidden_size, layer_ops[4].n
            t.plus_one = int(norms[0].forward.plus_one)
            t.act = int(type(layer.mlp.act_fn.forward) is Silu)
        if len(eps) != 1 or len(kinds) != 1:
            self.why = "the norms have different epsilons or kinds"
            return
        self.table, self.layers = table, len(ops)
        # Gemma 3's rotary module takes the layer type (one table per type); the Llama family's has one table
        self.kinds = list(cfg.layer_types[: cfg.num_hidden_layers]) if None not in m.rotary_emb.forward.tables else None

    def step(self, items: list[tuple]) -> list[torch.Tensor] | None:
        """Each (cache, token, pos)'s logits row [vocab]; every cache gains its token. None (nothing done)
        where a cache is not one this path writes (the caller takes the modules' path)."""
        return self.run([(cache, [tok], pos) for cache, tok, pos in items])

    @torch.inference_mode()
    def run(self, items: list[tuple]) -> list[torch.Tensor] | None:
        """Each (cache, ids, start)'s last logits row [vocab] (a decode step: one id; a prompt after a restore:
        its ids), every cache gaining its ids. None (nothing done) where a cache is not one this path writes:
        another cache class, or one that holds nothing yet (a first prefill takes the modules' path)."""
        m, lm = self.model.model, self.model
        S = len(items)
        held = []
        for cache, ids, _ in items:
            if len(cache.layers) != self.layers or not ids:
                return None
            got = [reserve_rows(layer, len(ids)) for layer in cache.layers]
            if any(r is None for r in got):
                return None
            held.append(got)
        counts = [len(ids) for _, ids, _ in items]
        ids_t = torch.tensor([[t for _, ids, _ in items for t in ids]], dtype=torch.long)
        pos = torch.tensor([[start + i for _, ids, start in items for i in range(len(ids))]], dtype=torch.long)
        x = m.embed_tokens(ids_t).contiguous()  # [1, rows, hidden]
        if self.kinds is None:
            ropes = {None: m.rotary_emb(x, pos)}  # [1, rows, head_dim]
        else:
            ropes = {kind: m.rotary_emb(x, pos, kind) for kind in set(self.kinds)}  # [1, rows, head_dim] each
        n = self.layers * S
        kb, vb = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)()
        cap, start, end = (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
        cos, sin = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)()
        bk, bv, bcap, bn = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
        window = (ctypes.c_int64 * self.layers)()
        first = items[0][0].layers
        for li in range(self.layers):
            window[li] = first[li].sliding_window if is_sliding(first[li]) else 0
            c, s_ = ropes[None if self.kinds is None else self.kinds[li]]
            row = 0
            for si in range(S):
                r, at = held[si][li], li * S + si
                if is_sliding(items[si][0].layers[li]) != bool(window[li]):
                    return None
                kb[at], vb[at], cap[at], start[at], end[at] = r.k.data_ptr(), r.v.data_ptr(), r.k.shape[2], r.start, r.end
                if r.base_k is not None:  # restored rows read in place, shared with the other sessions that graft them
                    skip = r.bstart * r.base_k.shape[-1] * r.base_k.element_size()
                    bk[at], bv[at] = r.base_k.data_ptr() + skip, r.base_v.data_ptr() + skip
                    bcap[at], bn[at] = r.base_k.shape[2], r.shared
                cos[at] = c.data_ptr() + row * c.shape[-1] * 4
                sin[at] = s_.data_ptr() + row * s_.shape[-1] * 4
                row += counts[si]
        rc = self.lib.kv_decode_layers(
            ctypes.addressof(self.table), self.layers, S, (ctypes.c_int64 * S)(*counts), x.data_ptr(), kb, vb, cap, start, end,
            bk, bv, bcap, bn, window, cos, sin, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"kvgraft's decode step failed ({rc})")
        for (cache, _ids, _), count in zip(items, counts):
            for layer in cache.layers:
                commit_rows(layer, count)
        last = torch.tensor([sum(counts[: i + 1]) - 1 for i in range(S)], dtype=torch.long)
        hidden = m.norm(x)[0].index_select(0, last).contiguous()  # each item's last row [S, hidden]
        logits = fma16.product_of(lm.lm_head).product(hidden).float()
        return [logits[j] for j in range(S)]
