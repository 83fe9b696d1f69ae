"""Compatibility re-export: the error hierarchy lives in the top-level, dependency-free `errors.py`.

Kept so `from graft_core.errors import ...` (and `from .errors import ...` inside the engine) keeps working.
"""

from errors import (
    ArtifactNotFound,
    IncompatibleArtifact,
    InputTooLong,
    IntegrityError,
    InvalidInput,
    KvgraftError,
    VerificationFailed,
)

__all__ = [
    "ArtifactNotFound",
    "IncompatibleArtifact",
    "InputTooLong",
    "IntegrityError",
    "InvalidInput",
    "KvgraftError",
    "VerificationFailed",
]
