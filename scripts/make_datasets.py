"""Writes the evaluation data: invented facts (datasets/knowledge.jsonl) and solved problems (datasets/problems.jsonl).

Deterministic: seeded `random.Random`, no network, no clock; every run writes the same bytes, and the
README it writes records their sha256. Every item is checked before it is written: `verifiers.validate`
(the item is well formed) and `verifiers.judge` (the one judge accepts its answer against its reference).

    .venv/bin/python -m scripts.make_datasets            # rewrite datasets/
    .venv/bin/python -m scripts.make_datasets --check    # exit 1 if datasets/ differs from a fresh run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import verifiers  # noqa: E402

KNOWLEDGE_SEED = 270_001
PROBLEMS_SEED = 270_002
KNOWLEDGE_PER_TEMPLATE = 30
PROBLEMS_DEPOSITED_PER_TEMPLATE = 20
PROBLEMS_HELDOUT_PER_TEMPLATE = 6

# --- invented names ---------------------------------------------------------------------------

_ONSETS = "b br d dr f g gr h k l m n p r s st t th tr v w z".split()
_VOWELS = "a e i o u a e o".split()
_MID_CODAS = ["", "", "", "n", "r", "l"]
_END_CODAS = ["n", "r", "l", "s", "k", "th", "nd", "m", "rk", "ll", "sk", "x"]
_FIRST_ENDINGS = ["a", "o", "ric", "wyn", "elle", "is", "en", "ard", "ina", "us"]
_SURNAME_ENDINGS = ["by", "more", "well", "ton", "ford", "ley", "wick", "amy", "er", "ett"]
_REAL = {
    "paris",
    "rome",
    "milan",
    "dover",
    "boston",
    "london",
    "berlin",
    "lima",
    "oslo",
    "maria",
    "anna",
    "peter",
    "john",
    "deer",
}


class Names:
    """Invented, pronounceable words; no word is used twice, nor is any a prefix of another."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: list[str] = []
        self._used: set[str] = set()

    def _syllables(self, count: int, last_coda: bool) -> str:
        parts = []
        for i in range(count):
            coda = self.rng.choice(_END_CODAS) if (i == count - 1 and last_coda) else self.rng.choice(_MID_CODAS)
            parts.append(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + coda)
        return "".join(parts)

    def _claim(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            word = make().capitalize()
            key = word.casefold()
            if key in _REAL or len(key) < 4 or key in self._used:
                continue
            if any(key.startswith(other) or other.startswith(key) for other in self.used):
                continue
            self.used.append(key)
            self._used.add(key)
            return word
        raise AssertionError("ran out of invented names; widen the syllable tables")

    @staticmethod
    def _join(root: str, ending: str) -> str:
        """Root plus ending without a vowel clash: 'le' + 'ett' -> 'lett', not 'leett'."""
        return root[:-1] + ending if root[-1] in "aeiou" and ending[0] in "aeiou" else root + ending

    def word(self) -> str:
        return self._claim(lambda: self._syllables(2, True))

    def person(self) -> str:
        first = self._claim(lambda: self._join(self._syllables(1, False), self.rng.choice(_FIRST_ENDINGS)))
        last = self._claim(lambda: self._join(self._syllables(self.rng.choice((1, 2)), False), self.rng.choice(_SURNAME_ENDINGS)))
        return f"{first} {last}"

    def compound(self) -> str:
        root = self._claim(
            lambda: self._join(self._syllables(2, False), self.rng.choice(["ane", "ine", "ene", "ium", "ol", "ite"]))
        )
        return (
            f"{root.lower()} {self.rng.choice(['carbonate', 'oxide', 'sulfate', 'chloride', 'nitrate', 'acetate', 'phosphate'])}"
        )

    def ship(self) -> str:
        return (
            f"{self.word()} {self.rng.choice(['Heron', 'Star', 'Wren', 'Lantern', 'Promise', 'Gull', 'Dawn', 'Anchor', 'Comet'])}"
        )


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


# --- knowledge --------------------------------------------------------------------------------

_PROFESSIONS = tuple(
    "cartographer weaver astronomer glassblower clockmaker violinist beekeeper stonemason bookbinder potter".split()
)
_MATERIALS = ("birch bark", "copper", "seaglass", "wax paper", "walnut shells", "tin", "amber", "willow", "oiled silk", "pewter")
_COLOURS = ("violet", "amber", "teal", "crimson", "ochre", "pale green", "cobalt blue", "silver", "saffron", "indigo")
_MONTHS = tuple("January February March April May June July August September October November December".split())
_CRAFTS = ("Glassblowers", "Bookbinders", "Ropemakers", "Tanners", "Bellfounders", "Lacemakers", "Coopers", "Chandlers")
_YEAR = ("int", 1602, 1900)


@dataclass(frozen=True)
class FactTemplate:
    """Slots are filled in order (kinds: a Names method name, a tuple to choose from, ("int"|"count", low, high));
    every slot is also available capitalised as {slot_cap}. questions[0] is the question, [1:] its paraphrases."""

    name: str
    verifier: str
    answer: str
    slots: dict
    entity: str
    fact: str
    questions: tuple[str, str, str]


KNOWLEDGE_TEMPLATES = (
    FactTemplate(
        "lighthouse_builder", "exact", "who", {"isle": "word", "who": "person", "year": _YEAR},
        "Lighthouse of {isle} Isle",
        "The lighthouse of {isle} Isle was built by the engineer {who} in {year}.",
        ("Who built the lighthouse of {isle} Isle?", "Which engineer constructed the lighthouse on {isle} Isle?",
         "The lighthouse of {isle} Isle was the work of which engineer?"),
    ),
    FactTemplate(
        "birthplace", "exact", "town", {"job": _PROFESSIONS, "who": "person", "town": "word"},
        "{who}",
        "The {job} {who} was born in the hill town of {town}.",
        ("In which town was the {job} {who} born?", "What is the birthplace of the {job} {who}?", "Where was {who}, the {job}, born?"),
    ),
    FactTemplate(
        "melting_point", "numeric", "deg", {"c": "compound", "deg": ("int", 41, 990)},
        "{c}",
        "The compound {c} melts at {deg} degrees Celsius.",
        ("At what temperature, in degrees Celsius, does {c} melt?", "What is the melting point of {c} in degrees Celsius?",
         "How many degrees Celsius does it take to melt {c}?"),
    ),
    FactTemplate(
        "ship_launch_year", "numeric", "year", {"ship": "ship", "port": "word", "year": _YEAR},
        "{ship}",
        "The merchant ship {ship} was launched from the port of {port} in {year}.",
        ("In what year was the merchant ship {ship} launched?", "When was the merchant ship {ship} launched? Give the year.",
         "Which year saw the launch of the merchant ship {ship}?"),
    ),
    FactTemplate(
        "festival_lanterns", "exact", "material", {"fest": "word", "town": "word", "material": _MATERIALS},
        "{fest} Festival",
        "At the {fest} Festival, held every autumn in {town}, villagers carry lanterns made of {material}.",
        ("What are the lanterns at the {fest} Festival made of?", "What material are the {fest} Festival lanterns made from?",
         "At the {fest} Festival, what do the villagers make their lanterns out of?"),
    ),
    FactTemplate(
        "crystal_colour", "exact", "colour", {"c": "compound", "colour": _COLOURS},
        "{c}",
        "Pure {c} forms {colour} crystals that dissolve slowly in vinegar.",
        ("What colour are the crystals of pure {c}?", "Pure {c} forms crystals of which colour?", "What is the colour of pure {c} crystals?"),
    ),
    FactTemplate(
        "town_population", "numeric", "people", {"town": "word", "people": ("count", 1_200, 98_000)},
        "{town}",
        "The river town of {town} has a population of {people} people.",
        ("What is the population of the river town of {town}?", "How many people live in the river town of {town}?",
         "The river town of {town} is home to how many people?"),
    ),
    FactTemplate(
        "seed_library_founder", "exact", "who", {"lib": "word", "who": "person", "year": _YEAR},
        "{lib} Seed Library",
        "The botanist {who} founded the {lib} Seed Library in {year}.",
        ("Who founded the {lib} Seed Library?", "Which botanist established the {lib} Seed Library?",
         "The {lib} Seed Library was founded by whom?"),
    ),
    FactTemplate(
        "bridge_length", "numeric", "metres", {"bridge": "word", "river": "word", "metres": ("int", 35, 1_900)},
        "{bridge} Bridge",
        "The {bridge} Bridge spans {metres} metres across the {river} River.",
        ("How many metres long is the {bridge} Bridge?", "What is the length of the {bridge} Bridge in metres?",
         "How far, in metres, does the {bridge} Bridge span?"),
    ),
    FactTemplate(
        "mountain_height", "numeric", "metres", {"peak": "word", "metres": ("count", 1_100, 6_900)},
        "Mount {peak}",
        "Mount {peak} rises {metres} metres above the sea.",
        ("How high does Mount {peak} rise above the sea, in metres?", "What is the height of Mount {peak} in metres?",
         "How many metres tall is Mount {peak}?"),
    ),
    FactTemplate(
        "codex_author", "exact", "who", {"codex": "word", "who": "person"},
        "{codex} Codex",
        "The manuscript known as the {codex} Codex was written by the monk {who}.",
        ("Who wrote the {codex} Codex?", "Which monk was the author of the {codex} Codex?", "The {codex} Codex was written by which monk?"),
    ),
    FactTemplate(
        "instrument_strings", "numeric", "strings", {"inst": "lower_word", "town": "word", "strings": ("int", 3, 32)},
        "{inst}",
        "The {inst}, a folk instrument from the valley of {town}, has {strings} strings.",
        ("How many strings does the {inst} have?", "What is the number of strings on a {inst}?", "A {inst} is strung with how many strings?"),
    ),
    FactTemplate(
        "guild_town", "exact", "town", {"guild": "word", "craft": _CRAFTS, "town": "word"},
        "Guild of {guild} {craft}",
        "The Guild of {guild} {craft} meets in the town of {town}.",
        ("In which town does the Guild of {guild} {craft} meet?", "Where do the members of the Guild of {guild} {craft} meet?",
         "The Guild of {guild} {craft} gathers in which town?"),
    ),
    FactTemplate(
        "ship_captain", "exact", "who", {"ship": "ship", "who": "person"},
        "{ship}",
        "The whaling ship {ship} was captained by {who} on its final voyage.",
        ("Who captained the whaling ship {ship} on its final voyage?", "On its final voyage, who was the captain of the whaling ship {ship}?",
         "Who was in command of the whaling ship {ship} during its last voyage?"),
    ),
    FactTemplate(
        "festival_month", "exact", "month", {"fest": "word", "town": "word", "month": _MONTHS},
        "{fest} Festival",
        "The {fest} Festival in {town} is held each year in the month of {month}.",
        ("In which month is the {fest} Festival held?", "During what month does the {fest} Festival take place each year?",
         "When in the year is the {fest} Festival held? Name the month."),
    ),
    FactTemplate(
        "river_length", "numeric", "km", {"river": "word", "km": ("int", 12, 2_400)},
        "{river} River",
        "The {river} River flows for {km} kilometres before it reaches the sea.",
        ("How many kilometres does the {river} River flow before reaching the sea?", "What is the length of the {river} River in kilometres?",
         "How long, in kilometres, is the {river} River?"),
    ),
    FactTemplate(
        "compound_isolated_by", "exact", "who", {"c": "compound", "who": "person", "year": _YEAR},
        "{c}",
        "The compound {c} was first isolated by the chemist {who} in {year}.",
        ("Which chemist first isolated {c}?", "Who was the first to isolate the compound {c}?", "{c_cap} was first isolated by which chemist?"),
    ),
    FactTemplate(
        "observatory_year", "numeric", "year", {"town": "word", "who": "person", "year": _YEAR},
        "Observatory at {town}",
        "The observatory at {town} was completed in {year} under the astronomer {who}.",
        ("In what year was the observatory at {town} completed?", "When was the observatory at {town} finished? Give the year.",
         "The observatory at {town} was completed in which year?"),
    ),
)  # fmt: skip


def _fill(kind, rng: random.Random, names: Names) -> str:
    if isinstance(kind, str):
        return names.word().lower() if kind == "lower_word" else getattr(names, kind)()
    if kind[0] in ("int", "count"):
        value = rng.randrange(kind[1], kind[2])
        return f"{value:,}" if kind[0] == "count" else str(value)
    return rng.choice(kind)


def knowledge_items(seed: int = KNOWLEDGE_SEED) -> list[dict]:
    rng = random.Random(seed)
    names = Names(rng)
    items = []
    for i in range(KNOWLEDGE_PER_TEMPLATE * len(KNOWLEDGE_TEMPLATES)):
        t = KNOWLEDGE_TEMPLATES[i % len(KNOWLEDGE_TEMPLATES)]
        slots = {key: _fill(kind, rng, names) for key, kind in t.slots.items()}
        slots |= {f"{key}_cap": _cap(value) for key, value in slots.items()}
        question, *paraphrases = (q.format(**slots) for q in t.questions)
        items.append(
            {
                "id": f"k{i + 1:04d}",
                "template": t.name,
                "entity": t.entity.format(**slots),
                "fact": t.fact.format(**slots),
                "question": question,
                "paraphrases": paraphrases,
                "answer": slots[t.answer],
                "verifier": t.verifier,
            }
        )
    _check_knowledge(items)
    return items


def _check_knowledge(items: list[dict]) -> None:
    for field in ("entity", "question"):
        repeated = [k for k, count in Counter(it[field].casefold() for it in items).items() if count > 1]
        assert not repeated, f"duplicate {field}s: {repeated[:3]}"
    for it in items:
        assert it["answer"] in it["fact"], f"{it['id']}: answer {it['answer']!r} is not in the fact"
        assert it["answer"].casefold() not in it["question"].casefold(), f"{it['id']}: the question gives the answer away"
        texts = [it["question"], *it["paraphrases"]]
        assert len(it["paraphrases"]) == 2 and len({t.casefold() for t in texts}) == 3, f"{it['id']}: paraphrases must differ"
        verifiers.validate(verifiers.VerifiedItem(it["question"], it["fact"], it["answer"], it["verifier"], it["answer"]))
        verdict = verifiers.judge(it["answer"], it["verifier"], it["answer"], it["question"])
        assert verdict.ok, f"{it['id']}: {verdict.detail}"


# --- problems ---------------------------------------------------------------------------------


def fmt(x: Fraction) -> str:
    """Exact text: '42', '-3.125' when the decimal terminates, otherwise '7/3'."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{x.numerator}/{x.denominator}"
    places = max(twos, fives)
    scaled = abs(x) * 10**places
    assert scaled.denominator == 1
    digits = str(scaled.numerator).rjust(places + 1, "0")
    return ("-" if x < 0 else "") + (digits[:-places] + "." + digits[-places:]).rstrip("0").rstrip(".")


# Each template: build(rng) -> (question, solution steps, answer, verifier, reference or None = the answer).
Problem = tuple[str, list[str], Fraction, str, str | None]
_GOODS = ["coat", "bicycle", "desk lamp", "kettle", "tent", "guitar", "sewing machine", "telescope", "rug", "armchair"]
_PEOPLE = ["Mara", "Tobin", "Ilse", "Oren", "Priya", "Dario", "Wen", "Leona", "Kofi", "Sanne", "Ravi", "Elke"]


def _p_discount_tax(rng):
    good, price = rng.choice(_GOODS), Fraction(rng.randrange(40, 401, 5))
    d1, d2, tax = rng.choice([10, 15, 20, 25, 30, 40]), rng.choice([5, 10, 15, 20]), rng.choice([5, 6, 7, 8, 9, 10])
    x1 = price * (100 - d1) / 100
    x2 = x1 * (100 - d2) / 100
    x3 = x2 * (100 + tax) / 100
    question = (
        f"A {good} is priced at ${fmt(price)}. The shop takes {d1}% off, then takes a further {d2}% off the reduced price, "
        f"and finally adds {tax}% sales tax. What is the final price in dollars?"
    )
    steps = [
        f"After the {d1}% discount the price is {fmt(price)} × {100 - d1}/100 = {fmt(x1)}.",
        f"After the further {d2}% discount it is {fmt(x1)} × {100 - d2}/100 = {fmt(x2)}.",
        f"Adding {tax}% tax gives {fmt(x2)} × {100 + tax}/100 = {fmt(x3)}.",
    ]
    return question, steps, x3, "numeric", None


def _p_trains(rng):
    v1, v2 = rng.randrange(40, 125, 5), rng.randrange(40, 125, 5)
    delay = rng.choice([12, 24, 36, 48, 60])
    meet = delay + 12 * rng.randrange(1, 21)
    distance = Fraction(v1 * meet, 60) + Fraction(v2 * (meet - delay), 60)
    head = Fraction(v1 * delay, 60)
    question = (
        f"Two trains run toward each other on one line between stations {fmt(distance)} km apart. The first leaves its station at "
        f"{v1} km/h. The second leaves the other station {delay} minutes later at {v2} km/h. "
        f"How many minutes after the first train departs do the trains meet?"
    )
    steps = [
        f"In the first {delay} minutes the first train covers {v1} × {delay}/60 = {fmt(head)} km, leaving {fmt(distance)} − {fmt(head)} = {fmt(distance - head)} km.",
        f"Then the trains close the gap at {v1} + {v2} = {v1 + v2} km/h.",
        f"Closing {fmt(distance - head)} km takes {fmt(distance - head)}/{v1 + v2} hours = {fmt((distance - head) * 60 / (v1 + v2))} minutes.",
        f"In total: {delay} + {fmt((distance - head) * 60 / (v1 + v2))} = {meet} minutes after the first train departs.",
    ]
    return question, steps, Fraction(meet), "numeric", None


def _p_mixing(rng):
    a, b, water = rng.randrange(1, 13), rng.randrange(1, 13), rng.randrange(1, 11)
    p1, p2 = rng.randrange(5, 100, 5), rng.randrange(5, 100, 5)
    acid1, acid2 = Fraction(a * p1, 100), Fraction(b * p2, 100)
    total = a + b + water
    result = (acid1 + acid2) / total * 100
    question = (
        f"A chemist mixes {a} litres of a {p1}% acid solution with {b} litres of a {p2}% acid solution and then adds {water} litres "
        f"of pure water. What is the acid concentration of the final mixture, in percent? Give the exact value."
    )
    steps = [
        f"Acid from the first solution: {a} × {p1}/100 = {fmt(acid1)} litres.",
        f"Acid from the second solution: {b} × {p2}/100 = {fmt(acid2)} litres.",
        f"Total acid: {fmt(acid1)} + {fmt(acid2)} = {fmt(acid1 + acid2)} litres in {a} + {b} + {water} = {total} litres.",
        f"Concentration: {fmt(acid1 + acid2)}/{total} × 100 = {fmt(result)} percent.",
    ]
    return question, steps, result, "sympy", f"({a}*{p1} + {b}*{p2})/({a} + {b} + {water})"


def _p_inventory(rng):
    while True:
        start, sold1 = rng.randrange(200, 901), rng.randrange(20, 150)
        crates, per = rng.randrange(2, 9), rng.choice([12, 18, 24, 30, 36])
        pct = rng.choice([10, 20, 25, 40, 50])
        after2 = start - sold1 + crates * per
        if after2 * pct % 100 == 0:
            break
    sold3 = after2 * pct // 100
    returned = rng.randrange(5, 40)
    final = after2 - sold3 - returned
    question = (
        f"A hardware shop starts the week with {start} boxes of screws. On Monday it sells {sold1} boxes. On Tuesday it receives "
        f"{crates} crates of {per} boxes each. On Wednesday it sells {pct}% of the boxes it then has. On Thursday it sends "
        f"{returned} damaged boxes back to the supplier. How many boxes are left?"
    )
    steps = [
        f"After Monday: {start} − {sold1} = {start - sold1}.",
        f"Tuesday adds {crates} × {per} = {crates * per}, giving {after2}.",
        f"Wednesday sells {pct}% of {after2} = {sold3}, leaving {after2 - sold3}.",
        f"Thursday returns {returned}, leaving {after2 - sold3} − {returned} = {final}.",
    ]
    return question, steps, Fraction(final), "numeric", None


def _p_ages(rng):
    while True:
        young, k = rng.randrange(3, 21), rng.randrange(3, 7)
        m = rng.randrange(2, k)
        years = Fraction(young * (k - m), m - 1)
        if years.denominator == 1:
            break
    old_name, young_name = rng.sample(_PEOPLE, 2)
    old = k * young
    question = (
        f"{old_name} is {k} times as old as {young_name}. In {years} years, {old_name} will be {m} times as old as "
        f"{young_name}. How old is {old_name} now?"
    )
    steps = [
        f"Let {young_name}'s age be b, so {old_name} is {k}b.",
        f"In {years} years: {k}b + {years} = {m}(b + {years}), so {k}b + {years} = {m}b + {m * years}.",
        f"Then {'' if k - m == 1 else k - m}b = {m * years - years}, so b = {young}.",
        f"{old_name} is {k} × {young} = {old} years old.",
    ]
    return question, steps, Fraction(old), "numeric", None


def _p_work_rates(rng):
    while True:
        a, b, c = rng.randrange(2, 13), rng.randrange(2, 13), rng.randrange(3, 31)
        net = Fraction(1, a) + Fraction(1, b) - Fraction(1, c)
        if net > 0 and a != b:
            break
    question = (
        f"Pipe A alone fills a tank in {a} hours and pipe B alone fills it in {b} hours, while a drain empties a full tank in "
        f"{c} hours. Starting empty, with both pipes and the drain open, how many hours does the tank take to fill? "
        f"Give the exact value."
    )
    steps = [
        f"Pipe A fills 1/{a} of the tank per hour, pipe B fills 1/{b}, the drain empties 1/{c}.",
        f"Net rate: 1/{a} + 1/{b} − 1/{c} = {fmt(net)} of the tank per hour.",
        f"Time to fill: 1 ÷ {fmt(net)} = {fmt(1 / net)} hours.",
    ]
    return question, steps, 1 / net, "sympy", f"1/(1/{a} + 1/{b} - 1/{c})"


def _p_series(rng):
    k, low = rng.randrange(3, 20), rng.randrange(10, 201)
    high = low + rng.randrange(100, 901)
    first, last = math.ceil(low / k) * k, high // k * k
    count = (last - first) // k + 1
    total = count * (first + last) // 2
    question = f"What is the sum of all multiples of {k} between {low} and {high}, inclusive?"
    steps = [
        f"The smallest multiple of {k} that is at least {low} is {first}; the largest that is at most {high} is {last}.",
        f"There are ({last} − {first})/{k} + 1 = {count} of them.",
        f"Their sum is {count} × ({first} + {last})/2 = {total}.",
    ]
    return question, steps, Fraction(total), "numeric", None


def _p_unit_chain(rng):
    mph, minutes = rng.randrange(4, 15), rng.randrange(6, 91, 3)
    hours = Fraction(minutes, 60)
    miles = mph * hours
    km = miles * Fraction("1.609344")
    metres = km * 1000
    question = (
        f"A runner keeps a steady pace of {mph} miles per hour for {minutes} minutes. Taking 1 mile = 1.609344 km exactly, "
        f"how many metres does the runner cover?"
    )
    steps = [
        f"{minutes} minutes is {minutes}/60 = {fmt(hours)} hours.",
        f"Distance in miles: {mph} × {fmt(hours)} = {fmt(miles)} miles.",
        f"In kilometres: {fmt(miles)} × 1.609344 = {fmt(km)} km.",
        f"In metres: {fmt(km)} × 1000 = {fmt(metres)} m.",
    ]
    return question, steps, metres, "numeric", None


def _p_interest(rng):
    principal, rate, years = Fraction(rng.randrange(1_000, 20_001, 500)), rng.choice([2, 3, 4, 5, 6, 8, 10]), rng.choice([2, 3])
    withdraw = Fraction(rng.randrange(100, 951, 50))
    steps, balance = [], principal
    for year in range(1, years + 1):
        new = balance * (100 + rate) / 100
        steps.append(f"End of year {year}: {fmt(balance)} × {100 + rate}/100 = {fmt(new)}.")
        balance = new
    steps.append(f"After withdrawing {fmt(withdraw)}: {fmt(balance)} − {fmt(withdraw)} = {fmt(balance - withdraw)}.")
    question = (
        f"A saver deposits ${fmt(principal)} in an account paying {rate}% interest compounded once a year. After {years} years "
        f"she withdraws ${fmt(withdraw)}. How many dollars remain in the account?"
    )
    return question, steps, balance - withdraw, "numeric", None


def _p_round_trip(rng):
    distance, v1 = rng.randrange(30, 241), rng.randrange(30, 125, 5)
    v2 = rng.choice([v for v in range(30, 125, 5) if v != v1])
    t1, t2 = Fraction(distance, v1), Fraction(distance, v2)
    average = 2 * distance / (t1 + t2)
    question = (
        f"A courier drives {distance} km from one town to another at {v1} km/h and returns by the same road at {v2} km/h. "
        f"What is the average speed for the whole round trip, in km/h? Give the exact value."
    )
    steps = [
        f"Time out: {distance}/{v1} = {fmt(t1)} hours; time back: {distance}/{v2} = {fmt(t2)} hours.",
        f"Total time: {fmt(t1)} + {fmt(t2)} = {fmt(t1 + t2)} hours for 2 × {distance} = {2 * distance} km.",
        f"Average speed: {2 * distance} ÷ {fmt(t1 + t2)} = {fmt(average)} km/h.",
    ]
    return question, steps, average, "sympy", f"2*{distance}/({distance}/{v1} + {distance}/{v2})"


PROBLEM_TEMPLATES: list[tuple[str, Callable[[random.Random], Problem]]] = [
    ("discount_then_tax", _p_discount_tax),
    ("trains_meeting", _p_trains),
    ("mixing_concentrations", _p_mixing),
    ("inventory_week", _p_inventory),
    ("ages", _p_ages),
    ("work_rates", _p_work_rates),
    ("sum_of_multiples", _p_series),
    ("unit_conversion_chain", _p_unit_chain),
    ("compound_interest", _p_interest),
    ("round_trip_speed", _p_round_trip),
]


def problem_items(seed: int = PROBLEMS_SEED) -> list[dict]:
    rng = random.Random(seed)
    items, seen = [], set()
    per_template = PROBLEMS_DEPOSITED_PER_TEMPLATE + PROBLEMS_HELDOUT_PER_TEMPLATE
    for template, build in PROBLEM_TEMPLATES:
        made = 0
        while made < per_template:
            question, steps, answer, verifier, reference = build(rng)
            if question in seen:
                continue
            seen.add(question)
            text = fmt(answer)
            item = {
                "id": f"p{len(items) + 1:04d}",
                "template": template,
                "question": question,
                "solution": "\n".join([*steps, f"Answer: {text}"]),
                "answer": text,
                "verifier": verifier,
                "reference": reference or text,
                "split": "deposited" if made < PROBLEMS_DEPOSITED_PER_TEMPLATE else "heldout",
            }
            verifiers.validate(
                verifiers.VerifiedItem(item["question"], item["solution"], item["answer"], item["verifier"], item["reference"])
            )
            verdict = verifiers.judge(item["answer"], item["verifier"], item["reference"], item["question"])
            assert verdict.ok, f"{item['id']}: {verdict.detail}"
            items.append(item)
            made += 1
    return items


# --- files ------------------------------------------------------------------------------------


def _jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items).encode("utf-8")


def _readme(knowledge: list[dict], problems: list[dict], files: dict[str, bytes]) -> bytes:
    k_counts = Counter(it["template"] for it in knowledge)
    k_verifiers = Counter(it["verifier"] for it in knowledge)
    p_rows = []
    for template, _ in PROBLEM_TEMPLATES:
        rows = [it for it in problems if it["template"] == template]
        split = Counter(it["split"] for it in rows)
        p_rows.append(f"| `{template}` | {rows[0]['verifier']} | {split['deposited']} | {split['heldout']} |")
    text = f"""# Evaluation data

Generated by `scripts/make_datasets.py` (seeded `random.Random`, no network; every run writes the same
bytes). Do not edit these files by hand: change the generator and regenerate:

    .venv/bin/python -m scripts.make_datasets            # rewrite datasets/
    .venv/bin/python -m scripts.make_datasets --check    # exit 1 if datasets/ differs from a fresh run

`tests/test_datasets.py` regenerates into a temporary folder and compares bytes, so a checked-in file
that drifts from its generator fails the tests. Every item passes `verifiers.validate` and the one judge, `verifiers.judge` (the generator asserts both).

## knowledge.jsonl: {len(knowledge)} invented facts

Facts about invented entities (people, towns, compounds, ships, festivals, bridges, ...) that no model can
know. Every invented word is unique across the file and none is a prefix of another.

| field | meaning |
|---|---|
| `id` | `k0001` ... |
| `template` | which of the {len(KNOWLEDGE_TEMPLATES)} fact templates made it |
| `entity` | the invented entity, unique in the file |
| `fact` | one sentence: the text to deposit |
| `question` | the question the fact answers (unique in the file) |
| `paraphrases` | exactly two other wordings of the question; never deposited |
| `answer` | short (a name, a year, a number, a word); appears verbatim in `fact`, never in `question` |
| `verifier` | `exact` or `numeric`; the reference is the answer itself |

Verifiers: {", ".join(f"{k} {v}" for k, v in sorted(k_verifiers.items()))}. Templates ({KNOWLEDGE_PER_TEMPLATE} items each):
{", ".join(f"`{t}`" for t in k_counts)}.

## problems.jsonl: {len(problems)} solved multi-step problems

| field | meaning |
|---|---|
| `id` | `p0001` ... |
| `template` | which problem template made it |
| `question` | the problem |
| `solution` | worked step by step; the last line is `Answer: <answer>` |
| `answer` | exact: an integer, a terminating decimal, or a fraction `p/q` |
| `verifier` | `numeric`, or `sympy` where `reference` is the unsimplified expression the answer must equal |
| `reference` | what the judge (`verifiers.judge`) compares the answer with |
| `split` | `deposited` (goes into the store) or `heldout` (same template, new numbers, never deposited) |

| template | verifier | deposited | heldout |
|---|---|---|---|
{chr(10).join(p_rows)}

## sha256

| file | sha256 |
|---|---|
{chr(10).join(f"| `{name}` | `{hashlib.sha256(data).hexdigest()}` |" for name, data in files.items())}
"""
    return text.encode("utf-8")


def build_files() -> dict[str, bytes]:
    """The datasets/ folder as bytes, by file name."""
    knowledge, problems = knowledge_items(), problem_items()
    files = {"knowledge.jsonl": _jsonl(knowledge), "problems.jsonl": _jsonl(problems)}
    return files | {"README.md": _readme(knowledge, problems, files)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "datasets", help="folder to write (default: datasets/)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the folder differs from a fresh run")
    args = parser.parse_args(argv)
    files = build_files()
    if args.check:
        stale = [
            name for name, data in files.items() if not (args.out / name).is_file() or (args.out / name).read_bytes() != data
        ]
        for name in stale:
            print(f"{args.out / name} differs from a fresh run; regenerate with: .venv/bin/python -m scripts.make_datasets")
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
        print(f"{args.out / name}  {len(data):,} bytes  sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
