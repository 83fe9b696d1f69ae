"""The flywheel from an empty store, measured: a seeded stream of held-out GSM-Symbolic problems, each answered with
what the store holds, and a wrong answer worked on by `solve` (the model's own greedy then sampled attempts, judged
against the reference within a stated budget) whose accepted solution goes through the gate into the store, where
later problems of the same template meet it as a worked example. Beside it the same stream with nothing deposited.

`python -m eval.flywheel --work W [--stream flywheel|alone]` appends one record a problem to W/flywheel-STREAM.jsonl
(resumable; the flywheel stream's store is W/flywheel-store, never the transfer eval's). `curve` is pure: accuracy
of the first answer and tokens per problem, cumulative over the stream, from the records alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from random import Random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import retrieval  # noqa: E402,F401  (faiss before torch)
from eval import benchmark, gsm_run  # noqa: E402

STREAM_SEEDS = (1, 2)  # two new instances of every template (seeds the transfer eval's held-out set does not use)
BUDGET = 2048  # tokens a problem's solve may spend (prompt + decode, every attempt): a stated setting
MAX_NEW_TOKENS = 384  # per attempt, as every transfer condition
STREAMS = ("flywheel", "alone")


def stream(work: Path, n: int, seed: int = 0) -> list[dict]:
    """The held-out problems of STREAM_SEEDS' instances of the first `n` templates, in a seeded order."""
    items = [it for s in STREAM_SEEDS for it in gsm_run.items(work, s, ["numbers"], n)["numbers"][:n]]
    Random(seed).shuffle(items)
    return items


def record(lib, item: dict, position: int, flywheel: bool) -> dict:
    """One problem of the stream: the first answer (with what the store holds, or alone) and, on the flywheel
    stream, what solve spent and deposited."""
    t0 = time.perf_counter()
    s = lib.solve(
        item["question"],
        item["verifier"],
        item["reference"],
        budget=BUDGET,
        attempts=None if flywheel else 1,
        max_new_tokens=MAX_NEW_TOKENS,
        admin=True,
        library=flywheel,
    )
    if not s.attempts:
        raise ValueError(f"{item['id']}: the question alone is over the budget of {BUDGET} tokens")
    first = s.attempts[0]
    return {
        **{k: item[k] for k in ("id", "template", "seed", "question", "verifier", "reference")},
        "position": position,
        "stream": "flywheel" if flywheel else "alone",
        "first_answer": first.answer,
        "first_ok": bool(first.passed),
        "first_mode": first.mode,
        "first_artifacts": list(first.artifact_ids),
        "solved": s.solved,
        "source": s.source,
        "deposited": s.id if s.source == "model" else None,
        "attempts": len(s.attempts),
        "tokens": s.tokens_spent,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def curve(rows: list[dict]) -> list[dict]:
    """Cumulative first-answer accuracy and tokens per problem over the stream, in stream order."""
    out, ok, tokens = [], 0, 0
    for i, r in enumerate(sorted(rows, key=lambda r: r["position"]), 1):
        ok += r["first_ok"]
        tokens += r["tokens"]
        out.append({"problems": i, "accuracy": round(ok / i, 4), "tokens_per_problem": round(tokens / i, 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--stream", choices=STREAMS, default="flywheel")
    p.add_argument("--n", type=int, default=100, help="templates (two instances of each)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import services

    args.work.mkdir(parents=True, exist_ok=True)
    items = stream(args.work, args.n, args.seed)
    lib = services.Library(home=args.work / f"{args.stream}-store")
    out = args.work / f"flywheel-{args.stream}.jsonl"
    done = {r["id"] for r in benchmark.read_jsonl(out)}
    for i, it in enumerate(items):
        if it["id"] in done:
            continue
        r = record(lib, it, i, args.stream == "flywheel")
        benchmark.append_jsonl(out, r)
        print(
            f"{args.stream} {i + 1}/{len(items)} {it['id']}: first {'ok' if r['first_ok'] else 'wrong'} ({r['first_mode']}), "
            f"{r['source']}, {r['tokens']} tokens, {r['seconds']} s",
            flush=True,
        )
    lib.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
