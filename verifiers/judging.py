"""THE judge: `judge(answer, verifier, reference, question)` decides every verdict on an answer in kvgraft (the
deposit gate's runs, `solve`'s attempts, the eval's outputs, the recurring case's baseline attempts and recalls,
replay). Nothing else scores an answer; tests/test_one_judge.py fails if a code path calls a kind another way.
It knows the answer's shape (a bare value, a sentence, a worked solution) and nothing about models or stores.

The rules, in the order they apply:

1. The verifier names a kind (exact, numeric, sympy, attested) and the reference must be well formed for it;
   otherwise InvalidInput (an input error, not a verdict). An answer longer than FIELD_BOUNDS["solution"]
   characters is an input error too.
2. attested vouches for the text, not a value: the kind's own verdict on the answer as given.
3. An empty answer is refused: it asserts nothing.
4. The answer's line: `<<a op b=c>>` calculator annotations are removed first (they are working). Then, as
   lm-evaluation-harness reads gsm8k (its strict match, then its flexible one):
   a. the first line that starts with `####`: the text after it;
   a'. else the last `\\boxed{...}` (the LaTeX mark with which a model trained on math, Qwen2.5 among them, closes its
      working, as Minerva's and Qwen's own math evaluations read it): its content, LaTeX's `\\text{}`, `\\$`, `\\%`
      and spacing commands unwrapped, `\\frac{a}{b}` written a/b;
   b. else the last sentence that says "the answer is" (any case), from its start to its end (. ! ? before a
      space, or the line's end): the answer's final statement, an earlier one superseded by it;
   c. else the last non-empty line (a one-line answer is its own last line), where a line that is only an
      option marker (`A)`, `(b)`, `C.`, a lone capital `D`) carries nothing and is passed over;
   c'. for numeric and sympy, where that line is several whole sentences (working written as one paragraph) and the
      last opens with a conclusion word (so, therefore, thus, hence, finally, altogether, overall, in total, in
      conclusion) and holds a digit: that sentence ('... 90 inches * 2 = 180 inches. So the share is 180 / 360 * 100
      = 50%.' reads the second); a line cut off mid-sentence, or closed otherwise, is read whole.
   d. A last line that is one entry of a list of lettered options (two or more lines such as `A) 12`, `(B) 13`,
      `C. 14`) asserts nothing: it is one of several offered values, not the answer's claim.
5. That line is judged as a bare value first: a value the kind accepts whole ('saffron', '212 metres',
   '2277/361') passes without reading, and its `value` is the line as written.
6. Else the claim reader (verifiers/claims.py, its rules at its top) reads the value the line asserts: the
   reference's mentions for exact, the claimed number for numeric and sympy, refused when it is denied, hedged,
   one of several, in another unit, or contradicted by its own working. A line asserts no value when its claim
   is an expression left unworked ('Wen = 40 + 4 * 4') or a chain with nothing after its last '=' ("Priya's
   age = (4x22) / 2 ="). The value read goes to the kind's own check (tolerance, units, symbolic equality).

The verdict's `value` is the text the kind was given (None when nothing is asserted); `detail` says which line
was read and why. `JUDGE` names this rule set; stored records carry it, and a record scored under another name
is reported as scored by another judge when it is re-judged.
"""

from __future__ import annotations

import re
import unicodedata

from errors import InvalidInput
from verifiers import claims
from verifiers.judges import VERIFIERS
from verifiers.quantities import read_number
from verifiers.sentences import tokens
from verifiers.verdict import FIELD_BOUNDS, Claim, Verdict, _q

JUDGE = "kvgraft-judge/6"  # /1: the claim reader beside whole-answer checks; /2: one judge; /3: rule 4d (options), suppositions; /4: the last answer sentence, bare option markers; /5: rule 4a' (a \boxed{} value); /6: rule 4c' (a paragraph's last sentence with a number), compared chances are not hedges, units between factors
KINDS = tuple(sorted(VERIFIERS))

_ANNOTATION = re.compile(r"<<[^<>\n]{0,200}>>")
_STRICT = re.compile(r"^[ \t]*####[ \t]*(?P<rest>.*)$", re.MULTILINE)
_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")
_NUMBER = re.compile(r"\d")
_CONCLUSION = re.compile(r"(?:so|therefore|thus|hence|finally|altogether|overall|in total|in conclusion)\b", re.IGNORECASE)
_THE_ANSWER_IS = re.compile(r"(?<![\w])the answer is\b", re.IGNORECASE)
_OPTION = re.compile(r"^\s*(?:\([A-Ea-e]\)|[A-Ea-e]\)|[A-E][.:])\s*\S")
_MARKER = re.compile(r"^\s*(?:\(?[A-Ea-e]\)|[A-E][.:]?)\s*$")  # an option marker with nothing after it (`A)`, `(b)`, `C.`, `D`)


_BOXED = "\\boxed{"
_LATEX = (
    (re.compile(r"\\(?:text|mathrm|textbf|mathbf)\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}"), r"\1/\2"),
    (re.compile(r"\\([$%])"), r"\1"),
    (re.compile(r"\\[,;:! ]|\\q?quad\b"), " "),
)


