"""English answer sentences as the claim reader needs them: tokens, sentences and clauses, and whether a
mention of a value is denied, hedged or one of several in the clause that carries it (the rules are stated in
verifiers/claims.py). Knows no verifier kind and no numbers beyond telling a numeral from a word."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from verifiers.verdict import _q

_TOKEN = re.compile(
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][+-]?\d{1,4}(?![\w]))?)"
    r"|(?P<word>[^\W\d_]+(?:['’][^\W\d_]+)*(?:-[^\W\d_]+)*)"
    r"|(?P<sym>\S)"
)


@dataclass(frozen=True)
class Tok:
    kind: str  # num | word | sym
    text: str  # as written (NFKC)
    low: str  # casefolded
    start: int
    end: int


def tokens(text: str) -> list[Tok]:
    return [Tok(m.lastgroup or "sym", m.group(), m.group().casefold(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


_SENTENCE_END = frozenset(".!?;\n")
_CLAUSE_END = frozenset(",:—–()[]")
_CLAUSE_WORDS = frozenset("but although though however whereas while because so therefore thus hence".split())
_VERBAL_NEGATION = frozenset("not never neither nor cannot".split())
NEGATION = _VERBAL_NEGATION | frozenset("no none without unlike except nobody nothing".split())
_DETERMINERS = frozenset("a an the any".split())
_NEGATION_PAIRS = frozenset({("rather", "than"), ("instead", "of"), ("other", "than")})
_AUXILIARY = frozenset("is was are were be been being does did do has have had can could will would should must".split())
_DENIAL_AFTER = frozenset("wrong incorrect false mistaken untrue".split())
HEDGES = frozenset(
    "probably perhaps maybe possibly likely unlikely presumably apparently supposedly reportedly allegedly "
    "might seems seem seemingly unsure uncertain guess "
    "suppose supposing assume assuming hypothetically".split()  # a supposition sets a value up, it does not claim it
)
_HEDGE_PAIRS = frozenset(
    {
        ("may", "be"),
        ("may", "have"),
        ("could", "be"),
        ("i", "think"),
        ("i", "believe"),
        ("not", "sure"),
        ("some", "say"),
        ("some", "sources"),
        ("it", "appears"),
        ("let's", "say"),
        ("lets", "say"),
        ("let", "us"),
    }
)
APPROXIMATORS = frozenset("about around approximately roughly nearly almost circa approx ca".split())
_ALTERNATIVE = frozenset("or either whether".split())
_LISTERS = frozenset({",", "and", "or", "/", "&", "nor"})
FUNCTION = (
    frozenset(
        "a an the with without of in on at by for from to into onto its it it's this that these those which who "
        "whose whom he she they his her their them is was are were has have had be been being as so since because "
        "when where while there here then than also and or but nor only just".split()
    )
    | _AUXILIARY
    | NEGATION
    | _CLAUSE_WORDS
)
DATE_PREPOSITIONS = frozenset("in since by from until of".split())


def sentence(toks: list[Tok], i: int, j: int) -> tuple[int, int]:
    """[a, b) of the sentence around tokens [i, j)."""
    a = i
    while a > 0 and toks[a - 1].text not in _SENTENCE_END:
        a -= 1
    b = j
    while b < len(toks) and toks[b].text not in _SENTENCE_END:
        b += 1
    return a, b


def clause(toks: list[Tok], i: int, j: int) -> tuple[int, int]:
    """[a, b) of the clause around tokens [i, j)."""
    a = i
    while a > 0 and not _ends_clause(toks, a - 1):
        a -= 1
    b = j
    while b < len(toks) and not _ends_clause(toks, b):
        b += 1
    return a, b


def _ends_clause(toks: list[Tok], k: int) -> bool:
    t = toks[k]
    if t.text in _SENTENCE_END or t.text in _CLAUSE_END:
        return True
    return t.kind == "word" and t.low in _CLAUSE_WORDS


def _in_aside(toks: list[Tok], i: int) -> bool:
    """Is token i inside parentheses or brackets?"""
    depth = 0
    for t in toks[:i]:
        if t.text in "([":
            depth += 1
        elif t.text in ")]" and depth:
            depth -= 1
    return depth > 0


def _pairs(toks: list[Tok], a: int, b: int) -> set[tuple[str, str]]:
    return {(toks[k].low, toks[k + 1].low) for k in range(a, b - 1)}


def denied(toks: list[Tok], i: int, j: int) -> str | None:
    """Why the mention at tokens [i, j) is denied in its clause, or None. A verbal negation ('not', 'never',
    'n't', 'neither', 'nor') before the mention reaches to the end of its clause; a nominal one ('no',
    'without', 'rather than') reaches over the words after it up to the next function word: 'no emblem and
    is saffron' does not deny saffron. A negation after the mention denies it when the mention is the
    clause's subject ('saffron is not the colour'), not a complement ('the flag is saffron and is not red')."""
    a, b = clause(toks, i, j)
    for k in range(a, i):
        t = toks[k]
        pair = (t.low, toks[k + 1].low) if k + 1 < i else None
        if t.low in _VERBAL_NEGATION or t.low.endswith("n't") or t.low.endswith("n’t"):
            return f"'{t.text}' before it"
        if (t.low in NEGATION or pair in _NEGATION_PAIRS) and _reaches(toks, k + (2 if pair in _NEGATION_PAIRS else 1), i):
            return f"'{' '.join(pair) if pair in _NEGATION_PAIRS else t.text}' before it"
    if any(t.low in _AUXILIARY or t.low.endswith("'s") for t in toks[a:i]):
        return None  # the mention is a complement: what follows is about the subject
    after = toks[j:b]
    for k, t in enumerate(after):
        if t.low.endswith("n't") or t.low.endswith("n’t"):
            return f"'{t.text}' after it"
        if t.low in ("not", "never") and k > 0 and after[k - 1].low in _AUXILIARY:
            return f"'{after[k - 1].text} {t.text}' after it"
        if t.low in _DENIAL_AFTER:
            return f"'{t.text}' after it"
    return None


