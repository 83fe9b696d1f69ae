"""kvgraft's own matrix product (c/linear.c): one fixed float32 operation order, faster than MKL here. The kernels'
build and library handle are build.py's; this module calls the products and takes a model's layers over.

Why: with MKL, the bytes of a row of x @ W^T depended on how many rows the call held, on the weight's
address and on the thread count, and its 1-row and few-row calls were slow on this CPU (a 16-token
question's 126 layer products took ~43 ms, the 1-row vocabulary product ~22 ms split on 2 threads,
bench.kernels). fma16 fixes the order of every operation of every output (c/reference.c's header): a row's
bytes depend only on that row and the weight, by construction, on any CPU that runs the same
instructions. And it reads the packaged model's weights in the GGUF blocks they were published in
(Q8_0, Q5_0, Q4_K, Q6_K: 4-6x fewer bytes than float32), expanded in registers exactly as the float32
weights were made from them. It reads the other block formats llama.cpp's common quantisations write too
(F16, BF16, Q4_0, Q4_1, Q5_1, Q5_K: ggml's layouts, expanded as gguf-py's dequantize does). Every block
format is expanded in registers as it is read for one to eight rows of x (c/linear.c's fused kernels: a decode
step reads each weight once, 4-8x fewer bytes than a float32 panel); F16 and BF16, and more rows, go through
float32 panels.

What is checked at load, not assumed:
- per tensor, that the blocks expand to the float32 weight's bytes (a tensor whose blocks differ, or are
  missing, is multiplied from its float32 weight instead: the same products, more bytes read);
- per weight shape, on seeded rows, that the kernel gives the bytes of the plain C reference (one output
  at a time, written as the definition) and that a row's bytes do not change with the rows beside it. A pass is
  remembered in the kernel cache (CHECKS_FILE) under the SHA-256 of everything the check computes from (the built
  library, the variant, this CPU, the thread count, the shape, the compared weight rows: `_check_digest`), and the
  record under the SHA-256 of its list; a later load with the same digest takes the pass, any other recomputes.

One source (c/: the operations written once over named primitives, one file of them per instruction
set under c/arch/, mapped by c/simd.h), three builds that compute the same bits (build.VARIANTS); the choice
is not part of the record, since it cannot change a bit (the tests compare the three, and each is checked at
load as above).

Where it is used it replaces every float32 CPU product of the model (`nn.Linear.forward`, and the batched
passes' products through `product_of`), prefix and question alike, so "fresh" and "grafted" still compute
the same bytes; and it enters the determinism record as ("linear", VERSION): artifacts made with MKL's
products are refused as incompatible, not mistaken for broken. It needs the kernels built (build.py: a C
compiler, once per variant). Without them, or with KVGRAFT_LINEAR=torch, the model keeps torch's products
(graft_core.products) and its record has no ("linear", VERSION) entry.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

import settings
from errors import InvalidSetting

from .build import failure, lib, variant

log = logging.getLogger("kvgraft.fma16")

VERSION = "fma16-v1"  # the operation order of c/reference.c's products; change it when that order changes
# The integer definition (c/int8ref.c): a row of x quantised to int8 per block, integer sums, the scales applied in a
# fixed order. A product over blocks of I8_FORMATS runs it where KVGRAFT_LINEAR=int8; it enters the record as
# ("linear", I8_VERSION) beside the rest, so artifacts of one definition are refused by the other as incompatible.
I8_VERSION = "i8dot-v1"
I8_FLAG = 0x100  # c/reference.c's FMT_I8: the format's blocks, multiplied under the integer definition

# ggml's type numbers, as c/reference.c names them
FORMATS = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "BF16": 30,
}
I8_FORMATS = (FORMATS["Q8_0"], FORMATS["Q5_0"], FORMATS["Q4_K"], FORMATS["Q6_K"])


def why_not(choice: str | None = None) -> str:
    """ "" where fma16 can run in this process, else the reason it cannot (or is switched off). `choice`
    ("fma16", "int8" or "torch") stands in for KVGRAFT_LINEAR, which is read when it is None. Raises
    InvalidSetting where KVGRAFT_ISA names a variant this CPU lacks."""
    try:
        choice = settings.get("KVGRAFT_LINEAR", {"KVGRAFT_LINEAR": choice} if choice is not None else None)
    except InvalidSetting as e:
        return str(e)
    if choice == "torch":
        return "KVGRAFT_LINEAR=torch"
    name = variant()
    lib(name)
    return failure(name)


def row_bytes(fmt: int, k: int) -> int:
    return lib().kv_row_bytes(fmt, k)


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    fmt: int,
    n: int,
    *,
    reference: bool = False,
    isa: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """x [M, K] float32 (contiguous) @ W^T -> [M, N], W as `n` rows of `fmt` in the uint8 (or float32) tensor `w`,
    on variant `isa` (default `variant()`), split over `threads` (default torch's count; never a bit's
    difference). `reference` runs the plain C definition instead (one output at a time; slow)."""
    m, k = x.shape
    kernels = lib(isa)
    need = kernels.kv_row_bytes(fmt, k)
    if need < 0 or x.dtype != torch.float32 or not x.is_contiguous() or not w.is_contiguous():
        raise ValueError(f"fma16 takes contiguous float32 rows and a format that holds {k} values (format {fmt})")
    if w.numel() * w.element_size() < n * need:  # the C code reads n rows of `need` bytes: never past the tensor
        raise ValueError(
            f"fma16: {n} rows of format {fmt} need {n * need:,} bytes, the weight holds {w.numel() * w.element_size():,}"
        )
    y = torch.empty((m, n), dtype=torch.float32)
    if reference:
        rc = kernels.kv_linear_ref(x.data_ptr(), m, k, k, w.data_ptr(), fmt, n, y.data_ptr(), n)
    else:
        team = torch.get_num_threads() if threads is None else threads
        rc = kernels.kv_linear(x.data_ptr(), m, k, k, w.data_ptr(), fmt, n, y.data_ptr(), n, team)
    if rc != 0:
        raise RuntimeError(f"fma16 product failed ({rc}) for x {tuple(x.shape)}, {n} rows of format {fmt}")
    return y


def dequantize(w: torch.Tensor, fmt: int, n: int, k: int, *, reference: bool = False, isa: str | None = None) -> torch.Tensor:
    """The float32 weights [n, k] of `n` rows of `fmt`, expanded as variant `isa`'s products expand them
    (or by the plain C reference)."""
    kernels = lib(isa)
    need = kernels.kv_row_bytes(fmt, k)
    if need < 0 or not w.is_contiguous() or w.numel() * w.element_size() < n * need:
        raise ValueError(f"fma16: {n} rows of {k} values in format {fmt} do not fit the given weight")
    out = torch.empty((n, k), dtype=torch.float32)
    if kernels.kv_dequant(w.data_ptr(), fmt, n, k, out.data_ptr(), 0 if reference else 1) != 0:
        raise ValueError(f"format {fmt} cannot hold rows of {k} values")
    return out


class Fma16Linear:
    """The forward of a float32 `nn.Linear` through fma16, over GGUF blocks where given (checked equal)."""

    def __init__(self, module: torch.nn.Linear, blocks: torch.Tensor | None = None, fmt: int = 0, isa: str | None = None):
        self.module = module
        self.isa = isa or variant()  # fixed when taken over: a model computes on one variant for its life
        self.plain = module.forward
        self.n, self.k = module.weight.shape
        self.blocks, self.fmt = (blocks, fmt) if blocks is not None else (None, FORMATS["F32"])
        # products of fewer multiply-adds than this run on the calling thread alone (0: always torch's thread
        # count): waking a second thread can cost more than a small product, milliseconds on a busy machine
        self.solo_below = 0

    @property
    def source(self) -> torch.Tensor:
        """What the kernel reads: the blocks, or the float32 weight itself (read in place, never copied)."""
        if self.blocks is not None:
            return self.blocks
        w = self.module.weight
        return w if w.is_contiguous() else w.contiguous()

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> x W^T [..., N] (no bias)."""
        flat = x.reshape(-1, self.k)
        if flat.dtype != torch.float32 or flat.device.type != "cpu":
            raise TypeError(f"fma16 takes float32 CPU rows, got {flat.dtype} on {flat.device}")
        if not flat.is_contiguous():
            flat = flat.contiguous()  # where a row sits does not change its bytes here (unlike MKL)
        # a profiled run (bench.kernels) sees the products as one op; otherwise nothing is recorded
        profiled = torch._C._autograd._profiler_enabled()
        with torch.profiler.record_function("fma16::linear") if profiled else contextlib.nullcontext():
            threads = 1 if flat.shape[0] * self.k * self.n < self.solo_below else None
            return linear(flat, self.source, self.fmt, self.n, isa=self.isa, threads=threads).reshape(*x.shape[:-1], self.n)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.module.weight
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        ):
            return self.plain(x)  # not the engine's numbers (gradients, another dtype): torch's product
        y = self.product(x)
        return y if self.module.bias is None else y + self.module.bias