def _last_boxed(text: str) -> str | None:
    """The content of the last `\boxed{...}` in `text` (braces balanced), LaTeX unwrapped; None where there is none or
    it is never closed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            inner = text[i:j]
            for pattern, repl in _LATEX:
                inner = pattern.sub(repl, inner)
            return " ".join(inner.split())
    return None


def answer_line(answer: str, numeric: bool = False) -> tuple[str, str]:
    """(the text the judge reads, how it was found) for an answer: rule 4 of the module's contract (4c' for the
    `numeric` kinds only: a fact's sentence is read whole)."""
    text = _ANNOTATION.sub("", unicodedata.normalize("NFKC", answer))
    strict = _STRICT.search(text)
    if strict is not None:
        return strict["rest"].strip(), "its '####' line"
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed, "its last \\boxed{} value"
    found = list(_THE_ANSWER_IS.finditer(text))
    said = found[-1] if found else None  # the last one: the answer's final statement
    if said is not None:  # the whole sentence, so that a hedge or a denial before the words is still read
        start = max((m.end() for m in _SENTENCE_END.finditer(text, 0, said.start())), default=0)
        end = next((m.end() for m in _SENTENCE_END.finditer(text, said.start() + 13)), len(text))
        line = text[start:end].strip()
        return line, ("" if line == text.strip() else "its 'The answer is' sentence")
    lines = [x.strip() for x in text.splitlines() if x.strip() and not _MARKER.match(x)]
    if len(lines) > 1 and _OPTION.match(lines[-1]) and sum(1 for x in lines if _OPTION.match(x)) >= 2:
        return "", f"its last line {lines[-1]!r} is one of the lettered options it lists"
    last, how = (lines[-1], "its last line") if len(lines) > 1 else ((lines[0] if lines else ""), "")
    final = _final_statement(last) if numeric else None
    if final is not None:  # a paragraph of working closed by its conclusion (rule 4c')
        return final, f"{how + ', ' if how else ''}its concluding sentence"
    return last, how


def _final_statement(line: str) -> str | None:
    """Rule 4c': the last sentence of a paragraph of several, where it is whole (ends the line with . ! or ?), opens
    with a conclusion word and holds a digit; else None."""
    if not line.endswith((".", "!", "?")):
        return None  # cut off (a decode budget's end): no sentence is known to be its last
    sentences = [x.strip() for x in _SENTENCE_END.split(line) if x.strip()]
    if len(sentences) < 2:
        return None
    final = sentences[-1]
    return final if _CONCLUSION.match(final) and _NUMBER.search(final) else None


def _claim(line: str, verifier: str, reference: str, question: str = "") -> Claim:
    """The value `line` asserts for `verifier` against `reference` (verifiers/claims.py's rules), or None and why."""
    text = unicodedata.normalize("NFKC", line).replace("\u2212", "-")
    if verifier == "numeric":
        text = claims.symbol_digits(text)
    toks = tokens(text)
    if verifier == "exact":
        return claims.read_exact(toks, reference)
    if verifier in ("numeric", "sympy"):
        return read_number(toks, verifier, reference, question)
    raise InvalidInput(f"the {verifier} verifier does not read claims; it judges the answer as given")


def judge(answer: str, verifier: str, reference: str, question: str = "") -> Verdict:
    """The one verdict on `answer` against `reference` for the `verifier` kind (the module's rules). Raises
    InvalidInput for an unknown kind, a malformed reference or an over-long answer; never for a wrong answer."""
    kind = VERIFIERS.get(verifier)
    if kind is None:
        raise InvalidInput(f"unknown verifier {_q(verifier)}; valid kinds are: {', '.join(KINDS)}")
    if not isinstance(answer, str):
        raise InvalidInput(f"answer must be text, got {type(answer).__name__}")
    if len(answer) > FIELD_BOUNDS["solution"]:
        raise InvalidInput(
            f"answer is {len(answer):,} characters; the judge reads at most {FIELD_BOUNDS['solution']:,}, shorten it"
        )
    if verifier == "attested":
        v = kind.compare(answer, reference)
        return Verdict(v.ok, v.verifier, v.detail, answer if v.ok else None)
    kind.compare(reference, reference)  # a malformed reference is an input error before any reading
    line, how = answer_line(answer, numeric=verifier in ("numeric", "sympy"))
    where = f"{how} {_q(line)}: " if how else ""
    if not line:
        why = f"{how}; nothing is asserted" if how else "it is empty; nothing is asserted"
        return Verdict(False, verifier, f"answer {_q(answer)}: {why}", None)
    if len(line) <= FIELD_BOUNDS["answer"]:
        whole = kind.compare(line, reference)
        if whole.ok:
            return Verdict(True, verifier, f"{'read from ' + _q(answer) + ': ' + where if how else ''}{whole.detail}", line)
    claim = _claim(line, verifier, reference, question)
    if claim.value is None:
        return Verdict(
            False, verifier, f"answer {_q(answer)}: {where}{claim.why}; nothing is asserted that {verifier} can accept", None
        )
    v = kind.compare(claim.value, reference)
    return Verdict(v.ok, verifier, f"read from {_q(answer)}: {where}{claim.why}; {v.detail}", claim.value)
