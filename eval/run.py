"""`make eval`: run the evaluation on the real model into a temporary store and write
docs/eval/results.json, the plots and docs/eval/own-set.md (the project's own set). Bounded by default (a seeded sample);
`--full` runs every item. Another model's run is written under its own name (`--model packaged:smollm2-135m-instruct
--out docs/eval/results-smollm2.json` writes own-set-smollm2.md and its plots beside the packaged Gemma's). Everything in the results file can be re-checked without the model by
`python cli.py replay-eval docs/eval/results.json` (and with it, byte for byte, by `--rerun`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import retrieval  # noqa: E402,F401  (faiss before torch)
from eval import harness  # noqa: E402

OUT = harness.ROOT / "docs" / "eval"


def write_results(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    d = harness.EvalConfig()
    p.add_argument("--full", action="store_true", help="every item (540 facts, 200 deposited + 60 held-out problems): hours here")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--knowledge", type=int, default=d.knowledge_n, help="sampled knowledge items")
    p.add_argument("--deposited", type=int, default=d.deposited_n, help="sampled deposited problems")
    p.add_argument("--heldout", type=int, default=d.heldout_n, help="sampled held-out problems")
    p.add_argument("--paraphrases", type=int, default=d.paraphrases, help="paraphrases asked per fact (0-2)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--no-compare", action="store_true", help="skip the measured no-graft baseline")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: the pinned KVGRAFT_THREADS, 2); part of the fingerprint",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=OUT / "results.json",
        help="results file; results-<name>.json gets its own page and plots (own-set-<name>.md)",
    )
    p.add_argument("--model", default=None, help="model (default the packaged Gemma 3 270M)")
    p.add_argument("--no-report", action="store_true", help="write the results file only (no plots, no page)")
    p.add_argument(
        "--recurring-only",
        action="store_true",
        help="run only the recurring case (sampling budget per problem) and merge it into --out",
    )
    p.add_argument("--no-recurring", action="store_true", help="skip the recurring case (it samples for about an hour here)")
    p.add_argument(
        "--recurring-budget",
        type=int,
        default=None,
        help="sampling budget per problem (tokens, every prompt and decode token); default KVGRAFT_RECURRING_BUDGET",
    )
    p.add_argument(
        "--recurring-batched",
        action="store_true",
        help="sample the recurring case in rounds decoded together (eval/sampling.py): the paper's budgets fit in one run",
    )
    p.add_argument(
        "--recurring-together",
        type=int,
        default=8,
        help="batched: attempts decoded together per round (one prompt computation; under fma16 any width gives each "
        "attempt's own bytes, under KVGRAFT_LINEAR=torch only the widths the Batcher checks are used)",
    )
    p.add_argument(
        "--recurring-gate-first",
        action="store_true",
        help="offer each candidate's verified solution to the gate before sampling it; a refused one is never sampled",
    )
    p.add_argument(
        "--reuse-baseline",
        type=Path,
        default=None,
        help="take the no-graft baseline records of the recurring case from this results file where they hash-check "
        "and the configuration matches (the sampling is seeded: recomputing gives the same records)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="recurring case: write the baseline records here after each problem, and take the ones already there "
        "(hash-checked, same configuration, model and problems) instead of sampling them again: a run that stops "
        "resumes where it stopped",
    )
    p.add_argument("--report-only", action="store_true", help="rewrite the plots and page from --out; run nothing")
    args = p.parse_args(argv)
    if args.report_only:
        from eval import report

        for path in report.write(json.loads(args.out.read_text(encoding="utf-8")), args.out.parent, args.out.name):
            print(f"wrote {path}")
        return 0
    if args.threads is not None:  # before the model loads: the pin reads it (graft_core/determinism.py)
        os.environ["KVGRAFT_THREADS"] = str(args.threads)
    from graft_core.determinism import pinned_threads

    cfg = harness.EvalConfig(
        seed=args.seed,
        knowledge_n=args.knowledge,
        deposited_n=args.deposited,
        heldout_n=args.heldout,
        full=args.full,
        max_new_tokens=args.max_new_tokens,
        paraphrases=args.paraphrases,
        compare=not args.no_compare,
        torch_threads=pinned_threads(),
    )
    import services

    if args.recurring_only:
        return _recurring_only(args, cfg)
    with tempfile.TemporaryDirectory(prefix="kvgraft-eval-") as home:
        lib = services.Library(home=home, model_name=args.model)
        results = harness.evaluate(lib, cfg, log=lambda m: print(m, flush=True))
        lib.close()
    write_results(results, args.out)
    if not args.no_recurring:
        _recurring_only(args, cfg)
        results = json.loads(args.out.read_text(encoding="utf-8"))
    print(json.dumps({"scores": results["scores"], "cost": results["cost"]}, indent=1))
    print(f"wrote {args.out}")
    if not args.no_report:
        from eval import report

        for path in report.write(results, args.out.parent, args.out.name):
            print(f"wrote {path}")
    return 0


def _recurring_only(args, cfg: harness.EvalConfig) -> int:
    """Run the recurring case alone in a fresh store; merge it into an existing results file."""
    import services
    import settings
    from eval import recurring

    budget = args.recurring_budget or settings.get("KVGRAFT_RECURRING_BUDGET")
    rc = recurring.RecurringConfig(
        seed=args.seed,
        budget=budget,
        batched=args.recurring_batched,
        together=args.recurring_together,
        gate_first=args.recurring_gate_first,
    )
    problems = harness.read_jsonl(harness.PROBLEMS)
    problems_sha256 = harness.file_sha256(harness.PROBLEMS)
    earlier = []  # (where, the earlier run's case): records reusable where they hash-check and everything matches
    if args.reuse_baseline is not None:
        earlier.append((args.reuse_baseline, json.loads(args.reuse_baseline.read_text(encoding="utf-8")).get("recurring")))
    if args.checkpoint is not None and args.checkpoint.exists():
        earlier.append((args.checkpoint, json.loads(args.checkpoint.read_text(encoding="utf-8"))))
    with tempfile.TemporaryDirectory(prefix="kvgraft-recurring-") as home:
        lib = services.Library(home=home, model_name=args.model)
        reuse = {}
        for where, previous in earlier:
            if not previous or previous.get("problems_sha256") != problems_sha256:
                print(f"recurring: {where} is of other problems; nothing reused from it", flush=True)
            elif previous.get("model_fingerprint") != lib.lm.fingerprint:
                print(f"recurring: {where} was sampled by another model fingerprint; nothing reused from it", flush=True)
            else:
                found = recurring.reusable(previous, rc)
                print(f"recurring: {len(found)} baseline records reusable from {where}", flush=True)
                reuse |= found
        stamp = {"model_fingerprint": lib.lm.fingerprint, "problems_sha256": problems_sha256}

        def checkpoint(partial: dict) -> None:
            write_results({**partial, **stamp}, args.checkpoint)

        case = recurring.run_case(
            lib,
            problems,
            rc,
            log=lambda m: print(m, flush=True),
            reuse=reuse,
            progress=checkpoint if args.checkpoint is not None else None,
        )
        fingerprint = lib.lm.fingerprint
        lib.close()
    case["model_fingerprint"] = fingerprint
    case["torch_threads"] = cfg.torch_threads
    case["problems_sha256"] = harness.file_sha256(harness.PROBLEMS)
    results = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    results["recurring"] = case  # replay-eval re-checks it offline (eval/recurring.check_case)
    write_results(results, args.out)
    print(json.dumps({"recurring_case": case["recurring_case"], "payback": case["payback"]}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
