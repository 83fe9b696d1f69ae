"""The one place that reads and writes a transformers cache layer's state, by layer kind.

Capture exports, restore and relocation import; nothing else touches `layer.keys`, `layer.values`,
`cumulative_length` or asks whether a layer slides. A full-attention layer holds every row it has
seen; a sliding-window layer holds at most `window - 1` rows plus how many tokens it has seen. When
transformers changes its cache API, this module is what changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer


@dataclass(frozen=True)
class LayerState:
    """Keys/values `[1, kv_heads, n, head_dim]` of one layer and how many tokens the layer has seen."""

    keys: torch.Tensor
    values: torch.Tensor
    seen: int


def is_sliding(layer) -> bool:
    return bool(getattr(layer, "is_sliding", False))


def export_layer(layer, start: int, end: int) -> LayerState:
    """Copy out the state a layer holds for positions [start, end) (a sliding layer: what it holds)."""
    if is_sliding(layer):
        return LayerState(
            keys=layer.keys.detach().clone().contiguous(),
            values=layer.values.detach().clone().contiguous(),
            seen=int(layer.cumulative_length),
        )
    return LayerState(
        keys=layer.keys[:, :, start:, :].detach().clone().contiguous(),
        values=layer.values[:, :, start:, :].detach().clone().contiguous(),
        seen=end,
    )


def import_layer(layer, state: LayerState) -> None:
    """Make a fresh layer hold `state`; a sliding layer keeps only its last `window - 1` rows."""
    k, v = state.keys, state.values
    if is_sliding(layer):
        keep = layer.sliding_window - 1
        if k.shape[2] > keep:
            k, v = k[:, :, -keep:, :].contiguous(), v[:, :, -keep:, :].contiguous()
    layer.lazy_initialization(k, v)
    layer.keys, layer.values = k, v
    if is_sliding(layer):
        layer.cumulative_length = state.seen


def export_cache(cache, start: int, end: int) -> list[LayerState]:
    """Per-layer state of a cache after it has run up to position `end`, own rows from `start`."""
    return [export_layer(layer, start, end) for layer in cache.layers]


def import_cache(cache, states: list[LayerState]) -> None:
    assert len(cache.layers) == len(states), "cache layout differs from the state's layer list"
    for layer, state in zip(cache.layers, states):
        import_layer(layer, state)


def sliding_flags(cache) -> list[bool]:
    """Per layer: does it slide (the cache's own view, for callers that combine states by kind)."""
    return [is_sliding(layer) for layer in cache.layers]


def state_digest(cache) -> str:
    """BLAKE3 (hex) of what a cache holds, layer by layer: kind, tokens seen, shapes, dtype and the
    key/value bytes. Two caches with equal digests serve the same continuation bit for bit (same model
    and kernels); a 28 MB state costs ~4 ms here (the per-answer state proof's whole cost). One thread:
    BLAKE3 on the 2 pinned threads hashed 38 MB of buffers faster alone (3.8 against 5.2 ms, one-off) but
    not inside an answer (bench.kernels' state_proof stage: 4.2-4.5 ms against 3.8 at 2,049 tokens)."""
    import blake3

    h = blake3.blake3()
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        if k is None or v is None:  # a layer that holds nothing yet
            h.update(b"empty|")
            continue
        seen = int(layer.cumulative_length) if is_sliding(layer) else int(k.shape[2])
        h.update(f"{int(is_sliding(layer))}:{seen}:{tuple(k.shape)}:{tuple(v.shape)}:{k.dtype}|".encode())
        for t in (k, v):
            h.update(memoryview(t.detach().contiguous().cpu().numpy()).cast("B"))
    return h.hexdigest()


# ---- a cache that appends in place ---------------------------------------------------------------------


def _headroom(rows: int) -> int:
    """Rows a fresh buffer holds beyond `rows`: a quarter more, at least 256 (a regrowth copies the layer)."""
    return max(256, rows // 4)


def _unfilled(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """torch.empty without the NaN fill that deterministic mode adds to every allocation: a buffer's rows are
    written before they are read (nothing past `end` is ever read), and the fill cost a restored answer
    ~4 ms (two 1-2 MB buffers per layer, 18 layers). The switch is torch's own and is put back at once."""
    import torch.utils.deterministic as deterministic

    was = deterministic.fill_uninitialized_memory
    deterministic.fill_uninitialized_memory = False
    try:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    finally:
        deterministic.fill_uninitialized_memory = was


def _shareable(keys: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> bool:
    """Can the lean step read these held rows in place (contiguous, the buffers' dtype, batch, heads, head size)?"""
    return (
        keys.dim() == like.dim() == 4
        and keys.shape == values.shape
        and keys.dtype == values.dtype == like.dtype
        and keys.device == like.device
        and keys.shape[:2] == like.shape[:2]
        and keys.shape[3] == like.shape[3]
        and keys.is_contiguous()
        and values.is_contiguous()
    )


class _Rows:
    """A layer's key/value rows [B, H, start:end, D] in buffers this object allocated, after (on the lean
    step's path) rows it shares: a restored artifact's tensors, read in place by every session that grafts
    that artifact and never written (`base_k`/`base_v`, rows from `bstart` on). Rows are only ever written
    into this object's buffers, never into a tensor handed in from outside (an artifact's tensors, which a
    restore puts in a cache without copying, are shared with the artifact and with other sessions)."""

    def __init__(self):
        self.k = self.v = None  # the buffers
        self.start = self.end = 0
        self.view = None  # the keys view last handed to the layer: anything else there is not ours
        self.base_k = self.base_v = None  # shared rows held before the buffers' (None: none)
        self.bstart = 0

    @property
    def shared(self) -> int:
        """How many shared rows are held (they come before the buffers' rows)."""
        return 0 if self.base_k is None else self.base_k.shape[-2] - self.bstart

    def drop_front(self, n: int) -> None:
        """Stop holding the first `n` rows (a sliding window moving on): shared ones first."""
        take = min(n, self.shared)
        self.bstart += take
        if self.base_k is not None and self.shared == 0:
            self.base_k = self.base_v = None
            self.bstart = 0
        self.start += n - take

    def join(self) -> None:
        """Copy the shared rows and the buffers' rows into fresh buffers, in order: a reader that wants one
        tensor of every row (transformers' modules, capture, a state digest) gets it; nothing is shared after."""
        if self.base_k is None:
            return
        parts = [(self.base_k[:, :, self.bstart :], self.base_v[:, :, self.bstart :])]
        if self.end > self.start:
            parts.append(self.rows(self.start, self.end))
        like, held = parts[0][0], sum(k.shape[-2] for k, _ in parts)
        self.base_k = self.base_v = None
        self.bstart = 0
        self._allocate(like, held)
        at = 0
        for k, v in parts:
            n = k.shape[-2]
            self.k[:, :, at : at + n].copy_(k)
            self.v[:, :, at : at + n].copy_(v)
            at += n
        self.start, self.end = 0, held

    def append(self, keys, values, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[int, int]:
        """Put the layer's current `keys`/`values` (when they are not already our view) and then the new rows
        at the end of the buffers; returns (start, end) of every row held. Same rows, same order as
        torch.cat([keys, k_new], dim=-2)."""
        new = k_new.shape[-2]
        self.reserve(keys, values, k_new, new)
        self.k[:, :, self.end : self.end + new].copy_(k_new)
        self.v[:, :, self.end : self.end + new].copy_(v_new)
        self.end += new
        return self.start, self.end

    def reserve(self, keys, values, like: torch.Tensor, new: int, share: bool = False) -> None:
        """Room for `new` rows after the held ones: the layer's `keys`/`values` adopted when they are not our
        view (fresh, restored or cropped): with `share` (the lean step, which reads two segments) held in
        place as shared rows, else copied; the rows slid to the front or the buffers regrown when their end
        is reached. `like` gives the buffers' batch, heads, head size and dtype."""
        if keys is None or keys is not self.view:
            held = 0 if keys is None or keys.dim() != like.dim() else keys.shape[-2]
            self.base_k = self.base_v = None
            self.bstart = 0
            if share and held and _shareable(keys, values, like):
                self.base_k, self.base_v, held = keys, values, 0
            self._allocate(like, held + new)
            if held:
                self.k[:, :, :held].copy_(keys)
                self.v[:, :, :held].copy_(values)
            self.start, self.end = 0, held
        elif self.k.shape[-2] - self.end < new:
            held = self.end - self.start
            if held + new + _headroom(held + new) // 2 <= self.k.shape[-2]:  # room at the front (a sliding layer)
                self.k[:, :, :held] = self.k[:, :, self.start : self.end].clone()
                self.v[:, :, :held] = self.v[:, :, self.start : self.end].clone()
            else:
                old_k, old_v = self.k[:, :, self.start : self.end], self.v[:, :, self.start : self.end]
                self._allocate(like, held + new)
                self.k[:, :, :held].copy_(old_k)
                self.v[:, :, :held].copy_(old_v)
            self.start, self.end = 0, held

    def _allocate(self, like: torch.Tensor, rows: int) -> None:
        b, h, _, d = like.shape
        cap = rows + _headroom(rows)
        self.k = _unfilled((b, h, cap, d), like)
        self.v = _unfilled((b, h, cap, d), like)

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of rows [start, end) of the buffers; the keys view becomes the one the layer holds."""
        return self.k[:, :, start:end], self.v[:, :, start:end]


class _Held:
    """`keys`/`values` of a growing layer: what the layer holds, as one tensor each. While the lean step reads
    shared rows in place (_Rows.base_k) there is no such tensor: reading `keys` or `values` then joins the
    rows into the layer's own buffers first (once), so transformers' modules, capture and digests see every
    row. The lean step reads and writes through `_rows` and `raw`/`set_raw`, which never join."""

    @property
    def keys(self):
        rows = self.__dict__.get("_rows")
        if rows is not None and rows.base_k is not None:
            rows.join()
            self.set_raw(*rows.rows(rows.start, rows.end))
            rows.view = self.__dict__["_held_keys"]
        return self.__dict__.get("_held_keys")

    @keys.setter
    def keys(self, value):
        self.__dict__["_held_keys"] = value

    @property
    def values(self):
        if self.__dict__.get("_rows") is not None and self._rows.base_k is not None:
            self.keys  # noqa: B018 (joins)
        return self.__dict__.get("_held_values")

    @values.setter
    def values(self, value):
        self.__dict__["_held_values"] = value

    def raw(self):
        """The keys and values tensors as set, without joining shared rows (the lean step's view)."""
        return self.__dict__.get("_held_keys"), self.__dict__.get("_held_values")

    def set_raw(self, keys, values) -> None:
        self.__dict__["_held_keys"], self.__dict__["_held_values"] = keys, values


class GrowingLayer(_Held, DynamicLayer):
    """transformers' DynamicLayer with `update` appending into buffers with headroom instead of
    concatenating into a fresh tensor: a decode step writes its one row instead of copying the layer.
    `keys`/`values` hold the same rows in the same order (views), so every byte read from them is the one a concatenated tensor holds."""

    def __init__(self):
        super().__init__()
        self._rows = _Rows()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._rows.append(self.keys, self.values, key_states, value_states)
        self.keys, self.values = self._rows.rows(start, end)
        self._rows.view = self.keys
        return self.keys, self.values


def reserve_rows(layer, n: int) -> _Rows | None:
    """Room for `n` more rows in a growing layer that holds rows (graft_core.step writes them); None where the
    layer is not one (another cache class, nothing held yet, transformers' past recording). Restored rows
    stay where they are, shared (the step reads them in place); only the new rows go into the buffers."""
    rows = getattr(layer, "_rows", None)
    if rows is None or not isinstance(layer, _Held) or getattr(layer, "record_past", False):
        return None
    keys, values = layer.raw() if layer.is_initialized else (None, None)
    if keys is None or keys.dim() != 4:
        return None
    if keys is rows.view and rows.k.shape[-2] - rows.end >= n:  # room after the held rows: reserve would move nothing,
        return rows  # and the layer already holds the views commit_rows set (a decode step's common case)
    rows.reserve(keys, values, keys, n, share=True)  # keys: restored, or the buffers' view (4-d either way)
    layer.set_raw(*rows.rows(rows.start, rows.end))  # the buffers' rows, wherever the reserve put them
    rows.view = layer.raw()[0]
    return rows


def commit_rows(layer, n: int) -> None:
    """After `n` rows were written from `end` on (and attended): the layer holds them, a sliding layer its
    last `sliding_window - 1` rows (shared ones leave first), as `update` leaves them."""
    rows = layer._rows
    rows.end += n
    if is_sliding(layer):
        layer.cumulative_length += n
        rows.drop_front(max(0, rows.shared + rows.end - rows.start - layer.sliding_window + 1))
    layer.set_raw(*rows.rows(rows.start, rows.end))
    rows.view = layer.raw()[0]


class GrowingSlidingLayer(_Held, DynamicSlidingWindowLayer):
    """DynamicSlidingWindowLayer appending in place: returns every row held plus the new ones (the window
    the step attends over), then holds the last `sliding_window - 1`; rows slide to the buffers' front when
    their end is reached (one copy of at most a window every few hundred steps)."""

    def __init__(self, sliding_window: int, **kwargs):
        super().__init__(sliding_window=sliding_window, **kwargs)
        self._rows = _Rows()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.record_past:  # transformers' assisted decoding: its own bookkeeping
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        start, end = self._rows.append(self.keys, self.values, key_states, value_states)
        full = self._rows.rows(start, end)
        keep = max(start, end - self.sliding_window + 1)
        self._rows.start = keep
        self.keys, self.values = self._rows.rows(keep, end)
        self._rows.view = self.keys
        return full


def growing_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose layers append in place (GrowingLayer, GrowingSlidingLayer)."""
    cache = DynamicCache(config=config)
    cache.layers = [
        GrowingSlidingLayer(sliding_window=layer.sliding_window) if is_sliding(layer) else GrowingLayer()
        for layer in cache.layers
    ]
    return cache
