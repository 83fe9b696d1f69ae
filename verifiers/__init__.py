"""Judging answers: `judge(answer, verifier, reference, question)` is THE judge, the one function that decides
every verdict on an answer (its rules at the top of verifiers/judging.py).

Modules: `judging` (the judge and its rules), `solutions` (a worked solution's steps and final answer, checked
by the gate before any prefill), `verdict` (the item, the verdict, the interface), `judges` (the kinds: each
compares one value with its reference, `compare`; `check` is a kind's own verdict on an item, for the kinds' tests and
nothing else), `claims` with `sentences` and `quantities` (what an answer sentence asserts), `symbolic` (the
sympy kind's allow-list and its worker), `sympy_worker` (the child process). No torch, no store.
"""

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
from verifiers.judging import JUDGE, KINDS, answer_line, judge
from verifiers.solutions import check_solution
from verifiers.symbolic import SympyVerifier
from verifiers.verdict import FIELD_BOUNDS, Claim, Verdict, VerifiedItem, Verifier

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
    "JUDGE",
    "KINDS",
    "answer_line",
    "check",
    "check_solution",
    "item_sha256",
    "judge",
    "normalise_text",
    "validate",
]
