"""Near misses and true paraphrases over the eval datasets, for measuring the relevance stage.

The store is the eval's own seeded sample (`harness.draw`): its knowledge items and deposited problems.
True positives: each stored item's question and, for knowledge, its two paraphrases. Near misses: the
question of every item of a stored template that is NOT in the store (a different entity, or the same
problem with other numbers, held-out problems included). Pure data; no model, no embedder.

    .venv/bin/python -m eval.near_miss [--seed N] [--knowledge N] [--deposited N]   # prints JSON
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from eval import harness


@dataclass(frozen=True)
class Query:
    question: str
    kind: str  # "knowledge" or "problem"
    source_id: str  # the dataset item the question comes from
    target_id: str | None  # the stored item that must be retrieved; None for a near miss (nothing may be)
    form: str  # "question", "paraphrase" or "near_miss"


@dataclass(frozen=True)
class NearMissSet:
    store: list[dict]  # {"id", "kind", "template", "question"}: the deposited items
    positives: list[Query]
    near_misses: list[Query]

    def as_dict(self) -> dict:
        return {
            "store": self.store,
            "positives": [asdict(q) for q in self.positives],
            "near_misses": [asdict(q) for q in self.near_misses],
            "counts": {
                "store": len(self.store),
                "positives": len(self.positives),
                "paraphrases": sum(q.form == "paraphrase" for q in self.positives),
                "near_misses": len(self.near_misses),
            },
        }


def build(cfg: harness.EvalConfig, knowledge: list[dict], problems: list[dict]) -> NearMissSet:
    """The set for the eval's sample under `cfg` (seeded; same rows every run)."""
    sample = harness.draw(cfg, knowledge, problems)
    stored = [("knowledge", r) for r in sample.knowledge] + [("problem", r) for r in sample.deposited]
    store = [{"id": r["id"], "kind": kind, "template": r["template"], "question": r["question"]} for kind, r in stored]
    positives: list[Query] = []
    for kind, r in stored:
        positives.append(Query(r["question"], kind, r["id"], r["id"], "question"))
        for p in r.get("paraphrases", [])[: cfg.paraphrases]:
            positives.append(Query(p, kind, r["id"], r["id"], "paraphrase"))
    in_store = {r["id"] for r in store}
    near: list[Query] = []
    for kind, rows in (("knowledge", knowledge), ("problem", problems)):
        templates = {r["template"] for k, r in stored if k == kind}
        for r in rows:
            if r["template"] in templates and r["id"] not in in_store:
                near.append(Query(r["question"], kind, r["id"], None, "near_miss"))
    return NearMissSet(store, positives, near)


def main(argv: list[str] | None = None) -> int:
    d = harness.EvalConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--knowledge", type=int, default=d.knowledge_n, help="stored knowledge items")
    p.add_argument("--deposited", type=int, default=d.deposited_n, help="stored problems")
    args = p.parse_args(argv)
    cfg = harness.EvalConfig(seed=args.seed, knowledge_n=args.knowledge, deposited_n=args.deposited)
    nm = build(cfg, harness.read_jsonl(harness.KNOWLEDGE), harness.read_jsonl(harness.PROBLEMS))
    print(json.dumps(nm.as_dict(), indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
