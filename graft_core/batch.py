"""Decode steps of several sessions in one pass, each row byte-identical to the session's own step.

A decode step feeds one token per session. Alone, every matrix product of that step is a 1-row
product, and MKL streams each weight matrix once per session. Measured on this machine (`Batcher`
checks it whenever it is built; `bench.batch` records the widths it kept): the product W @ X^T with X
holding 4 or 8 rows (1 to 3, 5 to 7 give other bytes) gives, column by column, the bytes of the 1-row
products x_j W^T; and it streams W once for all of them, so 4 sessions' products cost about what one
session's did.

`Batcher.step` runs that: per session, the model's own code for everything that depends on the
session's cache (its masks and rotary embeddings, and Gemma3Attention's steps: q/k norms, rotary, the
cache update, the attention itself); across sessions, every matrix product (q/k/v/o, the MLP's three,
the vocabulary projection) as a padded column product, and the norms, activations and residual adds
on the stacked rows. Which widths are used is checked, not assumed: `Batcher` compares each weight
shape's padded column product with the 1-row product byte for byte on seeded inputs when it is built,
and a width that differs for any shape is not used (with no width left, sessions step one after
another through the plain forward). The rows it returns are therefore the rows
`forward.forward_chunk(model, cache, [token], pos)` returns for each session alone; tests/test_batch.py
checks it on the tiny and the real model, rows and caches.

Gemma 3 text models only (`Gemma3ForCausalLM`): the layer structure below is theirs; other models get
`supported() == False` and step one by one.

`StepGroup` is how concurrent answers use it: an answer says it is coming before it waits for the
model lock (its prefill), its decode loop registers as a session and asks for its steps; when every
registered or coming session waits for its next step (or `wait_s` passed), one of them runs the pass
for all, under the model lock the group shares with everything else that runs the model, and hands
each its row. Waiting for step lets the lock go, so a coming answer's prefill runs between passes.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

WIDTHS = (4, 8)  # padded column counts checked at build; the smallest checked one that fits is used


def _random(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def widths_equal_to_rows(weight: torch.Tensor, widths, seed: int = 0) -> tuple[int, ...]:
    """The widths at which W @ X^T, zero-padded to that many columns as `Batcher` pads, gives column by
    column the bytes of the 1-row products x_j W^T; checked full, with one real column, and with all
    but one, on seeded random rows."""
    top = max(widths, default=0)
    x = _random(top, weight.shape[1], seed)
    agreed = []
    with torch.inference_mode():
        alone = [F.linear(x[j : j + 1], weight)[0] for j in range(top)]
        for width in widths:
            ok = True
            for real in sorted({width, 1, width - 1} - {0}):
                padded = torch.zeros((width, x.shape[1]), dtype=x.dtype)
                padded[:real] = x[:real]
                cols = torch.mm(weight, padded.t()).t()
                ok = ok and all(torch.equal(cols[j], alone[j]) for j in range(real))
            if ok:
                agreed.append(width)
    return tuple(agreed)


@dataclass
class Session:
    """One session's next decode step: its cache (mutated), the token to feed and its position."""

    cache: object
    token: int
    pos: int


