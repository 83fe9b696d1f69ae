"""Log-probabilities of tokens, read off the logits rows the engine computed anyway: each generated token's from the
row that chose it, each prompt token's from the row of the position before it (a prompt forwarded with every row
kept). No second forward: the numbers are functions of the same bytes the answer's proof hashes, so the same request
gives the same values, to the bit, on the same machine.

A row's log-softmax is computed in float64 (`row - logsumexp(row)`); the top alternatives are the `top` largest,
ties broken by the lower token id. Token ids in, token ids out: the text of a token is the caller's (it holds the
tokenizer). The values are torch-free dataclasses; torch is imported only to compute them.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TOP = 20  # alternatives per position, as OpenAI's top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token there, its log-probability given everything before it (None for a prompt's first
    token, which nothing in the prompt precedes), and the `top` most likely tokens at that position with theirs."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def of_rows(rows, ids: list[int], top: int) -> list[TokenLogprob]:
    """`ids[i]`'s log-probability under `rows[i]` (a [n, vocab] tensor or a list of [vocab] rows), with the `top`
    most likely tokens of each row."""
    import torch

    if not 0 <= top <= MAX_TOP:
        raise ValueError(f"top must be between 0 and {MAX_TOP}, got {top}")
    if len(ids) == 0:
        return []
    stacked = rows if isinstance(rows, torch.Tensor) else torch.stack([r.reshape(-1) for r in rows])
    assert stacked.shape[0] == len(ids), f"{stacked.shape[0]} rows for {len(ids)} tokens"
    out = []
    for row, tok in zip(stacked, ids, strict=True):
        lp = row.to(torch.float64)
        lp = lp - torch.logsumexp(lp, dim=0)
        best = []
        if top:  # the largest first, ties by the lower id (topk's candidates, ordered here)
            values, idx = torch.topk(lp, min(top + 8, lp.numel()))
            best = sorted(((int(i), float(v)) for v, i in zip(values, idx, strict=True)), key=lambda p: (-p[1], p[0]))[:top]
        out.append(TokenLogprob(int(tok), float(lp[int(tok)]), tuple(best)))
    return out


def of_prompt(rows, ids: list[int], top: int) -> list[TokenLogprob]:
    """A prompt's positions: the first token has no logprob (None), token i > 0 is read under row i - 1 (`rows`
    holds one row per prompt token, the last one predicting what follows the prompt)."""
    if not ids:
        return []
    first = TokenLogprob(int(ids[0]), None, ())
    return [first, *of_rows(rows[: len(ids) - 1], list(ids[1:]), top)]
