"""The tokenizer's part of a model's fingerprint: graft_core.model composes the fingerprint with it, and
graft_core.packaged checks a tokenizer read back from its cache file against the one it built. Pure hashing
of what a tokenizer maps; it loads nothing.
"""

from __future__ import annotations

import hashlib
import json


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of what a tokenizer maps: its vocabulary (by id), its special tokens and the ids of a fixed probe
    text (normalisation, pre-tokenisation and added tokens show there)."""
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    probe = "kvgraft tokenizer probe: 3.14 Zürich 東京 <b>\n\tend"
    h.update(json.dumps(tokenizer(probe, add_special_tokens=True)["input_ids"]).encode())
    return h.hexdigest()
