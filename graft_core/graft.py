"""Graft: artifacts -> a live cache the model continues from.

Own position (the exact tier): a chain root -> ... -> leaf is restored at the positions it was
computed at, into a fresh `DynamicCache(config=...)`; sliding layers get back their
`cumulative_length`. Relocated (the approximate tier): keys are re-rotated by each layer's own RoPE
to another offset; the result is never called exact, whatever it measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .artifact import KVArtifact
from .errors import IncompatibleArtifact
from .forward import new_cache
from .layers import LayerState, import_cache, sliding_flags
from .model import LoadedModel


def check_compatible(lm: LoadedModel, art: KVArtifact) -> None:
    """Refuse an artifact made under another model, tokenizer, dtype or layer layout, naming the difference."""
    info = lm.info
    diffs = []
    if art.model_fingerprint != lm.fingerprint:
        diffs.append(
            f"model fingerprint {art.model_fingerprint[:12]}... != this model's {lm.fingerprint[:12]}... ({info.name}); "
            "other weights, configuration or numerical definition (`cli.py selftest --json` shows this machine's): "
            "recompute it here from its source text (`cli.py rebuild`)"
        )
    if art.tokenizer_fingerprint != info.tokenizer_sha256:
        diffs.append(f"tokenizer {art.tokenizer_fingerprint[:12]}... != {info.tokenizer_sha256[:12]}...")
    if art.dtype != lm.config.dtype:
        diffs.append(f"dtype {art.dtype} != {lm.config.dtype}")
    if tuple(art.layer_types) != tuple(info.layer_types):
        diffs.append(f"{len(art.layer_types)} layers of types {sorted(set(art.layer_types))} != this model's {info.num_layers}")
    else:
        for i, k in enumerate(art.keys):
            if k.shape[1] != info.num_kv_heads or k.shape[3] != info.head_dim:
                diffs.append(f"layer {i} shape {tuple(k.shape)} != [1, {info.num_kv_heads}, n, {info.head_dim}]")
                break
    if diffs:
        raise IncompatibleArtifact(f"artifact {art.key[:12]} is incompatible with the loaded model: " + "; ".join(diffs))


def check_chain(chain: list[KVArtifact]) -> None:
    assert chain, "a chain holds at least one artifact"
    if chain[0].parent or chain[0].start != 0:
        raise IncompatibleArtifact(
            f"artifact {chain[0].key[:12]} is not a chain root (parent {chain[0].parent[:12] or 'none'}, start {chain[0].start})"
        )
    for prev, nxt in zip(chain, chain[1:]):
        if nxt.parent != prev.key or nxt.start != prev.end:
            raise IncompatibleArtifact(
                f"artifact {nxt.key[:12]} does not continue {prev.key[:12]} (parent {nxt.parent[:12]}, start {nxt.start} != {prev.end})"
            )


def _chain_states(chain: list[KVArtifact], sliding: list[bool]) -> list[LayerState]:
    """Per layer: a sliding layer takes the leaf's rows and count; a full layer the chain's rows joined."""
    leaf = chain[-1]
    states = []
    for i, slides in enumerate(sliding):
        if slides or len(chain) == 1:
            k, v = leaf.keys[i], leaf.values[i]
        else:
            k = torch.cat([a.keys[i] for a in chain], dim=2)
            v = torch.cat([a.values[i] for a in chain], dim=2)
        states.append(LayerState(keys=k, values=v, seen=leaf.seen[i]))
    return states


def restore(lm: LoadedModel, chain: list[KVArtifact]):
    """Own-position restore of a chain (root first). The query continues at `chain[-1].end`."""
    for art in chain:
        check_compatible(lm, art)
    check_chain(chain)
    cache = new_cache(lm.model)
    assert len(cache.layers) == len(chain[0].layer_types), "cache layout differs from the artifact's layer list"
    import_cache(cache, _chain_states(chain, sliding_flags(cache)))
    cache.grafted = tuple(chain)  # what its rows come from, alive as long as the cache (services.library shares it)
    return cache


# ---- relocated tier -------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _cos_sin(lm: LoadedModel, layer_type: str, delta: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of a rotation by `delta` positions, from the model's own rotary module for this layer type."""
    rotary = lm.model.get_decoder().rotary_emb
    pos = torch.tensor([[delta]], dtype=torch.long, device=like.device)
    try:
        cos, sin = rotary(like, pos, layer_type)
    except TypeError:
        cos, sin = rotary(like, pos)
    return cos[:, None, :, :], sin[:, None, :, :]  # [1, 1, 1, d]


def relocate(lm: LoadedModel, art: KVArtifact, new_start: int) -> KVArtifact:
    """Re-rotate the keys of `art` from positions [start, ...) to [new_start, ...). Approximate."""
    check_compatible(lm, art)
    delta = new_start - art.start
    keys = []
    for i, k in enumerate(art.keys):
        cos, sin = _cos_sin(lm, art.layer_types[i], delta, k)
        keys.append((k * cos + _rotate_half(k) * sin).to(k.dtype).contiguous())
    return replace(art, keys=tuple(keys), start=new_start, metadata={**art.metadata, "relocated_from": str(art.start)})


@dataclass(frozen=True)
class RelocatedGraft:
    cache: object
    next_position: int
    tokens: int


def restore_relocated(lm: LoadedModel, parts: list[KVArtifact], offset: int = 0) -> RelocatedGraft:
    """Place root artifacts one after another from `offset`, each re-rotated to its new place (approximate).

    With one part this is the claim-2 experiment (own tokens, other positions). With several, each
    part's keys were computed without the parts before it, so besides the floating-point error of
    re-rotation the later parts miss cross-attention to earlier ones. The caller labels the result.
    """
    cache = new_cache(lm.model)
    pos = offset
    moved = []
    for art in parts:
        check_compatible(lm, art)
        if art.parent or art.start != 0:
            raise IncompatibleArtifact(f"artifact {art.key[:12]} is not a chain root; relocate whole chains by their root")
        moved.append(relocate(lm, art, pos) if pos != art.start else art)
        pos += art.length
    total = pos - offset
    states = [
        LayerState(
            keys=torch.cat([a.keys[i] for a in moved], dim=2),
            values=torch.cat([a.values[i] for a in moved], dim=2),
            seen=total,
        )
        for i in range(len(cache.layers))
    ]
    import_cache(cache, states)  # sliding layers keep their last window-1 rows
    return RelocatedGraft(cache=cache, next_position=pos, tokens=total)
