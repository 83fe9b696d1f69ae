"""Judges of answers: whether an answer matches its reference (exact, numeric, sympy, attested).

Modules: `verdict` (the item, the verdict, the interface), `judges` (the kinds and `check`), `symbolic` (the
sympy verifier's allow-list and its worker pool), `sympy_worker` (the child process). No torch, no store.
"""

from verifiers.judges import VERIFIERS, AttestedVerifier, ExactVerifier, NumericVerifier, check, item_sha256, normalise_text
from verifiers.symbolic import SympyVerifier
from verifiers.verdict import FIELD_BOUNDS, Verdict, VerifiedItem, Verifier

__all__ = [
    "FIELD_BOUNDS",
    "VERIFIERS",
    "AttestedVerifier",
    "ExactVerifier",
    "NumericVerifier",
    "SympyVerifier",
    "Verdict",
    "VerifiedItem",
    "Verifier",
    "check",
    "item_sha256",
    "normalise_text",
]
