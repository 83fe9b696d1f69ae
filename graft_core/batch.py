"""Decode steps of several sessions in one pass, each row byte-identical to the session's own step.

A decode step feeds one token per session. Alone, every matrix product of that step is a 1-row
product, and MKL streams each weight matrix once per session. Measured on this machine (`Batcher`
checks it whenever it is built; `bench.batch` records the widths it kept): the product W @ X^T with X
holding 4 or 8 rows (1 to 3, 5 to 7 give other bytes) gives, column by column, the bytes of the 1-row
products x_j W^T; and it streams W once for all of them, so 4 sessions' products cost about what one
session's did.

`Batcher.step` runs that: per session, the model's own code for everything that depends on the
session's cache (its masks and rotary cos/sin, and Gemma3Attention's cache update and attention
itself); across sessions, every matrix product (q/k/v/o, the MLP's three, the vocabulary projection)
as a padded column product, and the norms (the q/k norms too), the rotary embedding (each row with its
own session's cos/sin), activations and residual adds on the stacked rows: they act row by row and
element by element. Which widths are used is checked, not assumed: `Batcher` compares each weight
shape's padded column product with the 1-row product byte for byte on seeded inputs when it is built,
and a width that differs for any shape is not used (with no width left, sessions step one after
another through the plain forward). The rows it returns are therefore the rows
`forward.forward_chunk(model, cache, [token], pos)` returns for each session alone; tests/test_batch.py
checks it on the tiny and the real model, rows and caches.

Gemma 3 text models (`Gemma3ForCausalLM`): the layer structure below is theirs. The Llama family (Llama,
Mistral, Qwen2) under the numerical definition: its passes are the stepper's one C call (graft_core.step), or
where that does not take them (a first prefill on an empty cache) each item's own forward. Other models,
and the Llama family off the definition, get `supported() == False` and step one by one. A Gemma 3 off the numerical definition (machine-bound: torch's
attention, norms or products) takes a width only where whole passes measured at build give each session's
own bytes (`Batcher._measure`, as under torch's products); there the product checks alone do not decide it.

`Batcher.prefill` does the same for prompts: from 4 rows up a row of MKL's product does not depend on
the other rows, so prompts of checked lengths are stacked into one product (`stack_sizes`).

`StepGroup` (graft_core/stepgroup.py) is how concurrent answers use it: an answer says it is coming before it waits for the
model lock, asks for its prompt's row, then its decode loop registers as a session and asks for its
steps; when every registered or coming answer waits (or `wait_s` passed), one of them runs a round for
all (`Batcher.run`: the waiting prompts and steps in one pass, each product taken as padded columns for
the steps' rows and stacked rows for the prompts', so a prompt arriving while others decode shares their
weight streams and their vocabulary product), under the model lock the group shares with everything
else that runs the model, and hands each its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .products import seeded_rows

LLAMA_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")  # under the definition only
WIDTHS = (4, 8)  # padded column counts checked at build; the smallest checked one that fits is used


def column_product(weight: torch.Tensor, x: torch.Tensor, width: int) -> torch.Tensor:
    """x [n, K] -> x W^T [n, N] as W @ X^T over `width` columns, x copied into a fresh zeroed buffer of
    them (always a fresh, aligned buffer, as the check had it): the call `Batcher` makes and its check compares."""
    columns = torch.zeros((width, x.shape[1]), dtype=x.dtype)
    columns[: x.shape[0]] = x
    return torch.mm(weight, columns.t()).t()[: x.shape[0]].contiguous()


def widths_equal_to_rows(weight: torch.Tensor, widths, seed: int = 0) -> tuple[int, ...]:
    """The widths at which W @ X^T, zero-padded to that many columns as `Batcher` pads, gives column by
    column the bytes of the 1-row products x_j W^T; checked full, with one real column, and with all
    but one, on seeded random rows."""
    top = max(widths, default=0)
    x = seeded_rows(top, weight.shape[1], seed)
    agreed = []
    with torch.inference_mode():
        alone = [F.linear(x[j : j + 1], weight)[0] for j in range(top)]
        for width in widths:
            ok = True
            for real in sorted({width, 1, width - 1} - {0}):
                cols = column_product(weight, x[:real], width)
                ok = ok and all(torch.equal(cols[j], alone[j]) for j in range(real))
            if ok:
                agreed.append(width)
    return tuple(agreed)


STACK_MAX = 512  # rows of one prompt pass
STACK_SIZES = tuple(range(4, 65)) + tuple(range(96, STACK_MAX + 1, 32))  # stacked row counts checked at build


def stack_sizes(weights, sizes=STACK_SIZES, seed: int = 1) -> frozenset[int]:
    """The row counts T at which a T-row product's rows are, byte for byte, the rows of the same inputs
    in the STACK_MAX-row product, at the start, the end and in between: a prompt's rows stacked with other
    prompts' rows (padded up to a checked count) then give that prompt's own product."""
    agreed = set(sizes)
    with torch.inference_mode():
        for w in weights:
            x = seeded_rows(max(sizes), w.shape[1], seed)
            ref = F.linear(x, w)
            for t in sorted(agreed):
                at = (0, max(sizes) - t, (max(sizes) - t) // 3)
                if not all(torch.equal(F.linear(x[a : a + t], w), ref[a : a + t]) for a in at):
                    agreed.discard(t)
    return frozenset(agreed)


# The whole-pass checks (torch's products): seeded caches of these lengths, and (steps, prompt lengths) passes.
CHECK_LENGTHS = (3, 5, 7, 9, 11, 13, 15, 17)
CHECK_PROMPTS = ((0, (16, 13, 12)), (0, (4, 64, 96)), (3, (16, 13)), (1, (33,)))


def _same_layers(a, b) -> bool:
    """Two caches hold the same bytes in every layer's keys and values."""
    return all(
        x.keys.numpy().tobytes() == y.keys.numpy().tobytes() and x.values.numpy().tobytes() == y.values.numpy().tobytes()
        for x, y in zip(a.layers, b.layers, strict=True)
    )


