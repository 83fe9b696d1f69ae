"""kvgraft's own matrix product (c/linear.c) and the build of every kernel: one fixed float32 operation order, faster than MKL here.

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
  at a time, written as the definition) and that a row's bytes do not change with the rows beside it.

One source (c/: the operations written once over named primitives, one file of them per instruction
set under c/arch/, mapped by c/simd.h), three builds that compute the same bits (VARIANTS): `avx512` (AVX-512 F/BW/VL/DQ, FMA, F16C),
`avx2` (AVX2, FMA, F16C: the 16 lanes in two 8-lane registers) and `portable` (plain C with fmaf, any
CPU). The best this CPU has is used unless KVGRAFT_ISA names one; the choice is not part of the record,
since it cannot change a bit (the tests compare the three, and each is checked at load as above).

Where it is used it replaces every float32 CPU product of the model (`nn.Linear.forward`, and the batched
passes' products through `product_of`), prefix and question alike, so "fresh" and "grafted" still compute
the same bytes; and it enters the determinism record as ("linear", VERSION): artifacts made with MKL's
products are refused as incompatible, not mistaken for broken. It needs a C compiler (gcc or cc) to
build c/kernels.c once per variant into the kernel cache (KVGRAFT_KERNEL_CACHE, default
~/.cache/kvgraft/kernels). Without one, or with KVGRAFT_LINEAR=torch, the model keeps torch's products
(graft_core.products) and its record has no ("linear", VERSION) entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

import settings
from errors import InvalidSetting

log = logging.getLogger("kvgraft.fma16")

VERSION = "fma16-v1"  # the operation order of c/reference.c's products; change it when that order changes
SOURCE_DIR = Path(__file__).with_name("c")  # kernels.c includes every other file there (c/kernels.c: the map)
SOURCE = SOURCE_DIR / "kernels.c"
FLAGS = (
    "-O3",
    "-ffp-contract=off",  # no fused or reordered float operations besides the written ones
    "-fno-fast-math",
    # no trapping math: the compiler may evaluate both arms of a select (if-conversion), which lets the
    # branch-free loops (exp, GELU, softmax) vectorise; it never reorders, contracts or reassociates an
    # operation, so no value changes (IEEE exceptions are not observed). A file-wide flag rather than a
    # pragma: GCC does not inline the vector primitives into functions with other optimisation options.
    "-fno-trapping-math",
    "-fopenmp",  # the split over output rows; libgomp is the one torch already loaded
    "-shared",
    "-fPIC",
)


@dataclass(frozen=True)
class Variant:
    """One build of the kernels (c/): the flags that select its primitives and instructions, and the CPU flags it needs."""

    name: str
    flags: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    needs: str  # the CPU it needs, in words, for the error message


VARIANTS = (  # best first: the default is the first this CPU can run
    Variant(
        "avx512",
        ("-DKV_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"),
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"),
        "AVX-512 F/BW/VL/DQ, FMA and F16C",
    ),
    Variant("avx2", ("-DKV_AVX2", "-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c"), "AVX2, FMA and F16C"),
    Variant("portable", (), (), "nothing beyond C's fmaf"),  # plain C, libm's correctly rounded fmaf
)
BY_NAME = {v.name: v for v in VARIANTS}
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

_libs: dict[str, object] = {}  # variant name -> loaded library
_lib_errors: dict[str, str] = {}  # variant name -> why it could not be built or loaded
_lock = threading.Lock()


def kernel_cache_dir() -> Path:
    return settings.get("KVGRAFT_KERNEL_CACHE")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def runnable() -> list[str]:
    """The variants this CPU has the instructions for, best first (they may still fail to build)."""
    flags = _cpu_flags()
    return [v.name for v in VARIANTS if all(f in flags for f in v.cpu_flags)]


def variant(isa: str | None = None) -> str:
    """The variant products run on: `isa`, else KVGRAFT_ISA, else the best this CPU has that builds.
    A named variant the CPU cannot run is an error (InvalidSetting), never a silent fallback."""
    isa = isa or settings.get("KVGRAFT_ISA")
    if isa is not None:
        if isa not in BY_NAME:
            raise ValueError(f"no fma16 variant {isa!r}: one of {', '.join(BY_NAME)}")
        if isa not in runnable():
            v, flags = BY_NAME[isa], _cpu_flags()
            has = [f for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c") if f in flags]
            raise InvalidSetting(
                f"KVGRAFT_ISA={isa} needs a CPU with {v.needs}; this one has {', '.join(has) or 'none of them'} "
                f"(unset KVGRAFT_ISA to use the best it has: {runnable()[0]})"
            )
        return isa
    names = runnable()
    for name in names:  # all compute the same bits: a variant that does not build gives way to the next
        if lib(name) is not None:
            return name
    return names[0]


def why_not(choice: str | None = None) -> str:
    """ "" where fma16 can run in this process, else the reason it cannot (or is switched off). `choice`
    ("fma16" or "torch") stands in for KVGRAFT_LINEAR, which is read when it is None. Raises
    InvalidSetting where KVGRAFT_ISA names a variant this CPU lacks."""
    try:
        choice = settings.get("KVGRAFT_LINEAR", {"KVGRAFT_LINEAR": choice} if choice is not None else None)
    except InvalidSetting as e:
        return str(e)
    if choice == "torch":
        return "KVGRAFT_LINEAR=torch"
    name = variant()
    lib(name)
    return _lib_errors.get(name, "")


def sources() -> list[Path]:
    """Every file the build reads (kernels.c and what it includes), in a fixed order."""
    return sorted(p for p in SOURCE_DIR.rglob("*") if p.suffix in (".c", ".h"))


def source_bytes() -> bytes:
    """The sources' names and bytes: a change to any file of c/ is a new build (the kernel cache's key)."""
    return b"".join(p.relative_to(SOURCE_DIR).as_posix().encode() + b"\0" + p.read_bytes() + b"\0" for p in sources())


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "gcc", "cc"):
        if name and shutil.which(name):
            return name
    return None


def _build(v: Variant) -> Path:
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (gcc or cc) to build the kernels (kernels/c/kernels.c)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    flags = (*FLAGS, *v.flags)
    key = hashlib.sha256(source_bytes() + "\0".join((cc, version, *flags)).encode()).hexdigest()[:16]
    out = kernel_cache_dir() / f"fma16-{v.name}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        so = Path(tmp) / out.name
        cmd = [cc, *flags, str(SOURCE), "-o", str(so), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"{cc} could not build kernels/c/kernels.c ({v.name}): {done.stderr.strip()[-500:]}")
        os.replace(so, out)  # atomic: a concurrent build of the same source writes the same file
    return out


def lib(isa: str | None = None):
    """The built library of a variant (default: `variant()`), or None (the reason in `why_not()`)."""
    name = isa or variant()
    with _lock:
        if name not in _libs and name not in _lib_errors:
            try:
                handle = ctypes.CDLL(str(_build(BY_NAME[name])))
            except (OSError, subprocess.SubprocessError) as e:
                _lib_errors[name] = str(e)
                log.warning("fma16 (%s) unavailable: %s", name, e)
                return None
            handle.kv_isa.restype = ctypes.c_char_p
            assert handle.kv_isa().decode() == name, f"the {name} build of the kernels says it is {handle.kv_isa()!r}"
            i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
            handle.kv_linear.argtypes = [ptr, i64, i64, i64, ptr, c_int, i64, ptr, i64, c_int]
            handle.kv_linear_ref.argtypes = [ptr, i64, i64, i64, ptr, c_int, i64, ptr, i64]
            handle.kv_dequant.argtypes = [ptr, c_int, i64, i64, ptr, c_int]
            handle.kv_row_bytes.argtypes = [c_int, i64]
            handle.kv_row_bytes.restype = i64
            _declare_rest(handle)
            _libs[name] = handle
        return _libs.get(name)


def _declare_rest(handle) -> None:
    """The argument types of the entry points for the rest of a forward (kernels.ops, graft_core.numerics)."""
    i64, ptr, c_int, c_float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    handle.kv_attention.argtypes = [
        ptr,
        i64,
        i64,
        i64,
        i64,
        i64,
        ptr,
        i64,
        ptr,
        i64,
        i64,
        ptr,
        ptr,
        i64,
        c_float,
        ptr,
        i64,
        i64,
        c_int,
        c_int,
    ]
    handle.kv_rmsnorm.argtypes = [ptr, i64, i64, ptr, c_float, ptr, c_int]
    handle.kv_rmsnorm_mul.argtypes = [ptr, i64, i64, ptr, c_float, ptr, c_int]  # the Llama family's (no + 1)
    handle.kv_gelu_tanh.argtypes = [ptr, i64, ptr, c_int]
    handle.kv_silu.argtypes = [ptr, i64, ptr, c_int]
    handle.kv_layernorm.argtypes = [ptr, i64, i64, ptr, ptr, c_float, ptr, c_int]  # the retrieval embedder's
    handle.kv_gelu_erf.argtypes = [ptr, i64, ptr, c_int]
    handle.kv_rotary.argtypes = [ptr, i64, ptr, i64, c_float, ptr, ptr]
    for f in ("kv_expf", "kv_expf_neg_ref", "kv_gelu_one", "kv_gelu_ref", "kv_gelu_erf_one", "kv_silu_one", "kv_silu_ref"):
        getattr(handle, f).argtypes, getattr(handle, f).restype = [c_float], c_float


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

    def line(self) -> str:
        blocks = f", {self.over_blocks} over GGUF blocks" if self.over_blocks else ""
        refused = f", {self.blocks_refused} blocks refused (expanded to other bytes)" if self.blocks_refused else ""
        return (
            f"{VERSION} ({self.isa}): {self.products} products{blocks}{refused} "
            f"({self.shapes_checked} shapes checked against the C reference and row by row)"
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


def take_over(model, blocks: dict[str, tuple[torch.Tensor, int]] | None = None, isa: str | None = None) -> Taken:
    """Route every float32 CPU linear layer of `model` through fma16 (module doc) on variant `isa` (default
    `variant()`). `blocks` maps parameter names to (uint8 rows, format); each is used only where it expands to
    that parameter's bytes, or where the parameter has no bytes (the meta device: the caller proves the
    blocks, as graft_core.packaged does). Raises RuntimeError if a check fails (nothing is taken over then)."""
    isa = variant(isa)
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
    with torch.inference_mode():
        for _, m in model.named_modules():
            if not (_f32_cpu_linear(m) or (isinstance(m, torch.nn.Linear) and id(m.weight) in by_param)):
                continue
            found = by_param.get(id(m.weight))
            op = Fma16Linear(m, *found, isa=isa) if found else Fma16Linear(m, isa=isa)
            key = (op.n, op.k, op.fmt)
            if key not in checked:
                checked[key] = check_shape(op)
            if checked[key]:
                raise RuntimeError(f"fma16 {checked[key]} for {op.n}x{op.k} (format {op.fmt}) on this machine")
            ops.append((m, op))
    for m, op in ops:
        m.forward = op
    return Taken(len(ops), sum(op.blocks is not None for _, op in ops), refused, len(checked), isa)


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
