"""Numbers in an answer sentence: numerals and number words, units and their spellings, arithmetic chains and
their working, and the claim a numeric or sympy answer makes (the rules are stated in verifiers/claims.py).
Exact arithmetic on fractions; no sympy here (the sympy verifier compares what this reads)."""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from verifiers.judges import NumericVerifier
from verifiers.sentences import (
    APPROXIMATORS,
    DATE_PREPOSITIONS,
    FUNCTION,
    HEDGES,
    SMALL,
    Mention,
    Tok,
    clause,
    denied,
    number_word,
    numeral,
    problem,
    sentence,
    text_of,
    tokens,
)
from verifiers.verdict import Claim, _q

_UNIT_ALIASES = {
    "m": ("m", "metre", "metres", "meter", "meters"),
    "km": ("km", "kilometre", "kilometres", "kilometer", "kilometers"),
    "cm": ("cm", "centimetre", "centimetres", "centimeter", "centimeters"),
    "mm": ("mm", "millimetre", "millimetres", "millimeter", "millimeters"),
    "kg": ("kg", "kilogram", "kilograms", "kilo", "kilos"),
    "g": ("g", "gram", "grams"),
    "l": ("l", "litre", "litres", "liter", "liters"),
    "s": ("s", "sec", "secs", "second", "seconds"),
    "min": ("min", "mins", "minute", "minutes"),
    "h": ("h", "hr", "hrs", "hour", "hours"),
    "day": ("day", "days"),
    "week": ("week", "weeks"),
    "month": ("month", "months"),
    "year": ("year", "years", "yr", "yrs"),
    "km/h": ("km/h", "kph", "kmh", "kilometres/hour", "kilometers/hour", "kilometres/h", "km/hour"),
    "mph": ("mph", "miles/hour"),
    "m/s": ("m/s", "metres/second", "meters/second"),
    "mile": ("mile", "miles", "mi"),
    "ft": ("ft", "foot", "feet"),
    "%": ("%", "percent", "per-cent"),
    "°c": ("°c", "℃", "celsius", "degrees", "degree", "°"),
    "$": ("$", "dollar", "dollars", "usd"),
}
_CANONICAL = {alias: canon for canon, aliases in _UNIT_ALIASES.items() for alias in aliases}
_CURRENCY = frozenset("$€£")
_OPS = {"+", "-", "×", "*", "/", "÷", "^", "·"}


def _unit_at(toks: list[Tok], k: int) -> tuple[str | None, int]:
    """The unit written at token k ('%', 'metres', 'km/h', 'km per hour', '°C'), and the token after it."""
    if k >= len(toks):
        return None, k
    t = toks[k]
    if t.text == "%":
        return "%", k + 1
    if t.text == "°":
        if k + 1 < len(toks) and toks[k + 1].low in ("c", "f"):
            return "°" + toks[k + 1].low, k + 2
        return "°", k + 1
    if t.kind != "word" or t.low in FUNCTION or t.low in APPROXIMATORS or t.low in HEDGES or t.low in SMALL:
        return None, k
    unit, end = t.low, k + 1
    if end + 1 < len(toks) and toks[end].text == "/" and toks[end + 1].kind == "word":
        unit, end = f"{unit}/{toks[end + 1].low}", end + 2
    elif end + 1 < len(toks) and toks[end].low == "per" and toks[end + 1].kind == "word":
        unit, end = f"{unit}/{toks[end + 1].low}", end + 2
    return unit, end


