"""The exactness checks behind claims 1 and 2, comparing a graft with a fresh computation.

"Fresh" means the same tokens recomputed from scratch in the same chunk schedule: each artifact of
the chain as one chunk (as deposited), then the query as one chunk, then greedy decode steps. The
grafted run restores the chain and runs the identical query chunk and decode steps. Identity is
SHA-256 equality of the logits bytes; KL and argmax agreement are reported beside it. The
monolithic schedule (one forward over prefix+query) is a different computation: reported, labelled,
never called exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .artifact import KVArtifact
from .decoding import prompt_and_decode
from .forward import forward_chunk, new_cache
from .graft import restore, restore_relocated
from .model import LoadedModel
from .probe import logits_sha256


@dataclass(frozen=True)
class Divergence:
    max_abs_diff: float
    kl: float  # max over rows of KL(reference || candidate), nats
    argmax_agreement: float  # fraction of rows whose argmax agrees
    rows: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ExactnessCheck:
    exact: bool  # SHA-256 of fresh and grafted logits rows are equal (the bytes are equal), whatever the tier
    tier: str  # "exact" (own position) | "relocated"
    fresh_sha256: str
    grafted_sha256: str
    kl: float
    argmax_agreement: float
    max_abs_diff: float
    rows: int
    decode_steps: int
    tokens_equal: bool  # greedy continuations identical
    monolithic_max_abs_diff: float | None = None  # different schedule: labelled, never "exact"
    monolithic_kl: float | None = None
    monolithic_argmax_agreement: float | None = None
    offset: int | None = None  # relocated tier: where the artifact was placed

    def as_dict(self) -> dict:
        return asdict(self)


def divergence(ref: torch.Tensor, cand: torch.Tensor) -> Divergence:
    """Compare two stacks of logits rows [n, vocab] (float32)."""
    assert ref.shape == cand.shape, f"logits shapes differ: {tuple(ref.shape)} vs {tuple(cand.shape)}"
    ref64, cand64 = ref.double(), cand.double()
    lp, lq = torch.log_softmax(ref64, -1), torch.log_softmax(cand64, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)
    return Divergence(
        max_abs_diff=float((ref64 - cand64).abs().max().item()) if ref.numel() else 0.0,
        kl=float(kl.max().item()) if kl.numel() else 0.0,
        argmax_agreement=float((ref.argmax(-1) == cand.argmax(-1)).double().mean().item()) if ref.numel() else 1.0,
        rows=int(ref.shape[0]),
    )


def _rows(decoded) -> torch.Tensor:
    rows = [decoded.prompt_rows] + [r.unsqueeze(0) for r in decoded.step_rows[1:]]
    return torch.cat(rows, dim=0)


def _run(lm: LoadedModel, cache, query_ids: list[int], start: int, steps: int):
    return prompt_and_decode(lm.model, cache, query_ids, start, max_new_tokens=steps + 1, keep_prompt_rows=True)


def fresh_cache(lm: LoadedModel, chain: list[KVArtifact], offset: int = 0):
    """Recompute the chain from its tokens, one chunk per artifact (the deposit schedule)."""
    cache = new_cache(lm.model)
    pos = offset
    for art in chain:
        forward_chunk(lm.model, cache, art.token_ids.tolist(), pos)
        pos += art.length
    return cache, pos


def check(
    lm: LoadedModel,
    chain: list[KVArtifact],
    query_ids: list[int],
    decode_steps: int = 4,
    monolithic: bool = True,
    between: Callable[[], object] | None = None,
) -> ExactnessCheck:
    """Own-position graft of `chain` vs fresh recomputation, over the query rows and `decode_steps` steps.
    `between` is called between the fresh and the grafted run (a server lets waiting answers go there)."""
    cache, pos = fresh_cache(lm, chain)
    fresh = _run(lm, cache, query_ids, pos, decode_steps)
    if between is not None:
        between()
    grafted = _run(lm, restore(lm, chain), query_ids, chain[-1].end, decode_steps)
    return _compare(lm, chain, query_ids, fresh, grafted, "exact", monolithic, None)


def check_relocated(
    lm: LoadedModel,
    art: KVArtifact,
    query_ids: list[int],
    offset: int,
    decode_steps: int = 4,
    between: Callable[[], object] | None = None,
) -> ExactnessCheck:
    """Graft a root artifact at `offset` (keys re-rotated) vs a fresh computation at that offset (`between`:
    as in `check`)."""
    cache, pos = fresh_cache(lm, [art], offset=offset)
    fresh = _run(lm, cache, query_ids, pos, decode_steps)
    if between is not None:
        between()
    g = restore_relocated(lm, [art], offset=offset)
    grafted = _run(lm, g.cache, query_ids, g.next_position, decode_steps)
    return _compare(lm, [art], query_ids, fresh, grafted, "relocated", False, offset)


def check_composed(lm: LoadedModel, parts: list[KVArtifact], query_ids: list[int], decode_steps: int = 4) -> ExactnessCheck:
    """Relocated composition of independent roots vs the exact chain it stands in for.

    The reference is a fresh computation of the parts' tokens one chunk each, in order (what an
    exact chain of the same texts computes). The composition differs by re-rotation error and by
    the cross-attention the later parts never saw; this measures both, labelled relocated.
    """
    cache, pos = fresh_cache(lm, parts)
    fresh = _run(lm, cache, query_ids, pos, decode_steps)
    g = restore_relocated(lm, parts)
    grafted = _run(lm, g.cache, query_ids, g.next_position, decode_steps)
    return _compare(lm, parts, query_ids, fresh, grafted, "relocated", False, 0)


def _compare(lm, chain, query_ids, fresh, grafted, tier, monolithic, offset) -> ExactnessCheck:
    steps = min(len(fresh.token_ids), len(grafted.token_ids)) - 1
    f_rows, g_rows = _rows(fresh)[: len(query_ids) + steps], _rows(grafted)[: len(query_ids) + steps]
    f_sha, g_sha = logits_sha256(f_rows), logits_sha256(g_rows)
    d = divergence(f_rows, g_rows)
    mono = {}
    if monolithic:
        ids = [t for a in chain for t in a.token_ids.tolist()] + list(query_ids)
        whole = forward_chunk(lm.model, new_cache(lm.model), ids, 0, all_logits=True)[-len(query_ids) :]
        m = divergence(f_rows[: len(query_ids)], whole)
        mono = {
            "monolithic_max_abs_diff": m.max_abs_diff,
            "monolithic_kl": m.kl,
            "monolithic_argmax_agreement": m.argmax_agreement,
        }
    return ExactnessCheck(
        exact=(f_sha == g_sha and torch.equal(f_rows, g_rows)),  # from the bytes whatever the tier label
        tier=tier,
        fresh_sha256=f_sha,
        grafted_sha256=g_sha,
        kl=d.kl,
        argmax_agreement=d.argmax_agreement,
        max_abs_diff=d.max_abs_diff,
        rows=d.rows,
        decode_steps=steps,
        tokens_equal=fresh.token_ids == grafted.token_ids,
        offset=offset,
        **mono,
    )
