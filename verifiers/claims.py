"""What an answer asserts: the reading rules the judge (verifiers/judging.py) applies to an answer's line.

A model with a fact grafted answers in a sentence ("The flag of the free city of Tzerin is a plain saffron with
no emblem."); each verifier kind compares one value with its reference. `verifiers.judge` picks the line (a
worked solution's answer line), tokenises it and reads its value with `read_exact` (or quantities.read_number);
where nothing is asserted it refuses, and otherwise it gives the value to the kind. Nothing here decides a
verdict: these rules are the judge's, written down once.
This module knows English answer sentences and the kinds' value shapes, and
nothing about models, templates or stores.

The contract, per kind:
- A bare value is judged as it is: an answer the kind accepts whole ('saffron', '212 metres', '2277/361') passes
  without reading. Everything else is read as below.
- exact: the mentions are the reference's words in the answer, on word boundaries, after `normalise_text`
  ('Osric Pellamy' in 'It was built by Osric Pellamy.'). Words around the value are not judged: 'plain saffron'
  asserts saffron, and so does 'cobalt saffron' (the reader does not know which words narrow a value).
- numeric: the mentions are the answer's numbers ('31,059', '3/4', '-3', 'eleven') with the unit word after
  them. A unit the reference has, or a spelling of it ('metres', 'meters', 'm'), is the reference's unit; with a
  reference without a unit, a unit word the question uses or a counted noun ('31,059 people', '11 times') is the
  question's unit, and a measurement unit the question does not use ('24 hours' asked in minutes) is another
  quantity. When the sentence that asks names a measurement unit, only its units are the question's ('What
  percentage of the 10-foot shark ...?' asks in %: '10%' answers 10, '10 feet' does not); 'percentage' and
  'percent' ask in %. A currency sign before a number is the question's currency and is dropped. A year after 'in',
  'since', 'by', 'from', 'until' or 'of' that is not the reference is a date, not a competing value.
- sympy: read as numeric (the claim is the number or arithmetic expression, unit dropped under the same unit
  rule), then compared by the sympy verifier.
- attested: not read (it vouches for the text, not a value).

Reading rules, the same for every kind:
- Working. In an equation chain ('160 × 70/100 = 112', '2277/361 = 11.5 hours') the claim is the last member;
  every member the reader can evaluate must equal it (a written decimal stands for its rounding: '22.53' for
  22.530816), else the answer contradicts itself. A claim is a value as written: one number (signed, with a
  currency sign or '%') or a fraction of two whole numbers ('3/4'). An expression left unworked ('Wen = 40 + 4 *
  4') or a chain with nothing after its last '=' or operator ("Priya's age = (4x22) / 2 =") is working that
  asserts no value; a line with nothing else asserts nothing. Juxtaposed factors are multiplied ('2(6)',
  '(8-1)2'), a fraction of whole numbers written tight is one number ('1 ÷ 361/2277'), a unit inside a chain is
  a unit ('4 × 12 years = 48'), and a member that does not read as arithmetic ('4-2 2-8') makes its chain
  assert nothing.
- Not the answer. A number is not the line's claim when it is a multiplier ('12 times the amount'), a
  difference ('18 years less than', '5 more'), a multiple of an unknown ('4x') or the right side of an
  equation in one ('4x = 16'), a qualifier of something the question does not ask ('a memory of 18 years': a
  number after 'of' counts only after a quantity noun or a word of the question), a value at another time
  when the question asks about now ('was 18', 'will be 18', 'in 2 years'), or the value of another person the
  question names ('Leona is 12', '12 Leona' when it asks about Wen: the nearest name before the number, or a
  name written as its unit). A compound quantity ('12 years 5 months') is refused: it is not one value.
- Clauses. A sentence ends at . ! ? ; and a line break; a clause also ends at , : — ( ) and before but,
  although, though, however, whereas, while, because, so, therefore, thus, hence. A parenthesised aside is a
  clause of its own.
- Denial. A mention is denied when its clause has a negation before it (not, no, never, n't, neither, nor,
  none, without, unlike, except, rather than, instead of, other than), or a verbal negation after it ('is not',
  'isn't', 'was never') or 'is wrong / incorrect / false'. 'plain saffron with no emblem': 'no' comes after the
  value and negates 'emblem'. 'saffron, not crimson': the negation opens another clause and denies crimson.
- Symbols. For numeric, digits that are part of a symbol are not numbers: an index glued to the letter, '_' or '^'
  before it ('H2O', 'O_2', 'x^2', 'B12') and a formula's coefficient glued to such a symbol ('2H_2O'); a
  chemical or TeX formula therefore states no number. 'x' is not such a letter: '4x22' is 4 times 22.
- Hedge. A mention is hedged when its sentence says probably, perhaps, maybe, possibly, likely, presumably,
  apparently, might, 'may be', 'could be', 'I think', 'I believe', 'I guess', 'not sure', 'some say' or 'seems',
  or sets the value up as a supposition ('let's say', 'let us', suppose, assume, assuming, hypothetically);
  a number is hedged by an approximator beside it (about, around, approximately, roughly, nearly, almost,
  circa, ~, ≈, 'or so'). Policy: 'about 42' is refused even against a reference with a tolerance: it asserts
  no value the verifier can check. A range ('40-50', 'between 40 and 50', '40 to 50') is refused the same way.
- Alternatives. A mention is one of several when its clause has 'or', 'either' or 'whether', when a word is
  listed with it ('saffron and crimson', 'red, saffron', 'saffron/crimson'), or when it stands only in an aside
  ('crimson (some say saffron)').
- Refusal (the judge's). Nothing is asserted when any mention of the reference is denied, hedged or one of several; when no mention is
  asserted; and, for numbers, when the asserted values disagree ('No, 300 metres; 212 metres was the old
  spire.' names two). Otherwise the asserted value goes to the kind's own check.
"""

from __future__ import annotations

import re

from verifiers.judges import normalise_text
from verifiers.sentences import Mention, Tok, problem, text_of, tokens
from verifiers.verdict import Claim, _q

# Digits that are part of a symbol, not a quantity: an index glued to the letter or the '_'/'^' before it
# ('H2O', 'O_2', 'x^2', 'B12'), and a formula's coefficient glued to a symbol that carries one ('2H_2O').
# 'x' and 'X' are left out: '4x22' is the model's way of writing 4 times 22.
_SYMBOL_DIGITS = re.compile(r"(?<=[^\W\d_xX]|[_^])\d+|(?<![\w.,])\d+(?=[^\W\d_xX][^\W\d_]*[_^\d])")


def symbol_digits(text: str) -> str:
    """`text` without the digits that name a symbol ('H_2O_2' -> 'H_O_'): a formula states no number."""
    return _SYMBOL_DIGITS.sub("", text)


def read_exact(toks: list[Tok], reference: str) -> Claim:
    """The mention of `reference`'s words that a line's tokens assert, or None with why none is (the contract above)."""
    ref = [t.low for t in tokens(normalise_text(reference))]
    n = len(ref)
    mentions = [
        Mention(text_of(toks, i, i + n), i, i + n) for i in range(len(toks) - n + 1) if [t.low for t in toks[i : i + n]] == ref
    ]
    if not mentions:
        return Claim(None, f"it does not name the reference {_q(reference)}")
    for m in mentions:
        why = problem(toks, m)
        if why:
            return Claim(None, f"it {why}")
    return Claim(mentions[0].text, f"it asserts {_q(mentions[0].text)}")