@dataclass(frozen=True)
class Taken:
    """What `take_over` did, for the load log and the record of a run."""

    products: int  # linear layers now computed by fma16
    over_blocks: int  # of those, read from GGUF blocks
    blocks_refused: int  # blocks present whose expansion differed from the float32 weight (read as float32)
    shapes_checked: int
    isa: str = ""  # the variant (VARIANTS) the products run on: for the log, not the record (same bits)
    shapes_remembered: int = 0  # of the shapes checked, those whose pass on this machine was remembered (CHECKS_FILE)
    int8: int = 0  # of the products over blocks, those under the integer definition (I8_VERSION)

    def line(self) -> str:
        blocks = f", {self.over_blocks} over GGUF blocks" if self.over_blocks else ""
        if self.int8:
            blocks += f" ({self.int8} of them under {I8_VERSION}: int8 rows of x, integer sums)"
        refused = f", {self.blocks_refused} blocks refused (expanded to other bytes)" if self.blocks_refused else ""
        kept = f", {self.shapes_remembered} of them passed before under the same digest" if self.shapes_remembered else ""
        return (
            f"{VERSION} ({self.isa}): {self.products} products{blocks}{refused} "
            f"({self.shapes_checked} shapes checked against the C reference and row by row{kept})"
        )


def _f32_cpu_linear(m) -> bool:
    return isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"


