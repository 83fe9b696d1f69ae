"""The probe: a fixed short suffix run on a live or restored cache, and the SHA-256 of its last logits row.

Capture records the hash at deposit; proof re-runs the probe on a restored state and compares. This
module only runs and hashes: it neither restores a cache nor decides what a mismatch means.
"""

from __future__ import annotations

import hashlib

import torch

from .forward import forward_chunk
from .model import LoadedModel

# A fixed suffix, the same for every model: the opening of every plain-form query prompt (templates.query_prompt;
# deposit texts end with a newline). In a chat template's form (templates.of) the query opens with the user turn
# instead; the probe is still only a fixed suffix whose logits row the deposit records (graft_core/proof.py),
# kept the same so that the models' golden artifacts do not depend on how they are asked.
PROBE_TEXT = "Question:"


def probe_ids(lm: LoadedModel) -> list[int]:
    ids = lm.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    assert ids, "the probe text must tokenise to at least one token"
    return list(ids)


def logits_sha256(rows: torch.Tensor | list[torch.Tensor]) -> str:
    """SHA-256 over the float32 bytes of logits rows, in order."""
    h = hashlib.sha256()
    for r in rows if isinstance(rows, list) else [rows]:
        h.update(r.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def probe_sha256(lm: LoadedModel, cache, pos: int) -> str:
    """Run the probe tokens on `cache` at `pos` (the cache grows by them) and hash the last logits row."""
    return logits_sha256(forward_chunk(lm.model, cache, probe_ids(lm), pos)[-1])