class Batcher:
    """Steps several sessions' decoding together where that is byte-identical to stepping each alone."""

    def __init__(self, model, widths=WIDTHS):
        self.model = model
        self.widths: tuple[int, ...] = ()
        self.why = ""
        if not self.supported():
            self.why = f"{type(model).__name__} is not a Gemma 3 text model"
            return
        shapes = {}
        for layer in model.model.layers:
            a = layer.self_attn
            for lin in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj, a.q_proj, a.k_proj, a.v_proj, a.o_proj):
                shapes.setdefault((tuple(lin.weight.shape), lin.weight.data_ptr() % 64), lin.weight)
        shapes.setdefault((tuple(model.lm_head.weight.shape), model.lm_head.weight.data_ptr() % 64), model.lm_head.weight)
        if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in shapes.values()):
            self.why = "only float32 on the CPU is checked"
            return
        agreed = set(widths)
        for weight in shapes.values():
            agreed &= set(widths_equal_to_rows(weight, sorted(agreed)))
        self.widths = tuple(sorted(agreed))
        self.threads = torch.get_num_threads()
        if not self.widths:
            self.why = f"no padded width in {widths} gave the 1-row products' bytes for every shape here"

    def supported(self) -> bool:
        m = self.model
        return (
            type(m).__name__ == "Gemma3ForCausalLM"
            and getattr(m.config, "final_logit_softcapping", None) is None
            and not getattr(m.config, "use_bidirectional_attention", False)
            and getattr(m.lm_head, "bias", None) is None
            and not getattr(m.config, "attention_bias", False)
        )

    @property
    def most(self) -> int:
        """How many sessions one pass takes (1: no batching here)."""
        return max(self.widths, default=1)

    def _columns(self, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [n, K] -> x W^T [n, N] as a padded column product (n <= the widest checked width)."""
        n = x.shape[0]
        width = min(w for w in self.widths if w >= n)
        padded = torch.zeros((width, x.shape[1]), dtype=x.dtype)
        padded[:n] = x
        return torch.mm(weight, padded.t()).t()[:n].contiguous()

    @torch.inference_mode()
    def step(self, sessions: list[Session]) -> list[torch.Tensor]:
        """Each session's logits row [vocab] for its token at its position; every cache gains the token."""
        from .forward import forward_chunk

        if len(sessions) <= 1 or not self.widths or torch.get_num_threads() != self.threads:
            return [forward_chunk(self.model, s.cache, [s.token], s.pos)[-1] for s in sessions]
        rows: list[torch.Tensor] = []
        for i in range(0, len(sessions), self.most):
            rows += self._step(sessions[i : i + self.most])
        return rows

    def _step(self, sessions: list[Session]) -> list[torch.Tensor]:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        m, lm = self.model.model, self.model
        cfg = m.config
        per = []
        for s in sessions:  # what Gemma3TextModel.forward prepares, per session, before any layer runs
            ids = torch.tensor([[s.token]], dtype=torch.long)
            pos = torch.tensor([[s.pos]], dtype=torch.long)
            emb = m.embed_tokens(ids)
            kw = {"config": cfg, "inputs_embeds": emb, "attention_mask": None, "cache": s.cache, "position_ids": pos}
            masks = {"full_attention": create_causal_mask(**kw), "sliding_attention": create_sliding_window_causal_mask(**kw)}
            rope = {t: m.rotary_emb(emb, pos, t) for t in set(cfg.layer_types)}
            per.append((emb, pos, masks, rope))
        hidden = torch.cat([p[0] for p in per], dim=0)  # [n, 1, hidden]
        for i, layer in enumerate(m.layers[: cfg.num_hidden_layers]):
            kind = cfg.layer_types[i]
            residual = hidden
            h = layer.input_layernorm(hidden)
            h = layer.post_attention_layernorm(self._attention(layer.self_attn, h, sessions, per, kind))
            hidden = residual + h
            residual = hidden
            h = layer.pre_feedforward_layernorm(hidden)
            flat = h.reshape(len(sessions), -1)
            mlp = layer.mlp
            up = self._columns(mlp.up_proj.weight, flat)
            act = mlp.act_fn(self._columns(mlp.gate_proj.weight, flat)) * up
            h = self._columns(mlp.down_proj.weight, act).reshape(h.shape)
            h = layer.post_feedforward_layernorm(h)
            hidden = residual + h
        hidden = m.norm(hidden)
        logits = self._columns(lm.lm_head.weight, hidden.reshape(len(sessions), -1)).float()
        return [logits[j] for j in range(len(sessions))]

    def _attention(self, attn, h: torch.Tensor, sessions: list[Session], per: list, kind: str) -> torch.Tensor:
        """Gemma3Attention.forward for each session's row of `h` [n, 1, hidden], its q/k/v/o products as padded
        column products across sessions; the rest (norms, rotary, cache update, attention) per session, as there."""
        from transformers.models.gemma3 import modeling_gemma3 as g3

        n = len(sessions)
        flat = h.reshape(n, -1)
        q_all = self._columns(attn.q_proj.weight, flat)
        k_all = self._columns(attn.k_proj.weight, flat)
        v_all = self._columns(attn.v_proj.weight, flat)
        interface = g3.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, g3.eager_attention_forward)
        outs = []
        for j, s in enumerate(sessions):
            shape = (1, 1, -1, attn.head_dim)  # (*input_shape, -1, head_dim) of a [1, 1, hidden] input
            q = attn.q_norm(q_all[j : j + 1].view(shape).transpose(1, 2))
            k = attn.k_norm(k_all[j : j + 1].view(shape).transpose(1, 2))
            v = v_all[j : j + 1].view(shape).transpose(1, 2)
            cos, sin = per[j][3][kind]
            q, k = g3.apply_rotary_pos_emb(q, k, cos, sin)
            kwargs = {"position_ids": per[j][1]}
            k, v = s.cache.update(k, v, attn.layer_idx, kwargs=kwargs)
            out, _ = interface(
                attn, q, k, v, per[j][2][kind], dropout=0.0, scaling=attn.scaling, sliding_window=attn.sliding_window, **kwargs
            )
            outs.append(out.reshape(1, -1))
        return self._columns(attn.o_proj.weight, torch.cat(outs, dim=0).contiguous()).reshape(n, 1, -1)