def _reaches(toks: list[Tok], k: int, i: int) -> bool:
    """Does a nominal negation whose phrase starts at token k reach the mention at token i?"""
    while k < i:
        t = toks[k]
        if not (t.kind == "num" or (t.kind == "word" and (t.low not in FUNCTION or t.low in _DETERMINERS))):
            return False
        k += 1
    return True


# 'likely' after these compares chances ('25% more likely to roll ...', 'equally likely'): a quantity, not a hedge
_COMPARED_CHANCE = frozenset("more less as equally times twice".split())


def hedged(toks: list[Tok], i: int, j: int) -> str | None:
    a, b = sentence(toks, i, j)
    for k in range(a, b):
        t = toks[k]
        if t.low in HEDGES and not (t.low in ("likely", "unlikely") and k > a and toks[k - 1].low in _COMPARED_CHANCE):
            return f"'{t.text}'"
    for pair in _pairs(toks, a, b):
        if pair in _HEDGE_PAIRS:
            return f"'{' '.join(pair)}'"
    return None


def _content(t: Tok) -> bool:
    return (t.kind == "word" and t.low not in FUNCTION) or t.kind == "num"


def several(toks: list[Tok], i: int, j: int, numeric: bool) -> str | None:
    """Why the mention at [i, j) is one of several values, or None. A number is listed with numbers only
    ('12 and 15'; '1808 and sank' is not a list)."""
    a, b = clause(toks, i, j)
    for t in toks[a:b]:
        if t.low in _ALTERNATIVE:
            return f"'{t.text}' in its clause"
    if _in_aside(toks, i) and any(_content(t) for t in toks[: _aside_start(toks, i)]):
        return "it stands only in an aside"
    # a value listed with it: 'saffron and crimson', 'red, saffron', 'saffron/crimson' ('saffron, not crimson'
    # and 'saffron, with no emblem' are not lists: a negation or a function word follows the comma)
    like = (lambda t: t.kind == "num" or numeral(t) is not None) if numeric else _content
    if j + 1 < len(toks) and toks[j].low in _LISTERS and like(toks[j + 1]) and toks[j + 1].low not in NEGATION:
        return f"'{toks[j].text} {toks[j + 1].text}' after it"
    if i >= 2 and toks[i - 1].low in _LISTERS and like(toks[i - 2]):
        return f"'{toks[i - 2].text} {toks[i - 1].text}' before it"
    return None


def _aside_start(toks: list[Tok], i: int) -> int:
    depth = 0
    for k in range(i - 1, -1, -1):
        if toks[k].text in ")]":
            depth += 1
        elif toks[k].text in "([":
            if depth == 0:
                return k
            depth -= 1
    return 0


@dataclass(frozen=True)
class Mention:
    text: str  # the value as written
    start: int  # token span [start, end)
    end: int
    value: Fraction | None = None  # numbers: the value
    unit: str | None = None  # numbers: the unit word as written (casefolded)
    expression: str = ""  # numbers: the claim as the sympy verifier reads it
    date: bool = False
    unworked: str = ""  # numbers: why the mention writes no value (an expression left unworked, a chain ending in '=')


def problem(toks: list[Tok], m: Mention, numeric: bool = False) -> str | None:
    why = denied(toks, m.start, m.end)
    if why:
        return f"denies {_q(m.text)} ({why})"
    why = hedged(toks, m.start, m.end)
    if why:
        return f"hedges {_q(m.text)} ({why})"
    why = several(toks, m.start, m.end, numeric)
    if why:
        return f"names {_q(m.text)} as one of several values ({why})"
    return None


def text_of(toks: list[Tok], a: int, b: int) -> str:
    out = ""
    for k in range(a, b):
        if k > a and toks[k].start > toks[k - 1].end:
            out += " "
        out += toks[k].text
    return out


# ---- numerals ------------------------------------------------------------------------------------

SMALL = {
    w: n
    for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_TENS = {w: 10 * n for n, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}


def number_word(low: str) -> int | None:
    if low in SMALL and low not in ("zero", "one"):  # 'one' is more often a pronoun than a count
        return SMALL[low]
    if low in _TENS:
        return _TENS[low]
    tens, _, ones = low.partition("-")
    if tens in _TENS and ones in SMALL and 0 < SMALL[ones] < 10:
        return _TENS[tens] + SMALL[ones]
    return None


def numeral(t: Tok) -> Fraction | None:
    if t.kind == "num":
        try:
            return Fraction(t.text.replace(",", ""))
        except (ValueError, ZeroDivisionError):
            return None
    if t.kind == "word":
        n = number_word(t.low)
        return Fraction(n) if n is not None else None
    return None
