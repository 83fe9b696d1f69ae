"""`cli.py replay-eval FILE [--rerun [--sample K]]`: register(subparsers) adds the command; it calls
eval.recheck.recheck (docs/eval/results.json) or, for the benchmark's file (docs/eval/gsm-results.json, format
kvgraft-gsm-eval/1), eval.gsm_recheck.recheck, and formats the report. Exit 0 when everything matches, 1 on any
mismatch. Records scored by another judge than the current one are listed with the current judge's verdict
(eval/rejudge.py, eval/gsm_recheck.py), not counted as mismatches."""

from __future__ import annotations

import json


def cmd_replay_eval(args) -> int:
    from eval import gsm_recheck, recheck, transfer_report

    with open(args.file, encoding="utf-8") as f:
        head = f.read(4096)
    if f'"{gsm_recheck.FORMAT}"' in head:
        rep = gsm_recheck.recheck(args.file, rerun_model=args.rerun, sample=args.sample)
    elif f'"{transfer_report.FORMAT}"' in head:
        rep = transfer_report.recheck_file(args.file, rerun_model=args.rerun, sample=args.sample)
    else:
        rep = recheck.recheck(args.file, rerun_model=args.rerun)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        checked = ", ".join(f"{n} {k}" for k, n in rep.checks.items())
        print(f"{'OK' if rep.ok else 'MISMATCH'}: {rep.path}: {rep.outputs} outputs; checked {checked}")
        for note in rep.notes:
            print(f"note: {note}")
        if rep.rejudged_summary:
            print(f"re-judged with {rep.rejudged_summary['judge']}: {json.dumps(rep.rejudged_summary)}")
        for line in rep.rejudged[:50]:
            print(f"scored by another judge: {line}")
        if len(rep.rejudged) > 50:
            print(f"... and {len(rep.rejudged) - 50} more records scored by another judge")
        for p in rep.problems[:50]:
            print(f"mismatch: {p}")
        if len(rep.problems) > 50:
            print(f"... and {len(rep.problems) - 50} more mismatches")
    return 0 if rep.ok else 1


def register(subparsers) -> None:
    r = subparsers.add_parser(
        "replay-eval", help="re-check an eval results file (hashes, scores); --rerun recomputes with the model"
    )
    r.add_argument("file", help="results file written by make eval (docs/eval/results.json)")
    r.add_argument(
        "--rerun", action="store_true", help="recompute every output with the model and compare token ids byte for byte"
    )
    r.add_argument(
        "--sample",
        type=int,
        default=1,
        metavar="K",
        help="with --rerun: the benchmark file's first K seeded sampling rounds of every recurring problem; the transfer "
        "file's first K problems of each condition",
    )
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_replay_eval)
