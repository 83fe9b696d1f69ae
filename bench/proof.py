"""Cost of the per-answer proof on the real model (target: <= 10% of the answer's wall time).

`python -m bench.proof` from the repository root. Four artifacts (two items, a prefix longer than the
512-token window, and the 2,048-token peer prefix), a warm-up, then per artifact its first answer in
the process (the `probe` proof: a second restore, the probe forward, two state hashes) and N later
answers, each asked twice in alternating order: with the `state` proof (one BLAKE3 of the served keys
and values) and without a proof. Reports per answer the proof's own time over the answer's wall time
and over its time to first token, the paired wall-time difference, and whether both served the same
bytes; medians per artifact. Writes docs/bench/proof.json. Seconds on a shared machine are noisy;
the ratios are taken side by side.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

from graft_core import generate, model, templates
from graft_core.capture import capture
from graft_core.proof import proven

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
    p.add_argument("--answers", type=int, default=6, help="later answers per artifact (each asked with and without)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    lm = model.load()
    ids = [lm.tokenizer(templates.item_text(*it))["input_ids"] for it in ITEMS]
    long_text = " ".join(f"Entry {i}: the ship Ardel-{i} carried {i * 7} barrels of salt." for i in range(60)) + "\n"
    ids.append(lm.tokenizer(long_text)["input_ids"])
    ids.append(lm.tokenizer((ROOT / "bench" / "llamacpp" / "prefix_2048.txt").read_text(encoding="utf-8"))["input_ids"])
    arts = [capture(lm, x)[0] for x in ids]
    questions = (*QUESTIONS, "Who was the harbour master of Quenmora?")
    generate.answer(lm, [arts[0]], QUESTIONS[0], max_new_tokens=4, probe=False)  # warm-up
    per_artifact = []
    for art, q in zip(arts, questions):
        first = generate.answer(lm, [art], q, max_new_tokens=args.max_new_tokens)
        assert first.proof.kind == "probe" and first.proof.passed is True, first.proof
        known = proven(first.proof)
        rows = []
        for i in range(args.answers):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {on: generate.answer(lm, [art], q, max_new_tokens=args.max_new_tokens, probe=on, proven=known) for on in order}
            on, off = got[True], got[False]
            assert on.proof.kind == "state" and on.proof.passed is True, on.proof
            rows.append(
                {
                    "decode_tokens": on.decode_tokens,
                    "proof_s": on.proof.proof_s,
                    "ttft_s": on.ttft_s,
                    "total_s_with_proof": on.total_s,
                    "total_s_without": off.total_s,
                    "proof_ratio": on.proof.proof_s / on.total_s,
                    "proof_ttft_ratio": on.proof.proof_s / on.ttft_s,
                    "paired_overhead": (on.total_s - off.total_s) / off.total_s,
                    "same_bytes_with_and_without": (on.output_sha256, on.logits_sha256) == (off.output_sha256, off.logits_sha256),
                }
            )
        entry = {
            "prefix_tokens": art.length,
            "first_use_probe_s": first.proof.proof_s,
            "first_use_probe_ratio": first.proof.proof_s / first.total_s,
            "median_proof_s": statistics.median(r["proof_s"] for r in rows),
            "median_proof_ratio": statistics.median(r["proof_ratio"] for r in rows),
            "max_proof_ratio": max(r["proof_ratio"] for r in rows),
            "median_proof_ttft_ratio": statistics.median(r["proof_ttft_ratio"] for r in rows),
            "median_paired_overhead": statistics.median(r["paired_overhead"] for r in rows),
            "same_bytes_with_and_without": all(r["same_bytes_with_and_without"] for r in rows),
            "rows": rows,
        }
        per_artifact.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "rows"}), flush=True)
    later = [r for e in per_artifact for r in e["rows"]]
    result = {
        "what": "per-answer proof cost, real model (Gemma 3 270M Q4_K_M GGUF dequantised to float32)",
        "command": f"python -m bench.proof --answers {args.answers} --max-new-tokens {args.max_new_tokens}",
        "date": datetime.date.today().isoformat(),
        "model_fingerprint": lm.fingerprint,
        "answers": len(later),
        "median_proof_ratio": statistics.median(r["proof_ratio"] for r in later),
        "max_proof_ratio": max(r["proof_ratio"] for r in later),
        "median_proof_ttft_ratio": statistics.median(r["proof_ttft_ratio"] for r in later),
        "same_bytes_with_and_without": all(r["same_bytes_with_and_without"] for r in later),
        "target_ratio": 0.10,
        "note": "later answers carry the state proof (BLAKE3 of the served keys/values vs the state the first-use probe "
        "proved); proof_s is that hash; the first answer per artifact in a process pays the probe (first_use_probe_s). "
        "paired_overhead = wall time with vs without the proof, same answer, alternating order; shared 2-core machine",
        "per_artifact": per_artifact,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "per_artifact"}, indent=1))


if __name__ == "__main__":
    main()