class _Expr:
    """A small recursive-descent reader of arithmetic over token values: + - × * · / ÷ ^ ( ), numbers and
    percentages ('20%' is 20/100). Returns None for anything else, so a member it cannot read is not checked."""

    def __init__(self, toks: list[Tok]):
        self.toks = [t for t in toks if t.text not in _CURRENCY]
        self.k = 0

    def value(self) -> Fraction | None:
        texts = [t.text for t in self.toks]
        if "%" in texts and ("+" in texts or "-" in texts):
            return None  # '160 + 20%' adds a share of 160 or 0.2: not read
        try:
            v = self._sum()
        except (ArithmeticError, ValueError, IndexError):
            return None
        return v if self.k == len(self.toks) else None

    def _peek(self) -> str:
        return self.toks[self.k].text if self.k < len(self.toks) else ""

    def _sum(self) -> Fraction:
        v = self._product()
        while self._peek() in ("+", "-"):
            op = self.toks[self.k].text
            self.k += 1
            w = self._product()
            v = v + w if op == "+" else v - w
        return v

    def _product(self) -> Fraction:
        v = self._power()
        while True:
            if self._peek() in ("×", "*", "·", "/", "÷") or self._peek().casefold() == "x":
                op = self.toks[self.k].text
                self.k += 1
                w = self._power()
                v = v / w if op in ("/", "÷") else v * w
            elif self._peek() == "(" or (self.toks[self.k - 1].text == ")" and self._peek()[:1].isdigit()):
                v = v * self._power()  # juxtaposed factors: '2(6)', '(8-1)2'
            else:
                return v

    def _power(self) -> Fraction:
        v = self._atom()
        if self._peek() == "^":
            self.k += 1
            e = self._atom()
            if e.denominator != 1 or abs(e) > 64:
                raise ValueError("exponent")
            v = v ** int(e)
        return v

    def _atom(self) -> Fraction:
        t = self.toks[self.k]
        if t.text == "-":
            self.k += 1
            return -self._atom()
        if t.text == "(":
            self.k += 1
            v = self._sum()
            if self._peek() != ")":
                raise ValueError("parenthesis")
            self.k += 1
            return v
        v = numeral(t)
        if v is None or t.kind != "num":
            raise ValueError("not a number")
        self.k += 1
        if _tight_fraction(self.toks, self.k - 1):  # '361/2277' written tight is one number: '1 ÷ 361/2277'
            v, self.k = v / numeral(self.toks[self.k + 1]), self.k + 2
        if self._peek() == "%":
            self.k += 1
            v = v / 100
        return v


def _rounding(member: list[Tok]) -> Fraction:
    """Half a unit in the last written place of a member that is one decimal ('22.53' -> 0.005), else 0."""
    nums = [t for t in member if t.kind == "num"]
    if len(nums) == 1 and "." in nums[0].text and all(t.kind == "num" or t.text in _CURRENCY for t in member):
        places = len(nums[0].text.split(".")[1])
        return Fraction(1, 2 * 10**places)
    return Fraction(0)


def _math_runs(toks: list[Tok]) -> list[tuple[int, int, str]]:
    """Maximal runs of arithmetic (numbers, operators, =, ≈, parentheses around numbers, currency, %), each with
    the operator or '=' it ends on when it stops before its last member ('(4x22) / 2 =': nothing after '=')."""
    runs, k = [], 0
    while k < len(toks):
        if toks[k].kind == "num" or (toks[k].text in _CURRENCY and k + 1 < len(toks) and toks[k + 1].kind == "num"):
            a = k
            while k < len(toks) and _mathy(toks, k):
                k += 1
            while a > 0 and toks[a - 1].text in ("(", "-"):
                a -= 1
            end, dangling = k, ""
            while end > a and toks[end - 1].text in _OPS | {"=", "≈", "(", "~"}:
                end -= 1
                dangling = dangling or (toks[end].text if toks[end].text in _OPS | {"=", "≈"} else "")
            runs.append((a, end, dangling))
        else:
            k += 1
    return runs


