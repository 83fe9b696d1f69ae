"""Pins the deterministic configuration and returns it as a record.

The record is part of every artifact's fingerprint: two artifacts made under different records are
never grafted into each other's sessions. This module sets process-wide torch state and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

import torch
import transformers

ATTN_IMPLEMENTATION = "sdpa"


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

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of this record."""
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


def pin(device: str = "cpu", dtype: torch.dtype = torch.float32) -> DeterminismConfig:
    """Set the process to the deterministic configuration and return its record."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    return DeterminismConfig(
        dtype=str(dtype).removeprefix("torch."),
        device=torch.device(device).type,
        attn_implementation=ATTN_IMPLEMENTATION,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cublas_workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG", "") if device.startswith("cuda") else "",
    )