def check_shape(op: Fma16Linear, rows: int = 9, seed: int = 0) -> str:
    """ "" where, on seeded rows, the kernel equals the C reference and each row equals that row alone."""
    x = torch.randn(rows, op.k, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    ref_rows = min(op.n, 64)  # the reference is slow: its first rows, through a slice of the source
    src = op.source.reshape(op.n, -1)[:ref_rows].contiguous()
    fast = linear(x, op.source, op.fmt, op.n, isa=op.isa)
    if not torch.equal(fast[:, :ref_rows], linear(x, src, op.fmt, ref_rows, reference=True, isa=op.isa)):
        return "differs from the C reference"
    alone = torch.cat([linear(x[i : i + 1].contiguous(), op.source, op.fmt, op.n, isa=op.isa) for i in range(rows)])
    if not torch.equal(fast, alone):
        return "a row's bytes changed with the rows beside it"
    return ""


CHECKS_FILE = "fma16-shapes-checked.json"  # in the kernel cache: the shape checks passed (`_check_digest`)
_CHECKS_VERSION = "1"
_CHECKS_KEPT = 4096  # the newest passes kept (each test's random model adds its own): an older one is checked again


def _check_digest(op: Fma16Linear, rows: int = 9, seed: int = 0) -> str:
    """SHA-256 of everything `check_shape(op, rows, seed)` computes from: the check's version, the built library
    (its file name holds the build key: sources, compiler, flags), the variant, this CPU (model, microcode, flags),
    the thread count the products split over, the shape and format, the seeded rows, and the weight rows the C
    reference is compared on. A check that passed under a digest passes again under it: the kernels compute the
    same bits for the same inputs on the same machine (what the check itself establishes)."""
    import hashlib
    import json

    from .build import cpu_identity, library_file

    library = library_file(op.isa)
    ref_rows = min(op.n, 64)
    head = op.source.reshape(op.n, -1)[:ref_rows].contiguous()
    what = [
        _CHECKS_VERSION,
        VERSION,
        library.name if library is not None else "",
        op.isa,
        cpu_identity(),
        torch.get_num_threads(),
        op.n,
        op.k,
        op.fmt,
        rows,
        seed,
        hashlib.sha256(head.view(torch.uint8).numpy().tobytes()).hexdigest(),
    ]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def _checks_file() -> Path:
    from .build import kernel_cache_dir

    return kernel_cache_dir() / CHECKS_FILE


def _passed_checks() -> list[str]:
    """The digests of the shape checks that passed on this machine, oldest first, or none where the record is
    missing, not this version, or does not hash to its own stated SHA-256 (a damaged or edited record: every shape
    is checked)."""
    import hashlib
    import json

    try:
        record = json.loads(_checks_file().read_text())
        passed = record["passed"]
        if record.get("version") != _CHECKS_VERSION or not isinstance(passed, list):
            return []
        if not all(isinstance(d, str) for d in passed):
            return []
        if hashlib.sha256("\n".join(passed).encode()).hexdigest() != record.get("sha256"):
            return []
        return passed
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _remember_checks(passed: list[str]) -> None:
    """Write the newest _CHECKS_KEPT passed checks' digests (with the SHA-256 of their list) beside and rename; a
    cache that cannot be written keeps nothing (the shapes are checked again at the next load)."""
    import hashlib
    import json

    digests = passed[-_CHECKS_KEPT:]
    record = {"version": _CHECKS_VERSION, "passed": digests, "sha256": hashlib.sha256("\n".join(digests).encode()).hexdigest()}
    target = _checks_file()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)