def _mathy(toks: list[Tok], k: int) -> bool:
    t = toks[k]
    if t.kind == "num" or t.text in _OPS | {"=", "≈", "%", ")"} or t.text in _CURRENCY:
        return True
    if t.kind == "word" and t.low not in FUNCTION and 0 < k < len(toks) - 1 and toks[k - 1].kind == "num":
        glued = len(t.text) == 1 and t.start == toks[k - 1].end  # '2b': a term, not a unit
        if toks[k + 1].text in ("=", "≈") and not glued:
            return True  # a unit inside a chain: '4 × 12 years = 48'
        if not glued and _unit_then_operand(toks, k):
            return True  # a unit before the next factor: '90 inches * 2 = 180 inches', '(180 inches / 360 inches)'
    if t.text == "(":
        return k + 1 < len(toks) and (toks[k + 1].kind == "num" or toks[k + 1].text in ("(", "-"))
    if t.low == "x":  # '14 x 1.6'
        return k > 0 and toks[k - 1].kind == "num" and k + 1 < len(toks) and toks[k + 1].kind == "num"
    return False


def _unit_then_operand(toks: list[Tok], k: int) -> bool:
    """After the unit word toks[k] (which follows a number): an operator and then a number or '(', or a ')' that
    closes the chain's group before an operator or '='."""
    nxt = toks[k + 1].text
    if nxt in _OPS and nxt != "-":  # '5 years - 2' reads either way; '-' joins words ('3 years-old')
        return k + 2 < len(toks) and (toks[k + 2].kind == "num" or toks[k + 2].text == "(")
    return nxt == ")" and k + 2 < len(toks) and (toks[k + 2].text in _OPS | {"=", "≈"})


def _member(toks: list[Tok], s: int, e: int, sign: str) -> tuple[int, int, Fraction | None, str, Fraction]:
    """(start, end, value, sign, rounding) of one chain member; a trailing '%' is its unit ('48.25%' is 48.25
    per cent), left out of [start, end) so that the unit reader finds it."""
    if e - 1 > s and toks[e - 1].text == "%" and all(t.kind == "num" or t.text in _CURRENCY for t in toks[s : e - 1]):
        e -= 1
    v = e
    while v - 1 > s and toks[v - 1].kind == "word" and toks[v - 1].low != "x":
        v -= 1  # a unit inside the chain is not part of the member's arithmetic
    arithmetic = [t for n, t in enumerate(toks[s:v], s) if not _unit_word(toks, n)]  # '90 inches * 2' is 90 * 2
    return s, e, _Expr(arithmetic).value(), sign, _rounding(arithmetic)


def _unit_word(toks: list[Tok], n: int) -> bool:
    t = toks[n]
    return (
        t.kind == "word"
        and t.low != "x"
        and n > 0
        and toks[n - 1].kind == "num"
        and not (len(t.text) == 1 and t.start == toks[n - 1].end)
    )


def _members(toks: list[Tok], a: int, b: int) -> list[tuple[int, int, str]]:
    """The run [a, b) split at '=' and '≈': (start, end, the sign before it)."""
    out, start, sign = [], a, ""
    for k in range(a, b):
        if toks[k].text in ("=", "≈"):
            if k > start:
                out.append((start, k, sign))
            start, sign = k + 1, toks[k].text
    if b > start:
        out.append((start, b, sign))
    return out


def _tight_fraction(toks: list[Tok], k: int) -> bool:
    """Is toks[k] the numerator of a fraction of whole numbers written without spaces ('361/2277')?"""
    if k + 2 >= len(toks) or toks[k + 1].text != "/" or toks[k + 2].kind != "num":
        return False
    a, slash, b = toks[k], toks[k + 1], toks[k + 2]
    return a.text.isdigit() and b.text.isdigit() and a.end == slash.start and slash.end == b.start and int(b.text) != 0


