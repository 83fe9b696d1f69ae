"""Many seeded sampled attempts at one question, decoded together through the batched decode passes
(graft_core/batch.Batcher), within a token budget: the recurring case's no-graft baseline at the paper's scale.

Each attempt is `graft_core.sampling.attempt(lm, question, n, temperature=t, seed=s)` token for token: its own
generator seeded with its seed, drawing from the prompt's last row and then from its own decode steps. What
differs is the cost: the prompt is computed once per round and its cache copied into the round's attempts,
and their decode steps run as one pass each (the Batcher's rows are each session's own bytes). Every token
computed is counted where it is computed: a round's prompt once, each attempt's decode tokens. The budget
caps that sum; a round is not started unless the prompt and each of its attempts' longest decode fit.

Knows the template (the answer line ends an attempt) through graft_core; nothing about the store or judging:
the caller passes `passes(text) -> bool` and sampling stops at the first round with a passing attempt.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Attempt:
    """One sampled attempt: its seed, generated token ids, the answer cut at the template's end of answer."""

    seed: int
    token_ids: tuple[int, ...]
    text: str
    stopped: str  # "stop" | "eos" | "length"
    passed: bool

    @property
    def decode_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Round:
    """One prompt computation and the attempts decoded from it together."""

    prompt_tokens: int
    attempts: tuple[Attempt, ...]
    seconds: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + sum(a.decode_tokens for a in self.attempts)


@dataclass(frozen=True)
class Sampling:
    """Every round run for one question within `budget` tokens."""

    budget: int
    rounds: tuple[Round, ...] = field(default_factory=tuple)

    @property
    def tokens(self) -> int:
        """Every token computed: each round's prompt and every attempt's decode tokens."""
        return sum(r.tokens for r in self.rounds)

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        return tuple(a for r in self.rounds for a in r.attempts)

    @property
    def solved(self) -> bool:
        return any(a.passed for a in self.attempts)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)


def sample_many(
    lm,
    question: str,
    budget: int,
    passes: Callable[[str], bool],
    *,
    together: int = 8,
    temperature: float = 0.8,
    max_new_tokens: int = 16,
    seed: int = 0,
    batcher=None,
    form: str = "answer",
) -> Sampling:
    """Seeded attempts (seeds seed, seed+1, ...) `together` at a time until one passes or the next round would
    pass `budget` tokens. `batcher` (a graft_core.batch.Batcher) may be shared across questions; `form` is the
    query form (graft_core.templates.FORMS)."""
    from graft_core import generate
    from graft_core.batch import Batcher

    if together < 1 or max_new_tokens < 1:
        raise ValueError(f"together and max_new_tokens must be at least 1, got {together} and {max_new_tokens}")
    batcher = batcher or Batcher(lm.model)
    prompt_ids = generate.encode_prompt(lm, question, grafted=False, form=form)
    rounds: list[Round] = []
    spent, next_seed = 0, seed
    while True:
        n = min(together, (budget - spent - len(prompt_ids)) // max_new_tokens)
        if n < 1:
            break
        r = _round(lm, batcher, prompt_ids, list(range(next_seed, next_seed + n)), temperature, max_new_tokens, passes, form)
        rounds.append(r)
        spent += r.tokens
        next_seed += n
        if any(a.passed for a in r.attempts):
            break
    return Sampling(budget=budget, rounds=tuple(rounds))


def _round(
    lm, batcher, prompt_ids: list[int], seeds: list[int], temperature: float, max_new: int, passes, form: str = "answer"
) -> Round:
    import torch

    from graft_core import sampling, templates
    from graft_core.batch import Session
    from graft_core.forward import forward_chunk, new_cache

    t0 = time.perf_counter()
    tok = lm.tokenizer
    eos = sampling._eos(tok)
    with torch.inference_mode():
        cache = new_cache(lm.model)
        row = forward_chunk(lm.model, cache, prompt_ids, 0)[-1]
        caches = [cache] + [copy.deepcopy(cache) for _ in seeds[1:]]
        gens = [torch.Generator(device="cpu") for _ in seeds]
        for g, s in zip(gens, seeds, strict=True):
            g.manual_seed(int(s))
        rows = [row] * len(seeds)
        out: list[list[int]] = [[] for _ in seeds]
        stopped = [""] * len(seeds)
        pos = len(prompt_ids)
        while True:
            live = []
            for i, r in enumerate(rows):
                if stopped[i]:
                    continue
                t = sampling._draw(r.cpu(), temperature, 0, gens[i])
                out[i].append(t)
                if t in eos:
                    stopped[i] = "eos"
                elif templates.is_answer_complete(tok.decode(out[i], skip_special_tokens=True), form, templates.of(tok)):
                    stopped[i] = "stop"
                elif len(out[i]) == max_new:
                    stopped[i] = "length"
                else:
                    live.append(i)
            if not live:
                break
            stepped = batcher.step([Session(caches[i], out[i][-1], pos) for i in live])
            for i, r in zip(live, stepped, strict=True):
                rows[i] = r
            pos += 1
    attempts = []
    for s, ids, why in zip(seeds, out, stopped, strict=True):
        text = templates.cut_answer(tok.decode(ids, skip_special_tokens=True), form, templates.of(tok))
        attempts.append(Attempt(seed=s, token_ids=tuple(ids), text=text, stopped=why, passed=bool(text) and passes(text)))
    return Round(prompt_tokens=len(prompt_ids), attempts=tuple(attempts), seconds=time.perf_counter() - t0)
