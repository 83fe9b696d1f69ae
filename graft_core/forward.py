"""The engine's only call into the model: one chunk forward on a cache (and the cache it starts from).

Purely token ids and caches: nothing here tokenises, reads files or knows about artifacts. Every
call passes `position_ids` explicitly (transformers 5.x derives masks from the cache, positions
from these ids), and `cache=` (the 5.x name of `past_key_values`). Decoding after it is
graft_core.decoding's.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .layers import growing_cache


def new_cache(model) -> DynamicCache:
    """A fresh cache laid out for this model (sliding layers only when built with the config), whose layers
    append in place (graft_core.layers.growing_cache)."""
    return growing_cache(model.config)


def device_of(model) -> torch.device:
    """Where the model computes: its first parameter that has bytes (the packaged model's layer weights are
    GGUF blocks beside parameters on the meta device, graft_core.packaged)."""
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


@torch.inference_mode()
def forward_chunk(model, cache: DynamicCache, ids: list[int], start: int, all_logits: bool = False) -> torch.Tensor:
    """Run `ids` at positions [start, start+len) on `cache` (mutated). Returns logits [n or 1, vocab]."""
    device = device_of(model)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    position_ids = torch.arange(start, start + len(ids), dtype=torch.long, device=device).unsqueeze(0)
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=0 if all_logits else 1,
    )
    return out.logits[0].float()