def _number_mentions(toks: list[Tok]) -> tuple[list[Mention], str | None]:
    """Every claimed number (a chain's last member, a number standing alone), and why the answer contradicts
    itself if a chain's members disagree."""
    mentions: list[Mention] = []
    covered: set[int] = set()
    for a, b, dangling in _math_runs(toks):
        covered.update(range(a, b))
        members = [_member(toks, s, e, sign) for s, e, sign in _members(toks, a, b)]
        # the claim: the last exact member; members after it written with '≈' are its rounding ('= 2277/361 ≈ 6.31')
        exact = [m for m in members if m[3] != "≈"] or members
        s, e, value, sign, tol = exact[-1]
        for ms, me, v, _, t in members:
            if v is not None and value is not None and abs(v - value) > t + tol:
                return [], (
                    f"contradicts itself: {_q(text_of(toks, a, b))} does not hold "
                    f"({_q(text_of(toks, ms, me))} is not {_q(text_of(toks, s, e))})"
                )
        unit, after = _unit_at(toks, e)
        if unit is None and exact[-1] is not members[-1]:
            unit, after = _unit_at(toks, members[-1][1])
        if unit is not None:
            covered.update(range(e, after))
        if sign == "≈" or (a > 0 and toks[a - 1].text in ("~", "≈")):
            mentions.append(Mention(text_of(toks, s, e), s, e, value=None, expression="≈"))
            continue
        expr = text_of(toks, s, e).replace("×", "*").replace("÷", "/").replace("·", "*")
        expr = re.sub(r"(?<=\d) x (?=\d)", " * ", "".join(c for c in expr if c not in _CURRENCY)).strip()
        end = after if unit is not None else e
        unworked = ""
        garbled = next((m for m in members if m[2] is None and not _share_of_sum(toks[m[0] : m[1]])), None)
        if dangling and unit is None:
            unworked = f"writes {_q(text_of(toks, a, b) + ' ' + dangling)} with nothing after its last {_q(dangling)}"
        elif garbled is not None:
            unworked = f"writes {_q(text_of(toks, garbled[0], garbled[1]))}, which does not read as arithmetic"
        elif not _written_value(toks[s:e]):
            unworked = f"writes {_q(text_of(toks, s, e))} without working it out"
        mentions.append(Mention(text_of(toks, s, end), s, end, value, unit, expr, _is_date(toks, s, e, value), unworked))
    for k, t in enumerate(toks):  # number words standing alone ('eleven times')
        if k not in covered and t.kind == "word":
            n = number_word(t.low)
            if n is not None:
                unit, after = _unit_at(toks, k + 1)
                mentions.append(Mention(text_of(toks, k, after), k, after, Fraction(n), unit, str(n)))
    return sorted(mentions, key=lambda m: m.start), None


def _share_of_sum(member: list[Tok]) -> bool:
    """'160 + 20%': a percentage added to a number, which the reader leaves unread on purpose (see _Expr)."""
    texts = {t.text for t in member}
    return "%" in texts and bool(texts & {"+", "-"})


def _written_value(member: list[Tok]) -> bool:
    """Is a chain member a value as written: one number (signed, with a currency sign or '%'), or a fraction of
    two whole numbers ('3/4', '2277/361')? '40 + 4 * 4' and '(4x22) / 2' are expressions: they assert no value."""
    core = [t for t in member if t.text not in _CURRENCY and t.text != "%"]
    if core and core[0].text in ("-", "+"):
        core = core[1:]
    if len(core) == 1:
        return core[0].kind == "num"
    return len(core) == 3 and core[1].text in ("/", "÷") and all(t.kind == "num" and t.text.isdigit() for t in (core[0], core[2]))


def _is_date(toks: list[Tok], s: int, e: int, value: Fraction | None) -> bool:
    return (
        e == s + 1
        and value is not None
        and value.denominator == 1
        and 1000 <= value <= 2199
        and "," not in toks[s].text
        and s > 0
        and toks[s - 1].low in DATE_PREPOSITIONS
    )


