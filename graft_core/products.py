"""The model's matrix products, called faster where that computes the same bytes (checked at load).

Two measured facts about MKL's float32 products on this machine (bench.kernels records both):
- A 1-row product with the vocabulary matrix (262,144 x 640, 671 MB for the packaged model; every
  answer's first token and every decode step) runs on one core: in a one-off check it took the same 58-61 ms with 1
  and with 2 torch threads, about a third of the machine's memory bandwidth. Each output is one matrix row
  dotted with the input, and MKL's value for an output did not depend on how many matrix rows one call
  covers. So `SplitRows` cuts the matrix into contiguous row blocks and runs one call per block at once
  on the pinned number of threads, each writing its own slice of the output.
- A product of a few rows with a layer's weight, x @ W^T (a question's 12-64 tokens), is faster called
  the other way round, (W @ x^T)^T, and then gave the same bytes from 12 rows up (not from 2 to 11).
  `Transposed` calls it that way for the row counts where it was checked equal.

Same bytes is checked, not assumed: `speed_up(model)` computes every product it would take over both
ways when the model loads, on seeded random inputs, for each weight shape and each row count it may
take, and takes over only the (shape, row count) pairs where every byte agreed. Every other call (other
row counts, gradients, another dtype or device, a misaligned or strided input, another thread count
than the one checked under) goes to the plain `nn.Linear`. Vocabulary blocks start at multiples of
BLOCK_ROWS rows, so each starts at the matrix's own address alignment mod 64 bytes, which MKL's 1-row
results depend on (determinism.place_weights). Nothing here is part of the fingerprint: it changes
how fast bytes are computed, not which; the golden set and the per-answer proofs still hold them to it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger("kvgraft.products")

BLOCK_ROWS = 256  # vocabulary block starts are multiples of this many rows (x 4 bytes x in_features: 64-byte aligned)
SPLIT_MIN_ROWS = 32_768  # smaller matrices stay plain: the hand-off to another thread costs more than it saves
TRANSPOSED_ROWS = range(2, 65)  # row counts checked for the transposed call; it is used where the check agreed
ALIGN = 64  # bytes; inputs at another alignment go to the plain call (the check used aligned ones)

_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="kvgraft-products")
        return pool


def blocks(rows: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering `rows` in at most `parts` contiguous blocks starting at multiples of BLOCK_ROWS."""
    step = -(-rows // parts // BLOCK_ROWS) * BLOCK_ROWS  # ceil(rows / parts), rounded up to whole blocks
    return [(a, min(a + step, rows)) for a in range(0, rows, max(step, BLOCK_ROWS))]


def _eligible(x: torch.Tensor, w: torch.Tensor, threads: int) -> bool:
    """What every fast path requires of a call: float32 on the CPU, no autograd, the checked thread count."""
    return (
        x.dtype == w.dtype == torch.float32
        and x.device.type == w.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        and torch.get_num_threads() == threads
    )


def seeded_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random float32 rows from their own generator (the global RNG is left alone): the load-time checks' inputs."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


class SplitRows:
    """The forward of a bias-free `nn.Linear` that splits 1-row products into row blocks run on threads."""

    def __init__(self, linear: torch.nn.Linear, parts: int):
        self.linear = linear
        self.plain = linear.forward  # the class's forward, bound: where every other call goes
        self.bounds = blocks(linear.out_features, parts)
        self.threads = torch.get_num_threads()
        self.pool = _pool(max(1, len(self.bounds) - 1))

    def applies(self, x: torch.Tensor) -> bool:
        w = self.linear.weight
        return x.numel() == w.shape[1] and _eligible(x, w, self.threads)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight
        flat = x.reshape(1, w.shape[1])
        out = torch.empty((1, w.shape[0]), dtype=w.dtype)
        inference = torch.is_inference_mode_enabled()

        def block(i: int) -> None:
            a, e = self.bounds[i]
            with torch.inference_mode(inference), torch.no_grad():  # grad modes are per thread
                out[:, a:e] = F.linear(flat, w[a:e])

        pending = [self.pool.submit(block, i) for i in range(1, len(self.bounds))]
        errors = []
        try:
            block(0)  # this thread computes the first block itself
        except BaseException as e:  # wait for the others before raising: they write into `out`
            errors.append(e)
        for f in pending:
            try:
                f.result()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]
        return out.reshape(*x.shape[:-1], w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.split(x) if self.applies(x) else self.plain(x)


def transposed_product(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x [n, K] @ W^T computed as (W @ x^T)^T, made contiguous: the call `Transposed` makes and its check compares."""
    return torch.mm(weight, x.t()).t().contiguous()


class Transposed:
    """The forward of a bias-free `nn.Linear` that computes x @ W^T as (W @ x^T)^T for the checked row counts."""

    def __init__(self, linear: torch.nn.Linear, rows: frozenset[int]):
        self.linear = linear
        self.plain = linear.forward
        self.rows = rows
        self.threads = torch.get_num_threads()

    def applies(self, x: torch.Tensor) -> bool:
        w = self.linear.weight
        return (
            x.dim() >= 2
            and x.shape[-1] == w.shape[1]
            and x.numel() // w.shape[1] in self.rows
            and x.is_contiguous()
            and x.data_ptr() % ALIGN == 0
            and _eligible(x, w, self.threads)
        )

    def transposed(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight
        return transposed_product(w, x.reshape(-1, w.shape[1])).reshape(*x.shape[:-1], w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.transposed(x) if self.applies(x) else self.plain(x)


@dataclass(frozen=True)
class SpeedUps:
    """What `speed_up` took over, for the load log and the record of a run."""

    vocabulary: str  # how 1-row vocabulary products run
    transposed_layers: int  # linear layers that take the transposed call for some row counts
    transposed_rows: tuple[int, ...]  # the row counts every checked layer shape agreed on ((): none)
    checked_shapes: int

    def line(self) -> str:
        rows = self.transposed_rows
        span = f"{rows[0]}-{rows[-1]} rows" if rows and rows[-1] - rows[0] + 1 == len(rows) else f"{len(rows)} row counts"
        layers = f"{self.transposed_layers} layer products transposed for {span}" if rows else "layer products plain"
        return f"vocabulary {self.vocabulary}; {layers} ({self.checked_shapes} shapes checked byte for byte)"


def _bias_free_cpu_f32(m) -> bool:
    return isinstance(m, torch.nn.Linear) and m.bias is None and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"


def split_vocabulary(head, parts: int) -> str:
    """Give `head` the split 1-row product when it computes the same bytes here; returns what was done."""
    if not _bias_free_cpu_f32(head):
        return "plain (not a bias-free float32 CPU linear layer)"
    if head.out_features < SPLIT_MIN_ROWS or parts < 2:
        return f"plain ({head.out_features:,} rows on {parts} thread(s): too small to split)"
    split = SplitRows(head, parts)
    probe = seeded_rows(1, head.in_features, seed=0).reshape(1, 1, -1)
    with torch.inference_mode():
        same = torch.equal(split.plain(probe), split.split(probe))
    if not same:
        log.warning("the split vocabulary product computes other bytes on this machine; kept the plain one")
        return "plain (the split product differed from the plain one on the load-time probe)"
    head.forward = split
    return f"split in {len(split.bounds)} row blocks on {len(split.bounds)} threads"


def transposed_rows(weight: torch.Tensor, candidates=TRANSPOSED_ROWS) -> frozenset[int]:
    """The row counts for which (W @ x^T)^T equals x @ W^T byte for byte on seeded random inputs."""
    top = max(candidates, default=0)
    x = seeded_rows(top, weight.shape[1], seed=1)
    agreed = set()
    with torch.inference_mode():
        for n in candidates:
            xs = x[:n]  # a prefix of a contiguous tensor: same address, aligned
            if torch.equal(F.linear(xs, weight), transposed_product(weight, xs)):
                agreed.add(n)
    return frozenset(agreed)


def undo(model) -> int:
    """Give every product `speed_up` took over back to the plain `nn.Linear`; returns how many (for A/B runs)."""
    taken = [m for m in model.modules() if isinstance(m.__dict__.get("forward"), (SplitRows, Transposed))]
    for m in taken:
        del m.forward
    return len(taken)


def speed_up(model, parts: int | None = None) -> SpeedUps:
    """Take over the products of `model` that are faster another way and checked equal here (module doc)."""
    parts = parts or torch.get_num_threads()
    head = getattr(model, "lm_head", None)
    vocabulary = split_vocabulary(head, parts) if head is not None else "plain (no lm_head)"
    by_shape: dict[tuple, frozenset[int]] = {}
    taken = 0
    for _, m in model.named_modules():
        if m is head or not _bias_free_cpu_f32(m) or m.out_features >= SPLIT_MIN_ROWS:
            continue
        w = m.weight
        key = (tuple(w.shape), tuple(w.stride()), w.data_ptr() % ALIGN)
        if key not in by_shape:
            by_shape[key] = transposed_rows(w)
        if by_shape[key]:
            m.forward = Transposed(m, by_shape[key])
            taken += 1
    common = frozenset.intersection(*by_shape.values()) if by_shape else frozenset()
    return SpeedUps(vocabulary, taken, tuple(sorted(common)), len(by_shape))
