"""The KV artifact: a model's key/value state for a run of tokens, as a value.

An artifact made with a parent holds, for full-attention layers, only its own tokens' keys and
values (the parent chain holds the rest), and for sliding-window layers exactly what the layer held
after its tokens (at most window-1 rows) plus how many tokens that layer had seen. Its identity
(`key`) is a pure function of (model fingerprint, parent, token ids), known before any prefill.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

FORMAT = "kvgraft/1"


def artifact_key(model_fingerprint: str, parent: str, token_ids: list[int] | torch.Tensor) -> str:
    """sha256(model fingerprint | parent | token ids): names an artifact before it is computed."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1).contiguous()
    h = hashlib.sha256()
    h.update(model_fingerprint.encode())
    h.update(b"|")
    h.update(parent.encode())
    h.update(b"|")
    h.update(ids.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, eq=False)
class KVArtifact:
    """Key/value state of `length` tokens computed at positions [start, start+length)."""

    keys: tuple[torch.Tensor, ...]  # per layer, [1, kv_heads, n_i, head_dim]
    values: tuple[torch.Tensor, ...]
    token_ids: torch.Tensor  # int64 [length]
    model_fingerprint: str
    tokenizer_fingerprint: str
    dtype: str
    start: int
    layer_types: tuple[str, ...]
    seen: tuple[int, ...]  # per layer: tokens the layer has seen (cumulative_length); full layers: start+length
    parent: str = ""
    text_sha256: str = ""
    probe_sha256: str = ""
    metadata: dict = field(default_factory=dict)  # extra header entries, informational only

    @property
    def length(self) -> int:
        return int(self.token_ids.numel())

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def key(self) -> str:
        return artifact_key(self.model_fingerprint, self.parent, self.token_ids)

    @property
    def id(self) -> str:
        return self.key

    def kv_bytes(self) -> int:
        """Raw bytes of the key/value tensors (what the file must not exceed by more than its header)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def validate(self) -> None:
        n = len(self.layer_types)
        assert len(self.keys) == len(self.values) == len(self.seen) == n, "per-layer tuples must have one entry per layer"
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            assert k.shape == v.shape and k.dim() == 4 and k.shape[0] == 1, f"layer {i}: keys/values must be [1, h, n, d]"
            if self.layer_types[i] == "full_attention":
                assert k.shape[2] == self.length, f"layer {i}: full layer must hold exactly the artifact's own tokens"
