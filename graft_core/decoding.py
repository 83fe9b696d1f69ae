"""Decoding after a prompt chunk: the one decode loop (greedy or sampled, by its `choose`) and the prompt
followed by its steps (greedy unless a `choose` is given), alone (the lean pass where the model has one, graft_core.batch.lean, else
`forward_chunk`) or together with other answers' steps (a graft_core.stepgroup.StepGroup, the same rows).

Purely token ids and caches, as graft_core.forward: nothing here tokenises or knows about artifacts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .forward import forward_chunk


@dataclass
class Decoded:
    """Greedy continuation of a prompt chunk, with the logits rows when they were kept."""

    prompt_rows: torch.Tensor | None  # [n_prompt, vocab] when collected, else None
    token_ids: list[int]  # generated tokens, including a stop token if one was hit
    step_rows: list[torch.Tensor]  # [vocab] logits row that chose each generated token (first from the prompt)
    prompt_s: float  # prompt forward, seconds
    first_token_s: float  # prompt forward + choosing the first token
    total_s: float
    stopped: str  # "stop" | "eos" | "length"


def _greedy(row: torch.Tensor) -> int:
    return int(torch.argmax(row).item())


def step_alone(model) -> Callable[[DynamicCache, int, int], torch.Tensor]:
    """One session's step: the lean pass where the model has one (graft_core.batch.lean), else `forward_chunk`."""
    from .batch import Session, lean

    b = lean(model)
    if b is None:
        return lambda cache, tok, pos: forward_chunk(model, cache, [tok], pos)[-1]
    return lambda cache, tok, pos: b.step([Session(cache, tok, pos)])[0]


def prefill_alone(model, cache: DynamicCache, ids: list[int], start: int) -> torch.Tensor:
    """The last logits row of `ids` at `start` on `cache` (mutated): the lean pass where the model has one,
    else `forward_chunk` (the same row). Shape [1, vocab]."""
    from .batch import lean

    b = lean(model)
    if b is None:
        return forward_chunk(model, cache, ids, start)
    return b.prefill([(cache, list(ids), start)])[0].unsqueeze(0)


@torch.inference_mode()
def decode(
    model,
    cache: DynamicCache,
    row: torch.Tensor,
    pos: int,
    max_new_tokens: int,
    choose: Callable[[torch.Tensor], int],
    is_stop: Callable[[list[int]], bool] | None = None,
    eos_ids: frozenset[int] = frozenset(),
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    step: Callable[[DynamicCache, int, int], torch.Tensor] | None = None,
) -> tuple[list[int], str]:
    """The one decode loop: from the logits `row` of the token before `pos`, choose a token, feed it at
    `pos`, repeat, until EOS, the stop rule or `max_new_tokens`. Returns (tokens, "eos" | "stop" | "length").
    `on_step(token, row)` sees each token with the row that chose it. Greedy and sampled decoding differ
    only in `choose`. `step(cache, token, pos)` computes a step's row (default: the lean pass alone;
    graft_core.stepgroup.StepGroup.step takes it together with other sessions' steps, same bytes)."""
    if step is None:
        step = step_alone(model)
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        tok = choose(row)
        generated.append(tok)
        if on_step is not None:
            on_step(tok, row)
        if tok in eos_ids:
            return generated, "eos"
        if is_stop is not None and is_stop(generated):
            return generated, "stop"
        if len(generated) == max_new_tokens:
            break
        row = step(cache, tok, pos)
        pos += 1
    return generated, "length"


@torch.inference_mode()
def prompt_and_decode(
    model,
    cache: DynamicCache,
    prompt_ids: list[int],
    start: int,
    max_new_tokens: int,
    is_stop: Callable[[list[int]], bool] | None = None,
    eos_ids: frozenset[int] = frozenset(),
    keep_prompt_rows: bool = False,
    on_token: Callable[[int], None] | None = None,
    steps=None,
    choose: Callable[[torch.Tensor], int] | None = None,
) -> Decoded:
    """Prefill `prompt_ids` at `start` as one chunk (the chunk schedule is part of the bytes), then
    decode one token per step, greedily unless `choose` (a seeded draw, graft_core.sampling.chooser) picks
    each token from its row: alone, or with `steps` (a graft_core.stepgroup.StepGroup) the prompt
    and the steps together with other answers' prompts and steps, which gives the same rows."""
    assert prompt_ids, "the prompt chunk must hold at least one token"
    t0 = time.perf_counter()
    if keep_prompt_rows:
        logits = forward_chunk(model, cache, prompt_ids, start, all_logits=True)
    elif steps is None:
        logits = prefill_alone(model, cache, prompt_ids, start)
    else:  # with other answers' prompts where it can (same row)
        logits = steps.prefill(cache, prompt_ids, start).unsqueeze(0)
    prompt_s = time.perf_counter() - t0
    rows: list[torch.Tensor] = []
    first: list[float] = []

    def on_step(tok: int, row: torch.Tensor) -> None:
        rows.append(row)
        if not first:
            first.append(time.perf_counter() - t0)
        if on_token is not None:
            on_token(tok)

    with nullcontext() if steps is None else steps.session() as step:
        generated, stopped = decode(
            model, cache, logits[-1], start + len(prompt_ids), max_new_tokens, choose or _greedy, is_stop, eos_ids, on_step, step
        )
    first_token_s = first[0] if first else 0.0
    return Decoded(
        prompt_rows=logits if keep_prompt_rows else None,
        token_ids=generated,
        step_rows=rows,
        prompt_s=prompt_s,
        first_token_s=first_token_s or prompt_s,
        total_s=time.perf_counter() - t0,
        stopped=stopped,
    )
