"""Re-decide, without the model, what the relevance stage does to a stored eval run: for each grafted
answer, is the hit that was grafted still the first hit the stage keeps? When it is, the graft and so
the output are the same bytes (deterministic decoding), and the recorded verdict stands.

    python -m eval.relevance_check [docs/eval/results.json]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from eval import harness
from retrieval import relevance


def check(results: dict) -> dict:
    """Counts per condition: answers whose first kept hit is the grafted one (and how many of those were
    correct), answers with every hit dropped, answers whose first kept hit changes."""
    rows = {r["id"]: r for p in results["data_roles"].values() for r in harness.read_jsonl(harness.resolve(p))}
    question_of = {d["artifact"]: rows[d["item"]]["question"] for d in results["deposits"]}
    out: dict[str, Counter] = {}
    for o in results["outputs"]:
        if not o["retrieved"]:
            continue
        hits = o["retrieved"]
        kept = [h for h in hits if relevance.decide(o["query"], question_of[h["id"]], h["score"]).relevant]
        c = out.setdefault(o["condition"], Counter())
        if not kept:
            c["all_dropped"] += 1
        elif kept[0]["id"] == hits[0]["id"]:
            c["same_graft"] += 1
            c["same_graft_correct"] += int(o["correct"])
        else:
            c["other_graft"] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]) if args else harness.ROOT / "docs" / "eval" / "results.json"
    print(json.dumps(check(json.loads(path.read_text(encoding="utf-8"))), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