def read_number(toks: list[Tok], verifier: str, reference: str, question: str) -> Claim:
    ref_unit = None
    if verifier == "numeric":
        _, ref_unit, _, _ = NumericVerifier()._reference(reference)  # raises InvalidInput for a bad reference
    mentions, contradiction = _number_mentions(toks)
    if contradiction:
        return Claim(None, f"it {contradiction}")
    unworked = [m for m in mentions if m.unworked]
    for m in unworked:
        if _ranged(toks, m):  # '40-45' is a range before it is an unworked subtraction
            return Claim(None, f"it gives a range around {_q(m.text)}")
    mentions = [m for m in mentions if not m.unworked]  # working, not a claim
    if not mentions and unworked:
        return Claim(None, f"it {unworked[-1].unworked}: it asserts no value")
    if not mentions:
        return Claim(None, "it states no number")
    for m in mentions:
        compound = _compound(toks, m)
        if compound:
            return Claim(None, f"it writes a compound quantity {_q(compound)}, not one value")
    kept, aside = [], ""
    for m in mentions:
        why = _not_the_answer(toks, m, question)
        if why:
            aside = why
        else:
            kept.append(m)
    if not kept:
        return Claim(None, f"it {aside}: it asserts nothing else")
    mentions = kept
    q_units = _question_units(question)
    asserted, others = [], []
    for m in mentions:
        if m.expression == "≈" or _approximate(toks, m):
            return Claim(None, f"it hedges {_q(m.text)} (an approximate value)")
        if _ranged(toks, m):
            return Claim(None, f"it gives a range around {_q(m.text)}")
        why = problem(toks, m, numeric=True)
        if why:
            if why.startswith("denies"):
                continue  # a denied value is not claimed; a denied reference is refused below
            return Claim(None, f"it {why}")
        if not _same_quantity(m.unit, ref_unit, q_units):
            others.append(m)
            continue
        asserted.append(m)
    ref_value = _reference_value(verifier, reference)
    for m in mentions:
        if ref_value is not None and m.value == ref_value and denied(toks, m.start, m.end):
            return Claim(None, f"it denies {_q(m.text)} ({denied(toks, m.start, m.end)})")
    claims = [m for m in asserted if not (m.date and m.value != ref_value)]
    if not claims:
        if others:
            return Claim(None, f"it states {_q(others[-1].text)}, not a quantity in the question's unit")
        return Claim(None, "it asserts no number")
    values = {m.value for m in claims}
    if len(values) > 1 or (None in values and len(claims) > 1):
        return Claim(None, f"it names several values: {', '.join(_q(m.text) for m in claims)}")
    m = claims[-1]
    if verifier == "sympy" or m.value is None:
        return Claim(m.expression, f"it asserts {_q(m.text)}")
    shown = m.expression if m.value.denominator != 1 and "/" in m.expression else _plain(toks, m)
    return Claim(shown, f"it asserts {_q(m.text)}")


_TIME_UNITS = frozenset({"year", "month", "week", "day", "h", "min"})
_MULTIPLIED = frozenset("the as more less older younger bigger larger greater smaller his her their its that".split())
_OTHER_TIME = frozenset("will would was were had ago later earlier".split())
_COMPARATIVES = frozenset("less more older younger fewer greater smaller larger bigger longer shorter higher lower than".split())
_QUANTITY_NOUNS = frozenset(
    "age height length width depth distance population speed velocity temperature price cost total sum amount "
    "value weight mass area volume time duration rate concentration score number count balance".split()
)
_NOT_NAMES = FUNCTION | frozenset("how what which who whom when where why if after before each every answer".split())


def _compound(toks: list[Tok], m: Mention) -> str:
    """'12 years 5 months', '51 years and 8 months': a measurement followed by a smaller one, or ''."""
    if m.unit is None or _CANONICAL.get(m.unit) not in _UNIT_ALIASES:
        return ""
    k = m.end + (1 if m.end < len(toks) and toks[m.end].low == "and" else 0)
    if k < len(toks) and toks[k].kind == "num":
        unit, after = _unit_at(toks, k + 1)
        if unit is not None and _CANONICAL.get(unit) in _UNIT_ALIASES:
            return text_of(toks, m.start, after)
    return ""


