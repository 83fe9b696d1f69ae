"""The relevance stage after FAISS: term extraction, decisions, and the near-miss sets (held-out file in
tests/data, distinct from the eval's set built by eval/near_miss.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval import DEFAULT_THRESHOLD, Hit, SentenceEmbedder, VectorIndex
from retrieval.relevance import STRICT_THRESHOLD, decide, distinctive_terms, is_rare, normalise, relevant_hits

ROOT = Path(__file__).resolve().parent.parent
HAND_SET = Path(__file__).resolve().parent / "data" / "near_miss.jsonl"
SEED = ROOT / "library_seed" / "items.jsonl"
MARROWIND = "What is the capital of the Duchy of Marrowind?"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---- term extraction -------------------------------------------------------------------------


def test_numbers_are_exact_strings():
    assert distinctive_terms("What is 17 x 24?").numbers == {"17", "24"}
    assert distinctive_terms("A rug is priced at $1,215.50 with 10% off.").numbers == {"1215.50", "10"}
    assert distinctive_terms("Who founded Velmora?").numbers == frozenset()


def test_names_are_capitalised_words_not_at_a_sentence_start():
    t = distinctive_terms("Who founded the town of Harlow? Give the name.")
    assert t.names == {"harlow"}  # "Who" and "Give" start sentences; "Harlow" is one WordPiece, so a name
    assert distinctive_terms("How long is the Great Wall of China?").names == {"great", "wall", "china"}
    assert distinctive_terms("Paris is the capital of which country?").all == frozenset()


def test_invented_words_are_rare_wherever_they_stand():
    assert is_rare("kessium") and is_rare("Velmora") and is_rare("stonemason")
    assert not is_rare("water") and not is_rare("moons") and not is_rare("France")
    assert distinctive_terms("What is the boiling point of kessium?").rare == {"kessium"}
    assert distinctive_terms("Soltrite nitrate was first isolated by which chemist?").rare == {"soltrite"}


def test_inflection_possessive_and_plural():
    assert [normalise(w) for w in ("Velmora's", "moons", "Quillon’s", "glass", "was")] == [
        "velmora",
        "moon",
        "quillon",
        "glass",
        "was",
    ]
    assert decide("What is kessium's boiling point?", "What is the boiling point of kessium?", 0.6).relevant
    assert decide("Which colour are Quillon moths?", "What colour is the Quillon moth?", 0.6).relevant


# ---- decisions -------------------------------------------------------------------------------


def test_capital_of_france_is_not_the_marrowind_item():
    rel = decide("What is the capital of France?", MARROWIND, 0.546)
    assert not rel.relevant
    assert rel.missing == ("duchy", "marrowind")
    assert rel.reason == "the question lacks the item's 'duchy', 'marrowind'"
    kept = decide("Which city is the capital of the Duchy of Marrowind?", MARROWIND, 0.951)
    assert kept.relevant and kept.matched == ("duchy", "marrowind"), kept


def test_changed_numbers_are_refused_either_way():
    assert decide("What is 17 x 24?", "What is 17 x 23?", 0.937).missing == ("23",)
    assert decide("What is 17 x 23 x 2?", "What is 17 x 23?", 0.9).extra == ("2",)
    assert decide("What is 23 x 17?", "What is 17 x 23?", 0.9).relevant


def test_items_without_distinctive_terms_need_the_strict_bar():
    item = "What is the boiling point of water?"
    low = decide("What is the freezing point of water?", item, 0.781)
    assert not low.relevant and low.reason == f"no distinctive terms; cosine 0.781 < {STRICT_THRESHOLD}"
    assert decide("What is the boiling point of water?", item, 1.0).relevant
    # a rare word the item lacks counts against an item that has no terms of its own
    assert decide("What is the boiling point of glorbium?", item, 0.99).extra == ("glorbium",)


def test_relevant_hits_keeps_order_and_drops_near_misses():
    items = {"a": MARROWIND, "b": "What is the capital of France?", "c": "Who founded the town of Velmora?"}
    hits = [Hit("a", 0.9, 1), Hit("b", 0.8, 2), Hit("c", 0.5, 3)]
    kept = relevant_hits("What is the capital of France?", [(h, items[h.artifact_id]) for h in hits])
    assert [h.artifact_id for h, _ in kept] == ["b"]
    assert kept[0][1].relevant


def test_module_imports_no_torch():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('relevance', {str(ROOT / 'retrieval' / 'relevance.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['relevance'] = m; spec.loader.exec_module(m)\n"
        "assert not m.decide('What is the capital of France?', 'What is the capital of the Duchy of Marrowind?', 0.6).relevant\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    assert importlib.util.find_spec("torch") is not None  # the check below means something only with torch present
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- the held-out near-miss file, through the real embedder and index -----------------------


@pytest.fixture(scope="module")
def hand_results():
    rows = _rows(HAND_SET)
    items = [r["question"] for r in _rows(SEED)]
    items += [r["item"] for r in rows if not r["library"] and r["item"] not in items]
    embedder = SentenceEmbedder()
    index = VectorIndex(embedder.dim, embedder.embedder_id)
    for i, vec in enumerate(embedder.embed_batch(items)):
        index.add(str(i), vec)
    out = []
    for r, vec in zip(rows, embedder.embed_batch([r["question"] for r in rows]), strict=True):
        hits = index.search(vec, k=3, threshold=DEFAULT_THRESHOLD)
        kept = relevant_hits(r["question"], [(h, items[int(h.artifact_id)]) for h in hits])
        out.append((r, [items[int(h.artifact_id)] for h in hits], [(items[int(h.artifact_id)], rel) for h, rel in kept]))
    return out


def test_hand_set_shape():
    rows = _rows(HAND_SET)
    seed = {r["question"] for r in _rows(SEED)}
    refuse = [r for r in rows if r["expect"] == "refuse"]
    keep = [r for r in rows if r["expect"] == "keep" and r["library"]]
    assert len(refuse) >= 40 and len(keep) == 2 * len(seed)
    assert {r["item"] for r in keep} == seed  # two true paraphrases per built-in item
    assert not {r["question"] for r in rows} & seed  # never the stored wording verbatim


def test_every_near_miss_is_refused(hand_results):
    grafted = [(r["question"], kept[0][0], kept[0][1].reason) for r, _, kept in hand_results if r["expect"] == "refuse" and kept]
    assert not grafted, grafted
    # the set is not trivial: without the second stage FAISS would graft most of these
    proposed = sum(bool(hits) for r, hits, _ in hand_results if r["expect"] == "refuse")
    assert proposed >= 30, proposed


def test_every_true_paraphrase_keeps_its_item_first(hand_results):
    lost = [
        (r["question"], r["item"], hits, kept)
        for r, hits, kept in hand_results
        if r["expect"] == "keep" and (not kept or kept[0][0] != r["item"])
    ]
    assert not lost, lost


# ---- the eval's near-miss set (pure: decide on every pair that matters) ------------------------


def test_eval_near_miss_set_rates():
    from eval import harness, near_miss

    cfg = harness.EvalConfig()
    nm = near_miss.build(cfg, harness.read_jsonl(harness.KNOWLEDGE), harness.read_jsonl(harness.PROBLEMS))
    store_ids = {r["id"] for r in nm.store}
    assert len(nm.store) == cfg.knowledge_n + cfg.deposited_n
    assert len(nm.near_misses) >= 200 and not {q.source_id for q in nm.near_misses} & store_ids
    assert sum(q.form == "paraphrase" for q in nm.positives) == 2 * cfg.knowledge_n
    by_id = {r["id"]: r for r in nm.store}
    kept_own = sum(decide(q.question, by_id[q.target_id]["question"], DEFAULT_THRESHOLD).relevant for q in nm.positives)
    # a near miss is grafted if any stored item of its kind passes, even at a perfect cosine (worst case)
    grafted = [
        q.question
        for q in nm.near_misses
        if any(r["kind"] == q.kind and decide(q.question, r["question"], 1.0).relevant for r in nm.store)
    ]
    assert kept_own / len(nm.positives) >= 0.98, kept_own
    assert len(grafted) / len(nm.near_misses) <= 0.05, grafted[:10]


def test_eval_near_miss_cli_prints_json():
    out = subprocess.run(
        [sys.executable, "-m", "eval.near_miss", "--knowledge", "18", "--deposited", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    d = json.loads(out.stdout)
    assert d["counts"]["store"] == 28 and d["counts"]["near_misses"] == len(d["near_misses"]) > 0


# ---- worked examples: the same shape with other names and numbers ------------------------------------------

ORIGINAL = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. How many eggs does she sell?"
)
SIBLING = "Priya's hens lay 21 eggs per day. She eats two for breakfast and bakes muffins with five. How many eggs does she sell?"
OTHER = "A train leaves Leeds at 9 and travels 120 miles at 60 miles per hour. When does it arrive in York?"
WORKED = "She uses 3 + 4 = 7 eggs.\nShe sells 16 - 7 = 9 eggs.\n#### 9"


def test_a_sibling_is_a_worked_example_and_another_shape_is_not():
    from retrieval.relevance import EXAMPLE_SHAPE, decide_example

    assert not decide(SIBLING, ORIGINAL, 0.9).relevant  # as a fact it is a near miss: other numbers and names
    got = decide_example(SIBLING, ORIGINAL)
    assert got.relevant and got.use == "example" and got.reason.startswith("a worked example of the same shape: 0.")
    other = decide_example(OTHER, ORIGINAL)
    assert not other.relevant and other.reason.endswith(f"(< {EXAMPLE_SHAPE})")


def _worked_library(tmp_path, tiny_gemma):
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path / "home", lm=tiny_gemma, embedder=HashEmbedder())
    item = lib.deposit_item(ORIGINAL, WORKED, "9", "numeric", "9")
    fact = lib.deposit_item("How many eggs did Janet's ducks lay on 3 May?", "They laid 16 eggs.", "16", "numeric", "16")
    return lib, item, fact


def test_the_answer_grafts_a_verified_worked_example_for_a_sibling_and_says_so(tmp_path, tiny_gemma):
    """A question of the item's shape with other names and numbers is offered the verified worked solution (its
    chain grafted, `use` "example" in the evidence); with examples off, or for a one-line fact, the near miss is
    still dropped."""
    from services import AnswerOptions

    lib, item, fact = _worked_library(tmp_path, tiny_gemma)
    try:
        r = lib.answer(SIBLING, AnswerOptions(threshold=-1.0, k=2, max_new_tokens=2))
        kept = [h for h in r.retrieved if h.relevant]
        assert [(h.id, h.use) for h in kept] == [(item.id, "example")] and r.artifact_ids == (item.id,)
        assert r.note.startswith("a verified worked example of the question's shape: ")
        off = lib.answer(SIBLING, AnswerOptions(threshold=-1.0, k=2, max_new_tokens=2, examples=False))
        assert off.artifact_ids == () and not any(h.relevant for h in off.retrieved)
        near = lib.answer("How many eggs did Priya's hens lay on 9 May?", AnswerOptions(threshold=-1.0, k=2, max_new_tokens=2))
        assert fact.id not in near.artifact_ids  # a fact is never offered as an example
    finally:
        lib.close()
