"""`cli.py judge ANSWER --verifier V --reference R [--question Q] [--json]` and `cli.py judge --jsonl FILE`:
the one judge (`verifiers.judge`) from the command line, so a depositor sees why the gate refused an answer and
anyone can re-judge stored outputs. No model and no store: the judge reads text.

One answer: prints the verdict, the value read and why; exit 0 accepted, 1 refused, 2 an input error. `--jsonl`
reads one JSON object per line (`answer`, `verifier`, `reference`, optional `question`; `-` is stdin) and
prints one JSON verdict per line, in order, with `ok`, `value`, `why` (and `line`, `error` for a line that
could not be judged); exit 0 when every line was judged, 2 when one could not be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _verdict(answer: str, verifier: str, reference: str, question: str) -> dict:
    import verifiers

    v = verifiers.judge(answer, verifier, reference, question)
    return {"ok": v.ok, "value": v.value, "why": v.detail, "verifier": v.verifier, "judge": verifiers.JUDGE}


def _line_verdict(n: int, text: str) -> dict:
    from errors import InvalidInput

    try:
        obj = json.loads(text)
    except ValueError as e:
        return {"line": n, "ok": False, "value": None, "why": "", "error": f"not JSON: {e}"}
    if not isinstance(obj, dict):
        return {"line": n, "ok": False, "value": None, "why": "", "error": "not a JSON object"}
    fields = {k: obj.get(k, "" if k == "question" else None) for k in ("answer", "verifier", "reference", "question")}
    wrong = [k for k, v in fields.items() if not isinstance(v, str)]
    if wrong:
        return {"line": n, "ok": False, "value": None, "why": "", "error": f"{', '.join(wrong)} must be text"}
    try:
        return {"line": n, **_verdict(fields["answer"], fields["verifier"], fields["reference"], fields["question"])}
    except InvalidInput as e:
        return {"line": n, "ok": False, "value": None, "why": "", "error": str(e)}


def cmd_judge(args) -> int:
    if args.jsonl is not None:
        if args.answer is not None or args.verifier is not None or args.reference is not None:
            raise SystemExit("error: --jsonl reads answer, verifier and reference from each line; give no ANSWER or --verifier")
        stream = sys.stdin if args.jsonl == "-" else Path(args.jsonl).open(encoding="utf-8")
        failed = False
        with stream:
            for n, text in enumerate(stream, 1):
                if not text.strip():
                    continue
                out = _line_verdict(n, text)
                failed |= "error" in out
                print(json.dumps(out, ensure_ascii=False), flush=True)
        return 2 if failed else 0
    missing = [f for f in ("answer", "verifier", "reference") if getattr(args, f) is None]
    if missing:
        raise SystemExit(
            f"error: judge needs {' and '.join('ANSWER' if f == 'answer' else '--' + f for f in missing)} (or --jsonl FILE)"
        )
    out = _verdict(args.answer, args.verifier, args.reference, args.question or "")
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        print(f"{'accepted' if out['ok'] else 'refused'}: {out['why']}")
        print(f"value read: {out['value']!r}" if out["value"] is not None else "value read: none")
    return 0 if out["ok"] else 1


def register(subparsers) -> None:
    j = subparsers.add_parser("judge", help="the one judge on an answer (or a JSON-lines file of them): verdict, value read, why")
    j.add_argument("answer", nargs="?", help="the answer text (a value, a sentence or a worked solution)")
    j.add_argument("--verifier", help="exact, numeric, sympy or attested")
    j.add_argument("--reference", help="what the answer must assert")
    j.add_argument("--question", default="", help="the question (its units are the answer's)")
    j.add_argument(
        "--jsonl", metavar="FILE", help="judge every line of FILE ('-' for stdin): answer, verifier, reference[, question]"
    )
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=cmd_judge)