def _not_the_answer(toks: list[Tok], m: Mention, question: str) -> str:
    """Why a number the line states is not its answer to the question, or '': a multiplier ('12 times the
    amount'), a value at another time than a question about now ('was 18', 'will be 18', 'in 2 years'), or the
    value of another person the question names ('Leona is 12' asked about Wen)."""
    nxt = toks[m.end].low if m.end < len(toks) else ""
    if m.unit and len(m.unit) == 1 and m.unit not in _CANONICAL and m.end >= 2 and toks[m.end - 1].start == toks[m.end - 2].end:
        return f"states {_q(m.text)}, a multiple of an unknown, not a value"
    if m.unit == "times" and nxt in _MULTIPLIED:
        return f"states {_q(m.text)} as a multiplier ({_q(m.text + ' ' + toks[m.end].text)})"
    if nxt in _COMPARATIVES:
        return f"states {_q(m.text)} as a difference ({_q(m.text + ' ' + toks[m.end].text)})"
    q = tokens(unicodedata.normalize("NFKC", question))
    variable = _variable_before(toks, m)
    if variable:
        return f"states {_q(m.text)} as the value of an expression in a variable ({_q(variable)})"
    if m.start >= 2 and toks[m.start - 1].low == "of" and toks[m.start - 2].kind == "word":
        noun = toks[m.start - 2].low
        if noun not in FUNCTION and noun not in _QUANTITY_NOUNS and noun not in {t.low for t in q}:
            return f"states {_q(m.text)} as the {noun} of something, which the question does not ask"
    if any(t.low == "now" for t in q):
        a, b = clause(toks, m.start, m.end)
        for k in range(a, b):
            t = toks[k]
            later = t.low == "in" and k + 2 < b and toks[k + 1].kind == "num" and _CANONICAL.get(toks[k + 2].low) in _TIME_UNITS
            if t.low in _OTHER_TIME or later:
                return f"states {_q(m.text)} for another time than now ({_q(text_of(toks, k, k + 3) if later else t.text)})"
    target, others = _question_names(q)
    if target and m.unit is not None and m.unit in others:
        return f"states {_q(m.text)} for {m.unit.capitalize()}, not for {target} whom the question asks about"
    if target:
        a, _ = sentence(toks, m.start, m.end)
        for k in range(m.start - 1, a - 1, -1):
            name = _name(toks[k])
            if name in others:
                return f"states {_q(m.text)} for {toks[k].text}, not for {target} whom the question asks about"
            if name == target.casefold():
                break
    return ""


def _variable_before(toks: list[Tok], m: Mention) -> str:
    """'4x' when the mention is the right side of an equation whose left side writes a number times a letter
    ('4x = 16', '4 (4x) = 12': the equation's unknown, not its value), else ''."""
    if m.start < 1 or toks[m.start - 1].text != "=":
        return ""
    a, _ = sentence(toks, m.start, m.end)
    for k in range(a, m.start - 2):
        t, v = toks[k], toks[k + 1]
        if t.kind == "num" and v.kind == "word" and len(v.text) == 1 and (k + 2 >= len(toks) or toks[k + 2].kind != "num"):
            return t.text + v.text
    return ""


def _name(t: Tok) -> str:
    if t.kind != "word":
        return ""
    low = t.low
    for tail in ("'s", "’s"):
        low = low.removesuffix(tail)
    return low


def _question_names(q: list[Tok]) -> tuple[str, set[str]]:
    """(the one person the question's last sentence asks about, the other names it uses), or ('', set()). A
    name is a capitalised word that is no function or question word and stands, at least once, inside a
    sentence rather than at its start."""
    inside: set[str] = set()
    last_sentence: list[tuple[str, str]] = []
    start = True
    for t in q:
        if t.text in ".!?;\n":
            start, last_sentence = True, ([] if t.text != "?" else last_sentence)
            if t.text == "?":
                break
            continue
        if t.kind == "word" and t.text[:1].isupper() and _name(t) not in _NOT_NAMES:
            if not start:
                inside.add(_name(t))
            last_sentence.append((_name(t), t.text.removesuffix("'s").removesuffix("’s")))
        start = False
    names = inside | {n for n, _ in last_sentence if n in inside}
    asked = {n for n, _ in last_sentence if n in names}
    if len(asked) != 1:
        return "", set()
    (target,) = asked
    shown = next(text for n, text in last_sentence if n == target)
    return shown, names - {target}