def _linears(model) -> list:
    """Every linear layer a pass multiplies by: each layer's MLP three and q/k/v/o, then the vocabulary head."""
    out = []
    for layer in model.model.layers:
        a = layer.self_attn
        out += [layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj, a.q_proj, a.k_proj, a.v_proj, a.o_proj]
    return [*out, model.lm_head]


def _fma16_products(model) -> dict:
    """id(weight) -> fma16 product for every linear layer the passes call, or {} unless fma16 has them all."""
    from kernels.fma16 import product_of

    ops = {id(lin.weight): product_of(lin) for lin in _linears(model)}
    return ops if all(ops.values()) else {}


def lean(model) -> Batcher | None:
    """The model's Batcher where its passes are the lean path (fma16 computes every product: a prompt or a
    step alone goes through `_pass`, the rows `forward_chunk` gives), else None. Built once per model."""
    found = model.__dict__.get("_kvgraft_lean", False)
    if found is False:
        built = Batcher(model)
        found = built if built.fma16 and built.defined else None
        model.__dict__["_kvgraft_lean"] = found
    return found


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
        self.fma16: dict = {}  # id(weight) -> its fma16 product, where fma16 computes every product here
        self.widths: tuple[int, ...] = ()
        self.stack_sizes: frozenset[int] = frozenset()
        self.why = ""
        self.stepper = None  # the steps' decoder layers in one C call (graft_core.step), where it runs
        # Under the numerical definition (graft_core.numerics.take_over) every operation of a pass acts row by
        # row; off it (the machine-bound path) the products are checked below and whole passes are measured.
        self.defined = bool(getattr(model, "kvgraft_definition", ""))
        if not self.supported():
            self.why = f"{type(model).__name__} is not a Gemma 3 text model, nor a Llama-family one under the definition"
            return
        self.fma16 = _fma16_products(model)
        if self.fma16 and self.defined:  # fma16 reads its own copy of every weight (GGUF blocks or float32)
            # fma16 computes each row from that row and the weight alone (checked per shape when it took the
            # products over): any number of rows, no padding, gives each row's own bytes.
            self.widths = tuple(widths)
            self.threads = torch.get_num_threads()
            self.stack_sizes = frozenset(range(1, STACK_MAX + 1))
            from .step import Stepper

            stepper = Stepper(model)
            self.stepper = stepper if not stepper.why else None
            return
        if self.fma16:  # fma16's products under torch's attention and norms: only the products are row by row
            self.widths, self.threads = tuple(widths), torch.get_num_threads()
            self.stack_sizes = frozenset(range(1, STACK_MAX + 1))
            self._measure()
            return
        shapes = {}
        for lin in _linears(model):
            shapes.setdefault((tuple(lin.weight.shape), lin.weight.data_ptr() % 64), lin.weight)
        if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in shapes.values()):
            self.why = "only float32 on the CPU is checked"
            return
        agreed = set(widths)
        for weight in shapes.values():
            agreed &= set(widths_equal_to_rows(weight, sorted(agreed)))
        self.widths = tuple(sorted(agreed))
        self.threads = torch.get_num_threads()
        layer_shapes = [w for w in shapes.values() if w is not model.lm_head.weight]
        self.stack_sizes = stack_sizes(layer_shapes) if self.widths else frozenset()
        if not self.widths:
            self.why = f"no padded width in {widths} gave the 1-row products' bytes for every shape here"
            return
        self._measure()

    def _measure(self) -> None:
        """Where torch computes part of a pass (its products, or its attention, norms and activations off the
        definition), the products agreeing is not the pass agreeing: those run on the stacked rows or on views
        of them, and their kernels may treat a row by where it sits (a tail, another kernel for another row
        count or stride). Whole passes are measured on this model first; what differs is not used."""
        steps_differ = self._steps_differ()
        if steps_differ:
            self.widths, self.stack_sizes = (), frozenset()
            self.why = f"a batched decode pass differed from stepping alone on this machine ({steps_differ})"
            return
        prompts_differ = self._prompts_differ()
        if prompts_differ:
            self.stack_sizes = frozenset()
            self.why = f"prompts run alone: a stacked pass differed from each prompt alone on this machine ({prompts_differ})"

    def _check_caches(self, lengths, seed: int) -> list:
        """Seeded caches of `lengths` tokens (0: an empty cache) for the whole-pass checks."""
        from .forward import forward_chunk, new_cache

        gen = torch.Generator().manual_seed(seed)
        out = []
        for n in lengths:
            cache = new_cache(self.model)
            if n:
                forward_chunk(self.model, cache, torch.randint(3, self.model.config.vocab_size, (n,), generator=gen).tolist(), 0)
            out.append(cache)
        return out

    def _pass_differs(self, lengths, items_of, product) -> bool:
        """Whether one pass over items built on seeded caches of `lengths` (`items_of(caches)` -> the pass's
        (cache, ids, start) items) differs, in any logits row or any cache row, from each item alone."""
        import copy

        from .forward import forward_chunk

        caches = self._check_caches(lengths, seed=len(lengths))
        alone, together = [copy.deepcopy(c) for c in caches], [copy.deepcopy(c) for c in caches]
        rows_a = [forward_chunk(self.model, c, list(ids), s)[-1] for c, ids, s in items_of(alone)]
        with torch.inference_mode():
            rows_t = self._pass(items_of(together), product)
        if any(a.numpy().tobytes() != t.numpy().tobytes() for a, t in zip(rows_a, rows_t, strict=True)):
            return True
        return not all(_same_layers(x, y) for x, y in zip(alone, together, strict=True))

    def _steps_differ(self) -> str:
        """'' where one decode pass of every session count 2..most gives each session's own rows and cache
        rows; else the first count that did not (measured on this model, seeded caches and tokens)."""
        for n in range(2, self.most + 1):
            lengths = CHECK_LENGTHS[:n]

            def items(caches, lengths=lengths):
                return [(c, [7 + j], lengths[j]) for j, c in enumerate(caches)]

            if self._pass_differs(lengths, items, self._columns):
                return f"{n} sessions"
        return ""

    def _prompts_differ(self) -> str:
        """'' where passes of stacked prompts, and of steps beside prompts, give each its own rows here."""
        gen = torch.Generator().manual_seed(3)
        vocab = self.model.config.vocab_size
        for steps, prompts in CHECK_PROMPTS:
            prompts = [p for p in prompts if p in self.stack_sizes]
            if not prompts:
                continue
            # a pass holds at most `most` items (prefill and run group them so): check the passes that can
            # happen here, not one wider than every checked column width (its last rows have no width)
            steps = min(steps, self.most - 1)
            prompts = prompts[: self.most - steps]
            ids = [torch.randint(3, vocab, (t,), generator=gen).tolist() for t in prompts]
            lengths = CHECK_LENGTHS[: steps + len(prompts)]

            def items(caches, n=steps, ids=ids, lengths=lengths):
                return [(c, [7 + j], lengths[j]) for j, c in enumerate(caches[:n])] + [
                    (c, ids[j], lengths[n + j]) for j, c in enumerate(caches[n:])
                ]

            product = self._mixed(steps) if steps else self._stacked
            if self._pass_differs(lengths, items, product):
                return f"{steps} steps beside prompts of {prompts} tokens"
        return ""

    def describe(self) -> str:
        """How this machine's passes batch, for the record a process prints (selftest, start-up)."""
        if self.fma16 and self.defined:
            return f"together, up to {self.most} sessions a pass (fma16 computes each row from that row alone)"
        if not self.widths:
            return f"one by one: {self.why}"
        prompts = "prompts stacked" if self.stack_sizes else "prompts alone"
        return f"together, up to {self.most} sessions a pass, {prompts} (whole passes measured equal to alone here)"

    def supported(self) -> bool:
        """Gemma 3 text models (the passes below are their layer structure), and under the numerical definition
        the Llama family too: there every pass is the stepper's C call, or each item's own forward."""
        m = self.model
        if self.defined and type(m).__name__ in LLAMA_CLASSES:
            return True
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
        if self.fma16:
            return self.fma16[id(weight)].product(x)
        return column_product(weight, x, min(w for w in self.widths if w >= x.shape[0]))

    @torch.inference_mode()
    def step(self, sessions: list[Session]) -> list[torch.Tensor]:
        """Each session's logits row [vocab] for its token at its position; every cache gains the token."""
        from .forward import forward_chunk

        if self.fma16 and self.defined and torch.get_num_threads() == self.threads:  # alone too: the lean pass
            return [row for i in range(0, len(sessions), self.most) for row in self._step(sessions[i : i + self.most])]
        if len(sessions) <= 1 or not self.widths or torch.get_num_threads() != self.threads:
            return [forward_chunk(self.model, s.cache, [s.token], s.pos)[-1] for s in sessions]
        rows: list[torch.Tensor] = []
        for i in range(0, len(sessions), self.most):
            rows += self._step(sessions[i : i + self.most])
        return rows

    def _step(self, sessions: list[Session]) -> list[torch.Tensor]:
        return self._pass([(s.cache, [s.token], s.pos) for s in sessions], self._columns)

    @torch.inference_mode()
    def prefill(self, prompts: list[tuple]) -> list[torch.Tensor]:
        """Each prompt's (cache, ids, start) last logits row [vocab], as `forward_chunk(model, cache, ids,
        start)[-1]` gives it alone (every cache gains its ids). A prompt whose length is not a checked
        stacked size runs alone; the others run in passes of up to `most` prompts and STACK_MAX rows."""
        from .forward import forward_chunk

        rows: list = [None] * len(prompts)
        group: list[int] = []
        lean = bool(self.fma16) and self.defined
        together = (len(prompts) > 1 or lean) and bool(self.stack_sizes) and torch.get_num_threads() == self.threads

        def flush() -> None:
            if len(group) == 1 and not lean:
                cache, ids, start = prompts[group[0]]
                rows[group[0]] = forward_chunk(self.model, cache, list(ids), start)[-1]
            elif group:
                for i, r in zip(group, self._pass([prompts[i] for i in group], self._stacked), strict=True):
                    rows[i] = r
            group.clear()

        for i, (cache, ids, start) in enumerate(prompts):
            if not together or len(ids) not in self.stack_sizes:
                rows[i] = forward_chunk(self.model, cache, list(ids), start)[-1]
                continue
            if len(group) == self.most or sum(len(prompts[j][1]) for j in group) + len(ids) > max(self.stack_sizes):
                flush()
            group.append(i)
        flush()
        return rows

    def _stacked(self, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> x W^T as one product over T rows, zero-padded up to the next checked stacked size."""
        if self.fma16:  # no row depends on another: no padding
            return self.fma16[id(weight)].product(x)
        t = x.shape[0]
        size = min(s for s in self.stack_sizes if s >= t)
        if size == t:
            return F.linear(x, weight)
        padded = torch.zeros((size, x.shape[1]), dtype=x.dtype)
        padded[:t] = x
        return F.linear(padded, weight)[:t]

    @torch.inference_mode()
    def run(self, prompts: list[tuple], sessions: list[Session]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(`prefill(prompts)`, `step(sessions)`), the same rows, in as few passes as the checks allow: a pass
        takes up to `most` of them, the steps' rows as padded columns and the prompts' rows stacked, product
        by product, so each weight is streamed once for both, and one vocabulary product takes every last
        row (a prompt alone pays that product for its one row). A prompt of an unchecked length, or a pass
        of one prompt or one step, runs as `prefill`/`step` run it."""
        if not (prompts and sessions) or not self.stack_sizes or torch.get_num_threads() != self.threads:
            return self.prefill(prompts), self.step(sessions)
        stackable = [i for i, p in enumerate(prompts) if len(p[1]) in self.stack_sizes]
        rest = [i for i in range(len(prompts)) if i not in stackable]
        prompt_rows: list = [None] * len(prompts)
        for i, row in zip(rest, self.prefill([prompts[i] for i in rest]), strict=True):
            prompt_rows[i] = row
        step_rows: list = []
        queue = [("s", j) for j in range(len(sessions))] + [("p", i) for i in stackable]
        while queue:
            group, rows = [], 0
            while queue and len(group) < self.most:
                kind, i = queue[0]
                t = len(prompts[i][1]) if kind == "p" else 0
                if rows + t > max(self.stack_sizes):
                    break
                group.append(queue.pop(0))
                rows += t
            steps = [sessions[i] for kind, i in group if kind == "s"]
            mine = [i for kind, i in group if kind == "p"]
            if not steps or not mine:
                step_rows += self.step(steps) if steps else []
                for i, row in zip(mine, self.prefill([prompts[i] for i in mine]) if mine else [], strict=True):
                    prompt_rows[i] = row
                continue
            items = [(s.cache, [s.token], s.pos) for s in steps] + [prompts[i] for i in mine]
            out = self._pass(items, self._mixed(len(steps)))
            step_rows += out[: len(steps)]
            for i, row in zip(mine, out[len(steps) :], strict=True):
                prompt_rows[i] = row
        return prompt_rows, step_rows

    def _mixed(self, n: int):
        """The product of a pass whose first `n` rows are decode steps (padded columns, `_columns`) and the
        rest stacked prompts (`_stacked`, on a fresh copy of their rows, as `prefill`'s passes have them)."""

        def product(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self._columns(weight, x[:n]), self._stacked(weight, x[n:].clone())])

        return product

    def _lean(self, items: list[tuple]) -> list[torch.Tensor] | None:
        """The items' last rows through the stepper's one C call per pass (graft_core.step), or None where it
        does not take them (no stepper, or a cache it does not write)."""
        if self.stepper is None:
            return None
        return self.stepper.run([(cache, list(ids), start) for cache, ids, start in items])

    def _pass(self, items: list[tuple], product) -> list[torch.Tensor]:
        """One pass over sessions' (cache, ids, start): per session, what Gemma3TextModel.forward prepares
        (embedding, masks, rotary embeddings) and Gemma3Attention's steps around its products; across
        sessions every matrix product through `product` (padded columns for 1-row steps, stacked rows for
        prompts) and each session's last row's vocabulary projection as a padded column product."""
        rows = self._lean(items)
        if rows is not None:
            return rows
        if type(self.model).__name__ != "Gemma3ForCausalLM":  # the Llama family, under the definition: each item's
            from .forward import forward_chunk  # own forward (what the stepper's rows are checked against)

            return [forward_chunk(self.model, cache, list(ids), start)[-1] for cache, ids, start in items]
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        m, lm = self.model.model, self.model
        cfg = m.config
        per, spans, embs, total = [], [], [], 0
        for cache, ids, start in items:
            ids_t = torch.tensor([list(ids)], dtype=torch.long)
            pos = torch.arange(start, start + len(ids), dtype=torch.long).unsqueeze(0)
            emb = m.embed_tokens(ids_t)
            # the masks Gemma3TextModel.forward builds for these ids alone, a one-token step's too: attention
            # given no mask where the model's forward gives it one takes another kernel path (other bits)
            kw = {"config": cfg, "inputs_embeds": emb, "attention_mask": None, "cache": cache, "position_ids": pos}
            masks = {
                "full_attention": create_causal_mask(**kw),
                "sliding_attention": create_sliding_window_causal_mask(**kw),
            }
            rope = {t: m.rotary_emb(emb, pos, t) for t in set(cfg.layer_types)}
            per.append((cache, pos, masks, rope))
            embs.append(emb)
            spans.append((total, total + len(ids)))
            total += len(ids)
        hidden = torch.cat(embs, dim=1)  # [1, rows of all sessions, hidden]
        # each session's rotary cos/sin, stacked along the rows: applied once per layer to every row
        ropes = {t: tuple(torch.cat([r[3][t][j] for r in per], dim=1) for j in (0, 1)) for t in set(cfg.layer_types)}
        for i, layer in enumerate(m.layers[: cfg.num_hidden_layers]):
            kind = cfg.layer_types[i]
            residual = hidden
            h = layer.input_layernorm(hidden)
            h = layer.post_attention_layernorm(self._attention(layer.self_attn, h, per, spans, ropes[kind], kind, product))
            hidden = residual + h
            residual = hidden
            h = layer.pre_feedforward_layernorm(hidden)
            flat = h.reshape(total, -1)
            mlp = layer.mlp
            up = product(mlp.up_proj.weight, flat)
            act = mlp.act_fn(product(mlp.gate_proj.weight, flat)) * up
            h = product(mlp.down_proj.weight, act).reshape(h.shape)
            h = layer.post_feedforward_layernorm(h)
            hidden = residual + h
        hidden = m.norm(hidden)
        last = torch.cat([hidden[0, e - 1 : e] for _, e in spans], dim=0)  # each session's last row
        logits = self._columns(lm.lm_head.weight, last).float()
        return [logits[j] for j in range(len(items))]

    def _attention(self, attn, h: torch.Tensor, per: list, spans: list, rope: tuple, kind: str, product) -> torch.Tensor:
        """Gemma3Attention.forward for each session's rows of `h` [1, rows, hidden]: its q/k/v/o products
        through `product` across sessions; the q/k norms and the rotary embedding (`rope`: every row's
        cos/sin, stacked) on all rows at once, since they act row by row and element by element; per
        session, as there, the cache update and the attention itself."""
        from transformers.models.gemma3 import modeling_gemma3 as g3

        total = h.shape[1]
        flat = h.reshape(total, -1)
        shape = (1, total, -1, attn.head_dim)  # (*input_shape, -1, head_dim) over every session's rows
        q = attn.q_norm(product(attn.q_proj.weight, flat).view(shape).transpose(1, 2))
        k = attn.k_norm(product(attn.k_proj.weight, flat).view(shape).transpose(1, 2))
        v = product(attn.v_proj.weight, flat).view(shape).transpose(1, 2)
        q, k = g3.apply_rotary_pos_emb(q, k, *rope)
        interface = g3.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, g3.eager_attention_forward)
        outs = []
        for (cache, pos, masks, _), (a, e) in zip(per, spans, strict=True):
            kwargs = {"position_ids": pos}
            ks, vs = cache.update(k[:, :, a:e], v[:, :, a:e], attn.layer_idx, kwargs=kwargs)
            out, _ = interface(
                attn,
                q[:, :, a:e],
                ks,
                vs,
                masks[kind],
                dropout=0.0,
                scaling=attn.scaling,
                sliding_window=attn.sliding_window,
                **kwargs,
            )
            outs.append(out.reshape(e - a, -1))
        return product(attn.o_proj.weight, torch.cat(outs, dim=0).contiguous()).reshape(h.shape)