class StepGroup:
    """Concurrent sessions' decode steps, taken together in `Batcher` passes under one model lock.

    `lock` is the model's lock (re-entrant; a caller may already hold it): the group waits on a
    condition over it, so a session waiting for its step lets prefills and other model work run, and a
    pass runs while holding it. Each session's rows are those of its own `forward_chunk` steps (`Batcher`)."""

    def __init__(self, batcher: Batcher, lock=None, wait_s: float = 0.05):
        self.batcher = batcher
        self.cond = threading.Condition(lock if lock is not None else threading.RLock())
        self.wait_s = wait_s
        self.active = 0  # sessions inside their decode loop
        self.coming: set[int] = set()  # threads of answers on their way to a decode loop (prefill first)
        self._coming_lock = threading.Lock()  # not the model lock: a coming answer is about to wait for that
        self.pending: list[list] = []  # [Session, row, error] waiting for a pass
        self.passes = 0
        self.steps = 0

    @contextmanager
    def arriving(self):
        """Around an answer's wait for the model lock and its prefill: passes wait for it to join."""
        me = threading.get_ident()
        with self._coming_lock:
            self.coming.add(me)
        try:
            yield
        finally:
            with self._coming_lock:
                never_joined = me in self.coming  # failed (or was refused) before its decode loop
                self.coming.discard(me)
            if never_joined:  # passes waiting for it go on now rather than at their bound
                with self.cond:
                    self.cond.notify_all()

    @contextmanager
    def session(self):
        """Register a decode loop for its duration; yields the step function to call."""
        with self.cond:
            with self._coming_lock:
                self.coming.discard(threading.get_ident())
            self.active += 1
        try:
            yield self.step
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    def step(self, cache, token: int, pos: int) -> torch.Tensor:
        """The logits row of `token` at `pos` on `cache` (mutated), computed with the other waiting sessions' steps."""
        req = [Session(cache, token, pos), None, None]
        with self.cond:
            self.pending.append(req)
            self.cond.notify_all()
            deadline = time.monotonic() + self.wait_s
            while req[1] is None and req[2] is None:
                with self._coming_lock:
                    expected = self.active + len(self.coming)
                everyone = len(self.pending) >= min(max(expected, 1), self.batcher.most)
                if self.pending and (everyone or time.monotonic() >= deadline):
                    take = self.pending[: self.batcher.most]
                    del self.pending[: len(take)]
                    try:
                        rows = self.batcher.step([r[0] for r in take])
                    except BaseException as e:  # every taken session fails with the pass, none waits forever
                        for r in take:
                            r[2] = e
                    else:
                        for r, row in zip(take, rows, strict=True):
                            r[1] = row
                        self.passes += 1
                        self.steps += len(take)
                    self.cond.notify_all()
                    deadline = time.monotonic() + self.wait_s
                else:
                    self.cond.wait(max(0.001, deadline - time.monotonic()))
            if req[2] is not None:
                raise req[2]
            return req[1]