def _plain(toks: list[Tok], m: Mention) -> str:
    """The number as the numeric verifier reads it: as written when it is one numeral, else the exact value."""
    nums = [t for t in toks[m.start : m.end] if t.kind == "num"]
    if len(nums) == 1 and numeral(nums[0]) == m.value:
        return nums[0].text
    v = m.value
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def _reference_value(verifier: str, reference: str) -> Fraction | None:
    v = _Expr(tokens(unicodedata.normalize("NFKC", reference.split("±")[0].split("+-")[0]))).value()
    if v is None and verifier == "numeric":
        nums = [t for t in tokens(reference) if t.kind == "num"]
        v = numeral(nums[0]) if nums else None
    return v


def _question_units(question: str) -> set[str]:
    """The units a question writes, canonical: each word, and each unit as a claim's is read ('km/h', 'km per
    hour': 'in km/h' asks for km/h, not for km and h); 'percentage' and 'percent' ask in %. When the sentence
    that asks (the last one with '?') names a measurement unit, that sentence's units are the question's: 'What
    percentage of the 10-foot shark ...?' asks in %, not in feet."""
    toks = tokens(unicodedata.normalize("NFKC", question))
    ends = [k for k, t in enumerate(toks) if t.text in ".!?;"]
    asks = max((k for k in ends if toks[k].text == "?"), default=None)
    if asks is not None:
        start = max((k + 1 for k in ends if k < asks), default=0)
        asking = _units_in(toks[start : asks + 1])
        if asking & (set(_UNIT_ALIASES) | {"%"}):
            return asking
    return _units_in(toks)


def _units_in(toks: list[Tok]) -> set[str]:
    units = {_CANONICAL.get(t.low, t.low) for t in toks}
    for k in range(len(toks)):
        unit, _ = _unit_at(toks, k)
        if unit is not None:
            units.add(_CANONICAL.get(unit, unit))
    return units | ({"%"} if {"%", "percent", "percentage"} & units else set())


def _same_quantity(unit: str | None, ref_unit: str | None, q_units: set[str]) -> bool:
    if unit is None:
        return True
    canon = _CANONICAL.get(unit, unit)
    if ref_unit is not None:
        return canon == _CANONICAL.get(ref_unit, ref_unit)
    if canon in q_units:
        return True
    return canon not in _UNIT_ALIASES  # a counted noun ('31,059 people', '11 times'), not a measurement unit


def _approximate(toks: list[Tok], m: Mention) -> bool:
    before = toks[m.start - 1].low if m.start > 0 else ""
    if before in _CURRENCY and m.start > 1:
        before = toks[m.start - 2].low
    after = (toks[m.end].low, toks[m.end + 1].low) if m.end + 1 < len(toks) else ()
    return before in APPROXIMATORS or before in ("~", "≈") or after == ("or", "so")


def _ranged(toks: list[Tok], m: Mention) -> bool:
    if re.fullmatch(r"[\d.,]+[-–][\d.,]+", m.expression):  # '40-45' is a range, not a subtraction
        return True
    a, b = clause(toks, m.start, m.end)
    if any(t.low == "between" for t in toks[a : m.start]):
        return True
    nxt = toks[m.end : m.end + 2]
    if len(nxt) == 2 and (nxt[0].text in ("-", "–", "to") or nxt[0].low == "to") and nxt[1].kind == "num":
        return True
    prev = toks[max(0, m.start - 2) : m.start]
    return len(prev) == 2 and prev[1].low in ("-", "–", "to") and prev[0].kind == "num"
