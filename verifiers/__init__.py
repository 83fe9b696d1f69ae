"""Judges of answers: whether an answer matches its reference (exact, numeric, sympy, attested).

Modules: `verdict` (the item, the verdict, the interface), `judges` (the kinds and `check`), `claims` (what an
answer sentence asserts, read for a kind: the deposit gate's judge), `symbolic` (the sympy verifier's allow-list
and its worker pool), `sympy_worker` (the child process). No torch, no store.
"""

from verifiers.claims import judge as judge_claim
from verifiers.claims import read as read_claim
from verifiers.judges import (
    VERIFIERS,
    AttestedVerifier,
    ExactVerifier,
    NumericVerifier,
    check,
    item_sha256,
    normalise_text,
    validate,
)
from verifiers.symbolic import SympyVerifier
from verifiers.verdict import FIELD_BOUNDS, Claim, Verdict, VerifiedItem, Verifier

judge = judge_claim  # TEMPORARY (issue 40's contract): the one judge lands on branch `judge`; dropped at that merge

__all__ = [
    "FIELD_BOUNDS",
    "VERIFIERS",
    "AttestedVerifier",
    "Claim",
    "ExactVerifier",
    "NumericVerifier",
    "SympyVerifier",
    "Verdict",
    "VerifiedItem",
    "Verifier",
    "check",
    "item_sha256",
    "judge",
    "judge_claim",
    "normalise_text",
    "read_claim",
    "validate",
]
