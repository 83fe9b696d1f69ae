"""HF's math-verify on the judge's labelled set: one verdict per drawn output, for eval.labels to compare with
the labels beside the one judge's (a measurement only: nothing in kvgraft scores with it).

Runs under any Python with `math-verify` installed (`pip install math-verify==0.9.0`; it pins its own sympy, so
use a separate virtual environment) and imports nothing from kvgraft:
    python scripts/math_verify_labels.py docs/eval/labels/drawn.jsonl docs/eval/labels/drawn-2.jsonl > docs/eval/labels-math-verify.jsonl
The gold answer is the reference as written (an expression for the sympy kind); exact-kind (text) items are
skipped (math-verify compares mathematics). Each answer is parsed with the default extraction (LaTeX and plain
expressions; math-verify takes the last match) and verified against the parsed gold.
"""

import json
import sys

from math_verify import parse, verify


def main(paths: list[str]) -> int:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                r = json.loads(line)
                if r["verifier"] not in ("numeric", "sympy"):
                    continue
                gold = parse(r["reference"].replace(",", ""), parsing_timeout=None)
                try:
                    got = parse(r["answer"], parsing_timeout=None)
                    ok = bool(verify(gold, got, timeout_seconds=None))
                    read = [str(x) for x in got][:2]
                except Exception as e:  # a parse failure is a refusal, reported with its kind
                    ok, read = False, [f"error: {type(e).__name__}"]
                print(json.dumps({"id": r["id"], "ok": ok, "read": read}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
