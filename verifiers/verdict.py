"""What every verifier returns and reads: the verified item, the verdict, the verifier interface, and the
bounds and quoting of the text fields. Dependency-free beside `errors`."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from errors import InvalidInput

FIELD_BOUNDS = MappingProxyType({"question": 4_000, "solution": 16_000, "answer": 1_000, "reference": 1_000})


@dataclass(frozen=True)
class VerifiedItem:
    question: str
    solution: str
    answer: str
    verifier: str
    reference: str


@dataclass(frozen=True)
class Verdict:
    """A verdict: accepted or not, by which kind, why; `value` is what the answer was read to assert (the text
    the kind was given), None when it asserts nothing."""

    ok: bool
    verifier: str
    detail: str
    value: str | None = None


@dataclass(frozen=True)
class Claim:
    """What an answer asserts: `value` is the text the kind's verifier is given, or None with `why` it
    asserts nothing the verifier can judge."""

    value: str | None
    why: str


class Verifier(Protocol):
    """A kind: `compare` sets one value (the text the judge read from an answer) beside its reference. It reads
    no answer; `verifiers.judge` does, and decides every verdict."""

    name: str

    def compare(self, answer: str, reference: str) -> Verdict: ...


def _q(text: str, limit: int = 80) -> str:
    """Quote text for a message: single quotes, newlines escaped, long text cut with an ellipsis."""
    text = text.replace("\n", "\\n")
    return "'" + (text if len(text) <= limit else text[: limit - 1] + "…") + "'"


def _require_text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInput(f"{field} is empty; give a non-empty {field}")
    bound = FIELD_BOUNDS.get(field)
    if bound is not None and len(value) > bound:
        raise InvalidInput(f"{field} is {len(value):,} characters; the bound for {field} is {bound:,} characters, shorten it")
    return value


# --- exact ------------------------------------------------------------------------------------
