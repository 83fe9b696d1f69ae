"""Capture: token ids (+ an optional parent chain) -> KVArtifact, with one prefill.

The prefill keeps one logits row (`logits_to_keep=1`); the cache after it is copied out exactly:
full-attention layers keep the artifact's own rows, sliding layers keep what they hold (at most
window-1 rows) and how many tokens they have seen. A probe suffix is then run on the live cache and
the SHA-256 of its last logits row is stored, so any later restore can be checked against it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .artifact import KVArtifact
from .errors import InputTooLong, InvalidInput
from .forward import forward_chunk, new_cache
from .graft import restore
from .layers import export_cache
from .model import LoadedModel
from .probe import probe_sha256


@dataclass(frozen=True)
class CaptureStats:
    prefill_s: float
    probe_s: float


def capture(
    lm: LoadedModel,
    token_ids: list[int],
    parents: list[KVArtifact] | None = None,
    text_sha256: str = "",
) -> tuple[KVArtifact, CaptureStats]:
    """Prefill `token_ids` after the parent chain (root first) and return the artifact."""
    if not token_ids:
        raise InvalidInput("nothing to deposit: the text tokenises to zero tokens")
    parents = parents or []
    start = parents[-1].end if parents else 0
    limit = lm.info.max_positions
    if start + len(token_ids) > limit:
        raise InputTooLong(
            f"deposit of {len(token_ids)} tokens at position {start} exceeds the model's {limit}-token context; "
            "split the text or deposit it without a parent"
        )
    cache = restore(lm, parents) if parents else new_cache(lm.model)
    t0 = time.perf_counter()
    forward_chunk(lm.model, cache, list(token_ids), start)
    prefill_s = time.perf_counter() - t0
    states = export_cache(cache, start, start + len(token_ids))
    for i, st in enumerate(states):
        assert st.keys.shape[2] <= st.seen, f"layer {i} holds more rows than tokens it has seen"
    keys, values, seen = [st.keys for st in states], [st.values for st in states], [st.seen for st in states]
    t1 = time.perf_counter()
    probe = probe_sha256(lm, cache, start + len(token_ids))
    art = KVArtifact(
        keys=tuple(keys),
        values=tuple(values),
        token_ids=torch.tensor(token_ids, dtype=torch.int64),
        model_fingerprint=lm.fingerprint,
        tokenizer_fingerprint=lm.info.tokenizer_sha256,
        dtype=str(keys[0].dtype).removeprefix("torch."),
        start=start,
        layer_types=tuple(lm.info.layer_types),
        seen=tuple(seen),
        parent=parents[-1].key if parents else "",
        text_sha256=text_sha256,
        probe_sha256=probe,
    )
    return art, CaptureStats(prefill_s=prefill_s, probe_s=time.perf_counter() - t1)