def take_over(
    model, blocks: dict[str, tuple[torch.Tensor, int]] | None = None, isa: str | None = None, int8: bool | None = None
) -> Taken:
    """Route every float32 CPU linear layer of `model` through fma16 (module doc) on variant `isa` (default
    `variant()`). `blocks` maps parameter names to (uint8 rows, format); each is used only where it expands to
    that parameter's bytes, or where the parameter has no bytes (the meta device: the caller proves the
    blocks, as graft_core.packaged does). `int8` (default: KVGRAFT_LINEAR=int8) multiplies the blocks of
    I8_FORMATS under the integer definition (I8_VERSION); the caller puts it in the record where Taken.int8 says
    it was used. Raises RuntimeError if a check fails (nothing is taken over then)."""
    isa = variant(isa)
    if int8 is None:
        int8 = settings.get("KVGRAFT_LINEAR") == "int8"
    params = dict(model.named_parameters(remove_duplicate=False))
    by_param: dict[int, tuple[torch.Tensor, int]] = {}
    refused = 0
    for name, (rows, fmt) in (blocks or {}).items():
        p = params.get(name)
        if p is None or p.dim() != 2 or id(p) in by_param:
            continue
        n, k = p.shape
        if rows.shape != (n, row_bytes(fmt, k)):
            refused += 1
            continue
        if p.device.type == "meta":  # no float32 weight to compare: the blocks are the weight (graft_core.packaged
            by_param[id(p)] = (rows, fmt)  # proves their expansion by the float32 weights' hash)
            continue
        if not torch.equal(dequantize(rows, fmt, n, k, isa=isa).view(torch.int32), p.detach().contiguous().view(torch.int32)):
            refused += 1
            log.warning("GGUF blocks of %s expand to other bytes than its float32 weight; reading the float32 weight", name)
            continue
        by_param[id(p)] = (rows, fmt)
    ops: list[tuple[torch.nn.Module, Fma16Linear]] = []
    checked: dict[tuple, str] = {}
    passed = _passed_checks()
    known, remembered = set(passed), 0
    with torch.inference_mode():
        for _, m in model.named_modules():
            if not (_f32_cpu_linear(m) or (isinstance(m, torch.nn.Linear) and id(m.weight) in by_param)):
                continue
            found = by_param.get(id(m.weight))
            if found and int8 and found[1] in I8_FORMATS:
                found = (found[0], found[1] | I8_FLAG)
            op = Fma16Linear(m, *found, isa=isa) if found else Fma16Linear(m, isa=isa)
            key = (op.n, op.k, op.fmt)
            if key not in checked:  # each shape checked once, or its pass under the same digest remembered
                digest = _check_digest(op)
                checked[key] = "" if digest in known else check_shape(op)
                if digest in known:
                    remembered += 1
                elif not checked[key]:
                    passed.append(digest)
            if checked[key]:
                raise RuntimeError(f"fma16 {checked[key]} for {op.n}x{op.k} (format {op.fmt}) on this machine")
            ops.append((m, op))
    if remembered < len(checked):
        _remember_checks(passed)
    for m, op in ops:
        m.forward = op
    int8_ops = sum(bool(op.fmt & I8_FLAG) for _, op in ops)
    return Taken(len(ops), sum(op.blocks is not None for _, op in ops), refused, len(checked), isa, remembered, int8_ops)


