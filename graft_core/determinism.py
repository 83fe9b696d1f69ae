"""Pins the deterministic configuration and returns it as a record.

The record is part of every artifact's fingerprint: two artifacts made under different records are
never grafted into each other's sessions. Under a numerical definition that fixes every operation of the
forward (graft_core.numerics, kvgraft-f32-v2) it names that definition and nothing about the machine.
Under torch's kernels it includes the CPU kernel path (ATen's capability, the CPU vendor and widest
vector ISA that MKL dispatches on, the BLAS build and MKL's reproducibility setting, oneDNN on/off, the
intra-op thread count), because those change the bits of float32 results (docs/DETERMINISM.md).
One more input decides bits and is fixed rather than recorded: where each weight sits in memory
(`place_weights`).
This module sets process-wide torch state and reads the machine; nothing else.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass

import torch
import transformers

import settings

ATTN_IMPLEMENTATION = "sdpa"
DEFAULT_THREADS = 2  # pinned, not "all cores": the thread count changes the bits of short forwards


def pinned_threads() -> int:
    """The intra-op thread count every kvgraft process computes with: KVGRAFT_THREADS, default 2.

    Pinned so that a 2-core laptop and a 16-core server compute the same bits (measured: 1 vs 2
    threads changed a 3-token probe row); a process that wants another count sets the variable
    before the model loads and gets another fingerprint."""
    return settings.get("KVGRAFT_THREADS", default=DEFAULT_THREADS)


@dataclass(frozen=True)
class DeterminismConfig:
    """Everything besides the weights and tokens that decides the bytes of a KV state."""

    dtype: str
    device: str
    attn_implementation: str
    torch_version: str
    transformers_version: str
    deterministic_algorithms: bool
    batch_size: int = 1
    decoding: str = "greedy"
    cublas_workspace: str = ""
    numerics: tuple[tuple[str, str], ...] = ()  # the kernel path, see kernel_path()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["numerics"] = dict(self.numerics)
        return d

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of this record."""
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


def _cpu_vendor_and_isa() -> tuple[str, str]:
    """("GenuineIntel" | "AuthenticAMD" | ..., widest vector ISA: "avx512" | "avx2" | "none") from /proc/cpuinfo."""
    vendor, flags = platform.machine() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "none"
    return vendor, isa


def _blas() -> str:
    """The BLAS torch was built with, and MKL's version where it is MKL."""
    if torch.backends.mkl.is_available():
        try:
            lib = ctypes.CDLL(torch._C.__file__)  # MKL is linked into libtorch_cpu, loaded by torch._C
            buf = ctypes.create_string_buffer(256)
            lib.MKL_Get_Version_String(buf, len(buf))
            return buf.value.decode(errors="replace").strip()
        except (OSError, AttributeError):
            return "mkl"
    return torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0] if "BLAS_INFO=" in torch.__config__.show() else "unknown"


def kernel_path(device: str = "cpu") -> tuple[tuple[str, str], ...]:
    """What decides which CPU kernels compute the float32 numbers, as sorted (name, value) pairs.

    Two processes whose kernel paths differ may compute different bits from the same inputs; the
    path is therefore part of the determinism record (and so of the model fingerprint)."""
    if not device.startswith("cpu"):
        return (("device_name", torch.cuda.get_device_name(0) if torch.cuda.is_available() else device),)
    vendor, isa = _cpu_vendor_and_isa()
    path = {
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_vendor": vendor,
        "cpu_isa": isa,
        "blas": _blas(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", ""),
        "mkldnn": str(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        # measured: 1 vs 2 threads gave equal KV and 14-token logits but a different 3-token probe row
        "threads": str(torch.get_num_threads()),  # pinned by pin() (KVGRAFT_THREADS, default 2)
    }
    return tuple(sorted(path.items()))


# Every weight's first byte sits at an address = 56 (mod 64): see place_weights.
WEIGHT_PLACEMENT = (64, 56)


def place_weights(model: torch.nn.Module) -> int:
    """Put every parameter's data at an address = 56 (mod 64), copying those that sit elsewhere; returns
    how many moved. Values are untouched and tied parameters stay tied.

    MKL's one-row float32 products (every answer's vocabulary projection, every decode step) compute
    different bits for the same weight at a different address mod 16: measured on this AMD EPYC, 4
    distinct results for the 4 float32 alignments, the same result for addresses 64 bytes apart
    (`python -m bench.kernels` records it under `bits`). The fingerprint hashes the weights' values,
    not where the loader put them, so without this two processes with equal fingerprints could
    disagree (a safetensors file written with another header length, a loader that copies instead
    of mapping) and a good artifact would fail its probe. 56 is where the packaged model's file puts
    every tensor when mapped, so for it nothing moves and the artifacts made before stay valid."""
    mod, rem = WEIGHT_PLACEMENT
    moved = 0
    for p in model.parameters():  # a tied Parameter is one object: listed once, moved once for both users
        if p.device.type != "cpu" or p.data_ptr() % mod == rem:
            continue
        p.data = copy_at(p.data, rem, mod)
        moved += 1
    return moved


def copy_at(t: torch.Tensor, rem: int, mod: int = 64) -> torch.Tensor:
    """A contiguous CPU copy of `t` whose first byte sits at an address = `rem` (mod `mod`)."""
    nbytes = t.numel() * t.element_size()
    raw = torch.empty(nbytes + mod, dtype=torch.uint8)
    off = (rem - raw.data_ptr()) % mod
    placed = raw[off : off + nbytes].view(t.dtype).view(t.shape)
    placed.copy_(t)
    return placed


def pin(
    device: str = "cpu", dtype: torch.dtype = torch.float32, definition: str = "", attn_implementation: str = ATTN_IMPLEMENTATION
) -> DeterminismConfig:
    """Set the process to the deterministic configuration and return its record.

    `definition` names a numerical definition that fixes every operation of the forward (graft_core.numerics:
    products, attention, softmax, norms, activations, rotary tables): its record is that name and nothing
    about the machine, because no CPU vendor, ISA, BLAS build, ATen capability or thread count changes its
    bits. Without one (torch's kernels) the record is the kernel path those choose (`kernel_path`)."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    if not device.startswith("cuda"):
        torch.set_num_threads(pinned_threads())
    return DeterminismConfig(
        dtype=str(dtype).removeprefix("torch."),
        device=torch.device(device).type,
        attn_implementation=attn_implementation,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cublas_workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG", "") if device.startswith("cuda") else "",
        numerics=(("numerics", definition),) if definition else kernel_path(device),
    )
