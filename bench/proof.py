"""Cost of the per-answer probe proof on the real model (issue 13 target 2: <= 10% of the answer's wall time).

`python -m bench.proof` from the repository root. Three artifacts (two items and a prefix longer than
the 512-token window), a warm-up, then N answers, each asked twice in alternating order: with the probe
proof (the prompt as probe chunk + rest, the probe row hashed and compared) and without (one prompt
chunk). Reports per answer the proof's own time (probe chunk forward + hash: an upper bound, those
tokens are computed anyway) over the answer's wall time, and the paired wall-time difference; medians.
Writes docs/bench/proof.json. Seconds on a shared machine are noisy; the ratios are taken side by side.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

from graft_core import generate, model, templates
from graft_core.capture import capture

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "proof.json"
ITEMS = (
    ("Who built the lighthouse of Varnek Isle?", "Osric Pellamy built it in 1874.", "Osric Pellamy"),
    ("What is the capital of Quenmora?", "The capital of the island of Quenmora is Tessaly Port.", "Tessaly Port"),
)
QUESTIONS = (
    "Who built the lighthouse of Varnek Isle?",
    "What is the capital of Quenmora?",
    "How many barrels did Ardel-7 carry?",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    lm = model.load()
    ids = [lm.tokenizer(templates.item_text(*it))["input_ids"] for it in ITEMS]
    long_text = " ".join(f"Entry {i}: the ship Ardel-{i} carried {i * 7} barrels of salt." for i in range(60)) + "\n"
    ids.append(lm.tokenizer(long_text)["input_ids"])
    arts = [capture(lm, x)[0] for x in ids]
    generate.answer(lm, [arts[0]], QUESTIONS[0], max_new_tokens=4)  # warm-up
    rows = []
    for i in range(args.answers):
        art, q = arts[i % 3], QUESTIONS[i % 3]
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {probe: generate.answer(lm, [art], q, max_new_tokens=args.max_new_tokens, probe=probe) for probe in order}
        on, off = got[True], got[False]
        assert on.proof.passed is True, on.proof
        assert on.token_ids == off.token_ids, "the chunk schedule changed the served tokens"
        rows.append(
            {
                "prefix_tokens": art.length,
                "decode_tokens": on.decode_tokens,
                "proof_s": on.proof.proof_s,
                "total_s_with_proof": on.total_s,
                "total_s_without": off.total_s,
                "proof_ratio": on.proof.proof_s / on.total_s,
                "paired_overhead": (on.total_s - off.total_s) / off.total_s,
                "logits_equal_across_schedules": on.logits_sha256 == off.logits_sha256,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "what": "probe proof cost per grafted answer, real model (Gemma 3 270M Q4_K_M GGUF dequantised to float32)",
        "command": "python -m bench.proof",
        "date": datetime.date.today().isoformat(),
        "model_fingerprint": lm.fingerprint,
        "answers": len(rows),
        "median_proof_ratio": statistics.median(r["proof_ratio"] for r in rows),
        "max_proof_ratio": max(r["proof_ratio"] for r in rows),
        "median_paired_overhead": statistics.median(r["paired_overhead"] for r in rows),
        "target_ratio": 0.10,
        "note": "proof_s = probe chunk forward + hash (upper bound); paired_overhead = wall time with proof vs one prompt "
        "chunk, same answer, alternating order; shared 2-core machine, seconds noisy",
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