def product_of(module) -> Fma16Linear | None:
    """The fma16 forward of a linear layer, or None where it has torch's."""
    f = module.__dict__.get("forward")
    return f if isinstance(f, Fma16Linear) else None


def undo(model) -> int:
    """Give every linear layer its torch forward back (A/B runs); returns how many."""
    taken = [m for m in model.modules() if isinstance(m.__dict__.get("forward"), Fma16Linear)]
    for m in taken:
        del m.forward
    return len(taken)


def gguf_blocks(gguf_path: Path, model) -> dict[str, tuple[torch.Tensor, int]]:
    """The 2-D tensors of a GGUF file in a format fma16 reads, by the model's parameter names (gguf's own
    name map for the model's architecture), as uint8 rows."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"]
    arch_name = bytes(arch.parts[arch.data[0]]).decode()
    arch_id = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    names = gguf.get_tensor_name_map(arch_id, model.config.get_text_config(decoder=True).num_hidden_layers)
    wanted = {}
    for pname, p in model.named_parameters():
        g = names.get_name(pname.removesuffix(".weight"))
        if g is not None and p.dim() == 2:
            wanted[g + ".weight"] = pname
    out = {}
    for t in reader.tensors:
        fmt = FORMATS.get(t.tensor_type.name)
        if t.name in wanted and fmt is not None and fmt != FORMATS["F32"]:
            out[wanted[t.name]] = (torch.from_numpy(np.array(t.data, dtype=np.uint8)), fmt)  # a copy, not the map
    return out


def save_blocks(blocks: dict[str, tuple[torch.Tensor, int]], path: Path) -> None:
    from safetensors.torch import save_file

    meta = {name: str(fmt) for name, (_, fmt) in blocks.items()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({name: rows.contiguous() for name, (rows, _) in blocks.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load_blocks(path: Path) -> dict[str, tuple[torch.Tensor, int]]:
    """Blocks saved by `save_blocks` (each is checked against its float32 weight by `take_over` before use)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for name in f.keys():
            if name in meta and meta[name].isdigit():
                out[name] = (f.get_tensor(name).contiguous(), int(meta[name]))
    return out
