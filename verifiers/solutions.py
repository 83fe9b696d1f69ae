"""A worked solution checked, not only the model's copy of it: `check_solution(solution, verifier, reference,
question)` verifies the solution's own steps and its final answer before the deposit gate runs the model.

A solution is worked when it has more than one line, a `<<a op b=c>>` calculator annotation or a `####` line;
a one-line fact has no steps and is left to the gate's runs. Its steps, in the order written:
- each calculator annotation `<<48/2=24>>`: its left side must equal its right side;
- each chain of numbers `a = b = c` on one line (annotations removed; `chains`, read by the claim reader's
  arithmetic: units inside a chain are units, expressions in letters such as '3b + 6 = 2(b + 6)' are algebra
  and not checked): each member must equal the next; a step that converts a unit ('442/170 hours = 156 minutes') and a part of a larger
  expression ('20% of 935 = 187') are not checked. A member written after '≈', or a one-decimal member
  ('193.5'), stands for its rounding: it holds within half a unit of its last written place.
Each comparison is the sympy kind's (simplify(left - right) == 0, in its bounded, allow-listed worker); a
member sympy cannot read (a word, a symbol) is not checked. The final answer is the one judge's reading of the
whole solution (its `####` line, "The answer is", else its last line) and must be accepted against the
reference. The first false step refuses the solution, named by its number and text; a solution with more than
MAX_STEPS steps is refused before any is checked (each is a call to the sympy worker).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from fractions import Fraction

from errors import InvalidInput
from verifiers.judging import judge
from verifiers.quantities import _CANONICAL, _CURRENCY, _OPS, _math_runs, _member, _members, _tight_fraction, _unit_at
from verifiers.sentences import Tok, text_of, tokens
from verifiers.symbolic import SympyVerifier
from verifiers.verdict import Verdict, _q


@dataclass(frozen=True)
class Member:
    """One member of an equation chain: as written, as the sympy kind reads it, its exact value (None when the
    reader cannot evaluate it: a letter, a word), the sign before it ('', '=', '≈') and its rounding."""

    text: str
    sympy: str
    value: Fraction | None
    sign: str
    rounding: Fraction
    unit: str | None = None  # the unit written inside the chain after it, or after the last member


def same_unit(a: str | None, b: str | None) -> bool:
    """Do two units name the same one ('hours', 'h')? A missing unit is anyone's."""
    return a is None or b is None or _CANONICAL.get(a, a) == _CANONICAL.get(b, b)


def chains(text: str) -> list[tuple[str, int, tuple[Member, ...]]]:
    """Every chain of two or more members in `text` ('215 × 90/100 = 193.5'), with where it starts (characters)."""
    toks = tokens(unicodedata.normalize("NFKC", text).replace("\u2212", "-"))
    out = []
    for a, b, _ in _math_runs(toks):
        before = toks[a - 1] if a > 0 else None
        after = toks[b] if b < len(toks) else None
        binary_minus = toks[a].text == "-" and before is not None and before.kind in ("word", "num")
        if (
            binary_minus
            or (before is not None and (before.text in _OPS or _letter(before) or before.low in ("of", "times")))
            or (after is not None and (after.text in _OPS | {"("} or _letter(after)))
        ):
            continue  # part of an expression in letters ('3b + 6 = 2(b + 6)'): not a chain of numbers
        members = []
        for s, e, sign in _members(toks, a, b):
            s, e, value, sign, tol = _member(toks, s, e, sign)
            v = e
            while v - 1 > s and toks[v - 1].kind == "word" and toks[v - 1].low != "x":
                v -= 1
            unit = toks[v].low if v < e else (toks[e].text if e < b and toks[e].text == "%" else None)
            members.append(Member(text_of(toks, s, e), _sympy_text(toks[s:v]), value, sign, tol, unit))
        if members and members[-1].unit is None:
            unit, _ = _unit_at(toks, b)
            members[-1] = replace(members[-1], unit=unit)
        members = [replace(m, sympy=f"({m.sympy})/100") if m.unit == "%" else m for m in members]  # '50%' is 1/2
        if len(members) >= 2:
            out.append((text_of(toks, a, b), toks[a].start, tuple(members)))
    return out


def _letter(t: Tok) -> bool:
    """A one-letter variable ('b' in '3b'), not the 'x' of '4 x 5' nor a word."""
    return t.kind == "word" and len(t.text) == 1 and t.low not in ("x", "a", "i")


