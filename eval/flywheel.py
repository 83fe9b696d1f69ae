"""The flywheel from an empty store, measured: a seeded stream of held-out GSM-Symbolic problems, each answered with
what the store holds, and a wrong answer worked on by `solve` (the model's own greedy then sampled attempts, judged
against the reference within a stated budget) whose accepted solution goes through the gate into the store, where
later problems of the same template meet it as a worked example. Beside it the same stream with nothing deposited.

`python -m eval.flywheel --work W [--stream flywheel|alone] [--together 8]` appends one record a problem to
W/flywheel-STREAM.jsonl (resumable; the flywheel stream's store is W/flywheel-store, never the transfer eval's),
`--together` consecutive problems at a time (a window, as concurrent users: each meets the store as its window
began). `curve`, `windowed` and `svg` are pure: accuracy of the first answer and tokens per problem over the stream,
and the learning curve's chart, from the records alone.
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


def windowed(rows: list[dict], width: int = 25) -> list[dict]:
    """First-answer accuracy over the last `width` problems at each point of the stream (the learning curve's
    shape: the cumulative one moves less and less as the stream grows)."""
    ordered = sorted(rows, key=lambda r: r["position"])
    out = []
    for i in range(width, len(ordered) + 1):
        part = ordered[i - width : i]
        out.append({"problems": i, "accuracy": round(sum(r["first_ok"] for r in part) / width, 4)})
    return out


def svg(curves: dict[str, list[dict]], key: str = "accuracy", title: str = "", width: int = 640, height: int = 320) -> str:
    """A line chart of `key` over `problems` for each stream (pure: the committed figure is a function of the
    records). No plotting library: the chart is a few SVG paths."""
    colours = {"flywheel": "#1f77b4", "alone": "#d62728"}
    pad, xs = 48, [p["problems"] for c in curves.values() for p in c]
    ys = [p[key] for c in curves.values() for p in c]
    if not xs:
        raise ValueError("no points to draw: run the streams first")
    x0, x1 = min(xs), max(xs)
    y1 = 1.0 if key == "accuracy" else max(ys) * 1.05 or 1.0

    def at(x: float, y: float) -> str:
        px = pad + (x - x0) / max(x1 - x0, 1) * (width - 2 * pad)
        py = height - pad - y / y1 * (height - 2 * pad)
        return f"{px:.1f},{py:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<text x="{pad}" y="20">{title}</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2:.0f}" y="{height - 12}" text-anchor="middle">problems in the stream</text>',
        f'<text x="12" y="{height / 2:.0f}" transform="rotate(-90 12 {height / 2:.0f})" text-anchor="middle">{key.replace("_", " ")}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        parts.append(
            f'<text x="{pad - 6}" y="{height - pad - frac * (height - 2 * pad) + 4:.1f}" text-anchor="end">{frac * y1:g}</text>'
        )
    parts.append(f'<text x="{pad}" y="{height - pad + 16}" text-anchor="middle">{x0}</text>')
    parts.append(f'<text x="{width - pad}" y="{height - pad + 16}" text-anchor="middle">{x1}</text>')
    for i, (name, pts) in enumerate(sorted(curves.items())):
        colour = colours.get(name, "#555555")
        path = " ".join(("M" if j == 0 else "L") + at(p["problems"], p[key]) for j, p in enumerate(pts))
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{width - pad - 120}" y="{pad + 16 * i}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def run(lib, items: list[dict], out: Path, flywheel: bool, together: int, log=print) -> None:
    """Answer the stream's problems not yet in `out`, `together` consecutive ones at a time (a window: each meets
    what the store held when its window began, as concurrent users do; later windows meet what it deposited),
    appending the window's records in stream order."""
    from concurrent.futures import ThreadPoolExecutor

    done = {r["id"] for r in benchmark.read_jsonl(out)}
    todo = [(i, it) for i, it in enumerate(items) if it["id"] not in done]
    if together > 1:
        lib.start_decoding_together()
    name = "flywheel" if flywheel else "alone"
    with ThreadPoolExecutor(max(together, 1)) as pool:
        for w in range(0, len(todo), max(together, 1)):
            window = todo[w : w + max(together, 1)]
            rows = list(pool.map(lambda p: record(lib, p[1], p[0], flywheel), window))
            for (i, it), r in zip(window, rows, strict=True):
                benchmark.append_jsonl(out, r)
                log(
                    f"{name} {i + 1}/{len(items)} {it['id']}: first {'ok' if r['first_ok'] else 'wrong'} ({r['first_mode']}), "
                    f"{r['source']}, {r['tokens']} tokens, {r['seconds']} s"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--stream", choices=STREAMS, default="flywheel")
    p.add_argument("--n", type=int, default=100, help="templates (two instances of each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--together", type=int, default=8, help="consecutive problems answered at once (a window)")
    args = p.parse_args(argv)
    import services

    args.work.mkdir(parents=True, exist_ok=True)
    items = stream(args.work, args.n, args.seed)
    lib = services.Library(home=args.work / f"{args.stream}-store")
    out = args.work / f"flywheel-{args.stream}.jsonl"
    run(lib, items, out, args.stream == "flywheel", args.together, lambda m: print(m, flush=True))
    lib.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
