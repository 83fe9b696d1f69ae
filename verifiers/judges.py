"""The answer verifiers: whether a verified item's answer matches its reference.

It owns the four verifier kinds (exact, numeric, sympy from `symbolic`, attested) and the item's canonical
hash. Each kind compares one value with its reference; reading that value out of a sentence is `claims`. It knows nothing about models, storage or who is calling: services enforce that only an admin may use
`attested`, and the deposit gate turns a refused `Verdict` into `VerificationFailed`.

A malformed reference or item raises `InvalidInput`; an answer that cannot be read as its kind
(not a number, not a safe expression) is a refused `Verdict` that says why.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import asdict
from fractions import Fraction
from types import MappingProxyType

from errors import InvalidInput
from verifiers.symbolic import SympyVerifier
from verifiers.verdict import Verdict, VerifiedItem, Verifier, _q, _require_text

_EDGE_PUNCTUATION = ".,;:!?\"'`()[]{}«»‘’‚“”„‹›"


def normalise_text(text: str) -> str:
    """NFKC, casefold, collapse whitespace, strip surrounding punctuation (a trailing period included)."""
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    while text and (text[0] in _EDGE_PUNCTUATION or text[-1] in _EDGE_PUNCTUATION):
        text = text.strip(_EDGE_PUNCTUATION).strip()
    return text


class ExactVerifier:
    """Equal after `normalise_text`: 'Osric Pellamy.' matches 'osric  pellamy'."""

    name = "exact"

    def compare(self, answer: str, reference: str) -> Verdict:
        a, r = normalise_text(_require_text("answer", answer)), normalise_text(_require_text("reference", reference))
        if not r:
            raise InvalidInput(f"reference {_q(reference)} is only punctuation; give the expected text")
        if a == r:
            return Verdict(True, self.name, f"answer {_q(answer)} equals reference {_q(reference)} (exact, normalised)")
        return Verdict(
            False,
            self.name,
            f"answer {_q(answer)} does not equal reference {_q(reference)} (exact, normalised {_q(a)} vs {_q(r)})",
        )


# --- numeric ----------------------------------------------------------------------------------

_DECIMAL = r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,4})?"
_RATIO = r"[+-]?\d+\s*/\s*\d+"
_NUMBER_RE = re.compile(rf"(?P<num>{_RATIO}|{_DECIMAL})(?:\s*(?P<unit>%|[^\W\d_]+))?")
_TOLERANCE_SPLIT = re.compile(r"\s*(?:±|\+/-|\+-)\s*")


def _parse_number(text: str) -> tuple[Fraction, str | None]:
    """'1,234.5 km' -> (Fraction(2469, 2), 'km'); raises ValueError when the text is not one number."""
    text = unicodedata.normalize("NFKC", text).strip().replace("\u2212", "-")
    match = _NUMBER_RE.fullmatch(text)
    if match is None:
        raise ValueError("is not a number")
    num = match["num"].replace(",", "").replace(" ", "")
    try:
        value = Fraction(num)
    except ZeroDivisionError:
        raise ValueError("has a zero denominator") from None
    unit = match["unit"]
    return value, (unit.casefold() if unit else None)


class NumericVerifier:
    """One number each: '1,234.5', '-3', '3/4', '2.5e3', optionally followed by one unit word ('42 km', '50%').

    Equal within `rel_tol` (default 1e-9, relative to the larger magnitude) or within the absolute
    tolerance a reference states as '42 ± 0.01' / '42 +- 0.01'. An answer's unit must be the
    reference's; a bare number is accepted against a reference with a unit.
    """

    name = "numeric"

    def __init__(self, rel_tol: float = 1e-9):
        self.rel_tol = rel_tol

    def _reference(self, reference: str) -> tuple[Fraction, str | None, Fraction | None, str]:
        """Returns (value, unit, absolute tolerance or None, tolerance description)."""
        main, *rest = _TOLERANCE_SPLIT.split(reference.strip(), maxsplit=1)
        try:
            value, unit = _parse_number(main)
            tol = None
            if rest:
                tol, tol_unit = _parse_number(rest[0])
                unit = unit or tol_unit  # '42 ± 1 km' means 42 km ± 1 km
                if tol < 0 or (tol_unit is not None and tol_unit != unit):
                    raise ValueError("bad tolerance")
        except ValueError:
            raise InvalidInput(
                f"reference {_q(reference)} is not a number; write e.g. '42', '-3', '3/4', '1,234.5', '2.5e3', '42 km' or '42 ± 0.01'"
            ) from None
        how = f"abs tol {rest[0].strip()}" if tol is not None else f"rel tol {self.rel_tol!r}"
        return value, unit, tol, how

    def compare(self, answer: str, reference: str) -> Verdict:
        _require_text("answer", answer)
        r, r_unit, abs_tol, how = self._reference(_require_text("reference", reference))
        try:
            a, a_unit = _parse_number(answer)
        except ValueError as e:
            return Verdict(False, self.name, f"answer {_q(answer)} {e} (numeric)")
        if a_unit is not None and a_unit != r_unit:
            theirs = f"unit {_q(r_unit)}" if r_unit else "none"
            return Verdict(
                False,
                self.name,
                f"answer {_q(answer)} has unit {_q(a_unit)} but reference {_q(reference)} has {theirs} (numeric)",
            )
        diff = abs(a - r)
        ok = diff <= abs_tol if abs_tol is not None else diff <= Fraction(self.rel_tol) * max(abs(a), abs(r))
        verb = "matches" if ok else "does not equal"
        return Verdict(ok, self.name, f"answer {_q(answer)} {verb} reference {_q(reference)} (numeric, {how})")


# --- attested ---------------------------------------------------------------------------------

_NAME_RE = re.compile(r"[^\W\d_][\w .,'’-]{0,199}")


class AttestedVerifier:
    """A named person vouches for the answer (or, with an empty answer, for a text); the reference is their name.

    Services allow it to admins only."""

    name = "attested"

    def compare(self, answer: str, reference: str) -> Verdict:
        if answer != "":  # the answer may be empty: attesting free text vouches for the text itself
            _require_text("answer", answer)
        person = " ".join(_require_text("reference", reference).split())
        if not _NAME_RE.fullmatch(person):
            raise InvalidInput(
                f"reference {_q(reference)} is not a name; for attested give the name of the person who vouches, e.g. 'Dr. A. Rivera'"
            )
        return Verdict(True, self.name, f"attested by {person}")


VERIFIERS: MappingProxyType[str, Verifier] = MappingProxyType(
    {v.name: v for v in (ExactVerifier(), NumericVerifier(), SympyVerifier(), AttestedVerifier())}
)


def validate(item: VerifiedItem) -> Verifier:
    """Every field of the item bounded and non-empty, and its verifier's kind; raises InvalidInput."""
    if not isinstance(item, VerifiedItem):
        raise InvalidInput(f"item must be a VerifiedItem, got {type(item).__name__}")
    for field in ("question", "solution", "answer", "verifier", "reference"):
        _require_text(field, getattr(item, field))
    verifier = VERIFIERS.get(item.verifier)
    if verifier is None:
        raise InvalidInput(f"unknown verifier {_q(item.verifier)}; valid kinds are: {', '.join(sorted(VERIFIERS))}")
    return verifier


def check(item: VerifiedItem) -> Verdict:
    """Validates every field, then asks the item's verifier whether its answer matches its reference."""
    return validate(item).compare(item.answer, item.reference)


def item_sha256(item: VerifiedItem) -> str:
    """SHA-256 of the canonical JSON of the item: keys sorted, no spaces, UTF-8, no ASCII escaping."""
    if not isinstance(item, VerifiedItem):
        raise InvalidInput(f"item must be a VerifiedItem, got {type(item).__name__}")
    canonical = json.dumps(asdict(item), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