def _sympy_text(member: list[Tok]) -> str:
    """The member in the sympy kind's syntax: × ÷ · x as * /, '%' as /100, currency and thousands commas
    dropped, juxtaposed factors ('2(6)', '(8-1)2') multiplied, a tight fraction ('361/2277') in parentheses."""
    out: list[str] = []
    k = 0
    while k < len(member):
        t = member[k]
        k += 1
        if t.text in _CURRENCY:
            continue
        if _tight_fraction(member, k - 1):
            text, k = f"({t.text}/{member[k + 1].text})", k + 2
        else:
            text = {"×": "*", "·": "*", "÷": "/", "%": "/100"}.get(t.text, "*" if t.low == "x" else t.text.replace(",", ""))
        if out and (
            (text[:1] == "(" and (out[-1][-1:].isdigit() or out[-1][-1:] == ")")) or (out[-1][-1:] == ")" and text[:1].isdigit())
        ):
            out.append("*")
        out.append(text)
    return "".join(out)


MAX_STEPS = 100
_ANNOTATION = re.compile(r"<<([^<>=\n]{1,200})=([^<>=\n]{1,200})>>")
_SYMPY = SympyVerifier()


def worked(solution: str) -> bool:
    lines = [x for x in solution.splitlines() if x.strip()]
    return len(lines) > 1 or "<<" in solution or "####" in solution


def _steps(solution: str) -> list[tuple[int, str, Member, Member]]:
    """(position, the step as written, left, right) for every comparison the solution's steps make."""
    text = unicodedata.normalize("NFKC", solution)
    steps = []
    for m in _ANNOTATION.finditer(text):
        pair = chains(f"{m[1]} = {m[2]}")
        if pair and len(pair[0][2]) == 2:
            steps.append((m.start(), m.group(), *pair[0][2]))
    plain = _ANNOTATION.sub(lambda m: " " * len(m.group()), text)  # keep the positions of what remains
    start = 0
    for line in plain.splitlines(keepends=True):  # a chain never runs from one line into the next
        for chain, at, members in chains(line):
            steps.extend((start + at, chain, left, right) for left, right in zip(members, members[1:], strict=False))
        start += len(line)
    return sorted(steps, key=lambda s: s[0])


def _holds(left: Member, right: Member) -> bool | None:
    """Does left equal right (sympy), or right round left? None when sympy cannot read one of them or the
    step converts a unit ('442/170 hours = 156 minutes')."""
    if not same_unit(left.unit, right.unit):
        return None
    try:
        v = _SYMPY.compare(left.sympy, right.sympy)
    except InvalidInput:
        return None
    if v.ok:
        return True
    if "is not a safe expression" in v.detail:
        return None
    rounding = right.rounding if right.sign == "≈" or right.rounding else left.rounding
    if left.value is not None and right.value is not None and rounding:
        return abs(left.value - right.value) <= rounding
    return False


def _shown(m: Member) -> str:
    v = m.value
    if v is None:
        return "something else"
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator} ({float(v):.6g})"


def check_solution(solution: str, verifier: str, reference: str, question: str = "") -> Verdict:
    """The solution's steps and final answer (the module's rules): accepted, or refused with why."""
    if not worked(solution):
        return Verdict(True, verifier, "a one-line solution: no steps to check")
    steps = _steps(solution)
    if len(steps) > MAX_STEPS:  # each step is a sympy comparison: the cost of a deposit stays bounded
        return Verdict(False, verifier, f"the solution has {len(steps)} steps; the gate checks at most {MAX_STEPS}, shorten it")
    checked = 0
    for n, (_, step, left, right) in enumerate(steps, 1):
        ok = _holds(left, right)
        if ok is False:
            return Verdict(
                False,
                verifier,
                f"step {n} of the solution is false: {_q(step)}: {_q(left.text)} is {_shown(left)}, not {_q(right.text)}",
            )
        checked += ok is True
    final = judge(solution, verifier, reference, question)
    if not final.ok:
        return Verdict(False, verifier, f"the solution's final answer is not the reference: {final.detail}")
    return Verdict(
        True, verifier, f"{checked} of the solution's {len(steps)} steps checked (sympy), all hold; {final.detail}", final.value
    )
