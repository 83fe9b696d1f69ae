"""The kernels' build and their library handle: one C source (c/kernels.c and what it includes), built once per
instruction-set variant into the kernel cache (KVGRAFT_KERNEL_CACHE, default ~/.cache/kvgraft/kernels), loaded with
ctypes and every entry point's argument types declared. Three builds compute the same bits (VARIANTS): `avx512`
(AVX-512 F/BW/VL/DQ, FMA, F16C), `avx2` (AVX2, FMA, F16C: the 16 lanes in two 8-lane registers) and `portable`
(plain C with fmaf, any CPU); the best this CPU has is used unless KVGRAFT_ISA names one.

It knows which files make a build and how to load one, nothing about what the entry points compute: the products
are fma16.py's, the rest of a forward ops.py's and graft_core.numerics'. A build that fails is remembered with its
reason (`failure`), never retried in the same process.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import settings
from errors import InvalidSetting

log = logging.getLogger("kvgraft.kernels")

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


@functools.cache
def cpu_identity() -> str:
    """This CPU as /proc/cpuinfo names it (vendor, family, model, stepping, model name, microcode) with its flags:
    part of the key under which a kernel's load-time check is remembered (fma16.take_over)."""
    keys = ("vendor_id", "cpu family", "model", "stepping", "model name", "microcode")
    seen: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in keys and key.strip() not in seen:
                    seen[key.strip()] = value.strip()
                if not line.strip() and seen:  # the first processor's entry is enough
                    break
    except OSError:
        pass
    return "|".join(f"{k}={seen.get(k, '')}" for k in keys) + "|flags=" + " ".join(sorted(_cpu_flags()))


def library_file(isa: str | None = None) -> Path | None:
    """The built library file of a variant (its name holds the build key: the sources, compiler and flags), or None."""
    handle = lib(isa)
    return Path(handle._name) if handle is not None else None


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
                log.warning("the kernels (%s) are unavailable: %s", name, e)
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
    """The argument types of the entry points for the rest of a forward (kernels.ops, graft_core.numerics, step)."""
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


def failure(name: str) -> str:
    """Why variant `name` could not be built or loaded in this process ("" when it was, or was not tried)."""
    return _lib_errors.get(name, "")
