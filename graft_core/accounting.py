"""Token and FLOP accounting for one answer, grafted vs the no-graft baseline.

FLOPs are the usual estimate (forward pass: 2 x non-embedding parameters per token, plus the
attention term 2 x 2 x heads x head_dim per attended position per layer, plus the vocabulary
projection for each row whose logits are computed). They are labelled estimates wherever shown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .model import ModelInfo


def chunk_flops(info: ModelInfo, start: int, n: int, logits_rows: int = 1) -> float:
    """Estimated forward FLOPs for `n` tokens at positions [start, start+n) keeping `logits_rows` rows."""
    if n <= 0:
        return 0.0
    dense = 2.0 * info.non_embedding_params * n
    per_pos = 4.0 * info.num_attention_heads * info.head_dim
    attn = 0.0
    for layer in range(info.num_layers):
        if info.layer_types[layer] == "sliding_attention" and info.sliding_window:
            w = info.sliding_window
            # positions below the window grow linearly, the rest are capped at w
            lo, hi = start, start + n
            grow_hi = min(hi, w)
            s = 0
            if lo < grow_hi:
                s += (grow_hi * (grow_hi + 1) - lo * (lo + 1)) // 2
            s += max(0, hi - max(lo, w)) * w
            attn += per_pos * s
        else:
            attn += per_pos * ((start + n) * (start + n + 1) - start * (start + 1)) // 2
    vocab = 2.0 * info.hidden_size * info.vocab_size * logits_rows
    return dense + attn + vocab


@dataclass(frozen=True)
class TokenSavings:
    grafted_tokens: int  # restored from artifacts, not computed
    computed_tokens: int  # prompt tokens actually computed
    decode_tokens: int
    baseline_prefill_tokens: int  # a no-graft run computes prefix + prompt
    baseline_decode_tokens: int | None  # measured only when the baseline ran
    flops_estimate: float
    baseline_flops_estimate: float

    @property
    def computed_total(self) -> int:
        return self.computed_tokens + self.decode_tokens

    @property
    def baseline_total(self) -> int:
        return self.baseline_prefill_tokens + (
            self.baseline_decode_tokens if self.baseline_decode_tokens is not None else self.decode_tokens
        )

    @property
    def token_ratio(self) -> float:
        return self.baseline_total / max(1, self.computed_total)

    @property
    def flops_ratio(self) -> float:
        return self.baseline_flops_estimate / max(1.0, self.flops_estimate)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(token_ratio=self.token_ratio, flops_ratio=self.flops_ratio, flops_are_estimates=True)
        return d


def savings(info: ModelInfo, grafted: int, prompt: int, decode: int, baseline_decode: int | None = None) -> TokenSavings:
    ours = chunk_flops(info, grafted, prompt) + sum(chunk_flops(info, grafted + prompt + i, 1) for i in range(max(0, decode - 1)))
    bdec = baseline_decode if baseline_decode is not None else decode
    base = chunk_flops(info, 0, grafted + prompt) + sum(
        chunk_flops(info, grafted + prompt + i, 1) for i in range(max(0, bdec - 1))
    )
    return TokenSavings(
        grafted_tokens=grafted,
        computed_tokens=prompt,
        decode_tokens=decode,
        baseline_prefill_tokens=grafted + prompt,
        baseline_decode_tokens=baseline_decode,
        flops_estimate=ours,
        baseline_flops_estimate=base,
    )
