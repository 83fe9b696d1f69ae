"""Seeded sampled decoding next to the greedy decoder: the same chunk forwards, a chosen token drawn
from softmax(logits / temperature) (within the top k, or the nucleus of mass top p) with a `torch.Generator`
seeded by the caller.

Deterministic given (model, configuration, prompt, temperature, top_k, top_p, seed): the generator is the
only source of randomness and it lives on the CPU, so the same seed draws the same tokens. `Sampling` is how
an answer asks for it (`chooser` turns it into the decode loop's `choose`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .decoding import decode, prefill_alone


@dataclass(frozen=True)
class Sampled:
    """One sampled continuation: its tokens and what was computed for it."""

    token_ids: tuple[int, ...]  # generated tokens, including a stop token if one was hit
    prompt_tokens: int  # tokens of the prompt chunk computed
    temperature: float
    top_k: int
    seed: int
    total_s: float
    stopped: str  # "stop" | "eos" | "length"

    @property
    def tokens_computed(self) -> int:
        """Every token this attempt computed: the prompt's and each decoded token's."""
        return self.prompt_tokens + len(self.token_ids)


@dataclass(frozen=True)
class Sampling:
    """How an answer draws its tokens: softmax(logits / temperature) over the smallest set of most likely
    tokens whose probability reaches `top_p` (1.0: all of them), from a generator seeded with `seed`."""

    temperature: float
    seed: int
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {self.temperature}; use greedy decoding for 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}


def chooser(sampling: Sampling) -> Callable[[torch.Tensor], int]:
    """The decode loop's `choose` for `sampling`: one generator, seeded once, drawing every token in turn."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(sampling.seed))
    return lambda row: _draw(row.cpu(), sampling.temperature, 0, gen, sampling.top_p)


def _draw(row: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator, top_p: float = 1.0) -> int:
    logits = row.float().reshape(-1) / temperature
    if top_p < 1.0:
        probs, order = torch.sort(torch.softmax(logits, dim=-1), descending=True)
        mass = torch.cumsum(probs, dim=-1)
        keep = int(torch.searchsorted(mass, torch.tensor([top_p], dtype=mass.dtype)).item()) + 1  # reaches top_p
        kept = probs[: min(keep, probs.shape[-1])]
        return int(order[torch.multinomial(kept / kept.sum(), 1, generator=gen)].item())
    if 0 < top_k < logits.shape[-1]:
        values, indices = torch.topk(logits, top_k)
        probs = torch.softmax(values, dim=-1)
        return int(indices[torch.multinomial(probs, 1, generator=gen)].item())
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


@torch.inference_mode()
def prompt_and_sample(
    model,
    cache: DynamicCache,
    prompt_ids: list[int],
    start: int,
    max_new_tokens: int,
    *,
    temperature: float,
    seed: int,
    top_k: int = 0,
    is_stop: Callable[[list[int]], bool] | None = None,
    eos_ids: frozenset[int] = frozenset(),
    steps=None,
) -> Sampled:
    """Prefill `prompt_ids` at `start`, then draw up to `max_new_tokens` tokens: alone, or with `steps` (a
    graft_core.stepgroup.StepGroup) the prompt and each step's row computed together with other sessions' (the
    same rows, so the same draws)."""
    if not prompt_ids:
        raise ValueError("the prompt chunk must hold at least one token")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}; use greedy decoding for 0")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    t0 = time.perf_counter()
    row = prefill_alone(model, cache, prompt_ids, start)[-1] if steps is None else steps.prefill(cache, prompt_ids, start)
    with nullcontext() if steps is None else steps.session() as step:
        generated, stopped = decode(
            model,
            cache,
            row,
            start + len(prompt_ids),
            max_new_tokens,
            lambda r: _draw(r.cpu(), temperature, top_k, gen),
            is_stop,
            eos_ids,
            step=step,
        )
    return Sampled(
        token_ids=tuple(generated),
        prompt_tokens=len(prompt_ids),
        temperature=float(temperature),
        top_k=int(top_k),
        seed=int(seed),
        total_s=time.perf_counter() - t0,
        stopped=stopped,
    )


@dataclass(frozen=True)
class Attempt:
    """One answer attempt without a graft, as `ask` would prompt it: the cut answer and its cost."""

    text: str  # the answer, cut at the template's end of answer
    completion: str
    mode: str  # "greedy" | "sampled"
    token_ids: tuple[int, ...]
    prompt_tokens: int
    temperature: float  # 0.0 for greedy
    seed: int | None  # None for greedy
    total_s: float

    @property
    def tokens_computed(self) -> int:
        return self.prompt_tokens + len(self.token_ids)


def _eos(tokenizer) -> frozenset[int]:
    eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return frozenset(i for i in ids if i is not None)


def attempt(
    lm,
    question: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    top_k: int = 0,
    steps=None,
    form: str = "answer",
) -> Attempt:
    """Answer `question` with nothing grafted: greedy when `temperature` is 0, else sampled with `seed`; with
    `steps` (a graft_core.stepgroup.StepGroup) its prompt and steps go with other sessions' (same tokens). `form`
    is the query form (templates.FORMS)."""
    from . import templates
    from .decoding import prompt_and_decode
    from .forward import new_cache

    prompt_ids = templates.encode_prompt(lm.tokenizer, question, grafted=False, form=form)
    tok = lm.tokenizer
    template = templates.of(tok)

    def stop(ids: list[int]) -> bool:
        return templates.is_answer_complete(tok.decode(ids, skip_special_tokens=True), form, template)

    cache = new_cache(lm.model)
    if temperature <= 0:
        d = prompt_and_decode(lm.model, cache, prompt_ids, 0, max_new_tokens, is_stop=stop, eos_ids=_eos(tok), steps=steps)
        ids, total_s, mode, seed = tuple(d.token_ids), d.total_s, "greedy", None
    else:
        if seed is None:
            raise ValueError("a sampled attempt needs a seed")
        s = prompt_and_sample(
            lm.model,
            cache,
            prompt_ids,
            0,
            max_new_tokens,
            temperature=temperature,
            seed=seed,
            top_k=top_k,
            is_stop=stop,
            eos_ids=_eos(tok),
            steps=steps,
        )
        ids, total_s, mode = s.token_ids, s.total_s, "sampled"
    completion = tok.decode(list(ids), skip_special_tokens=True)
    return Attempt(
        text=templates.cut_answer(completion, form, template),
        completion=completion,
        mode=mode,
        token_ids=ids,
        prompt_tokens=len(prompt_ids),
        temperature=float(temperature if temperature > 0 else 0.0),
        seed=seed,
        total_s=total_s,
    )


def prompt_tokens(lm, question: str, form: str = "answer") -> int:
    """How many tokens the no-graft prompt of `question` computes (for budgeting before an attempt)."""
    from . import templates

    return len(templates.encode_prompt(lm.tokenizer, question, grafted=False, form=form))
