"""The long fuzz of the artifact reader: the same mutation strategy as `make test`, 10,000+ cases.

Real artifact bytes from the tiny Gemma-3 and Llama models (a root, a chain child, another model's
root) are mutated (bit flips anywhere or in the header, byte overwrites, splices between artifacts,
truncations, a rewritten 8-byte length, one header field replaced, deleted or nudged, a wholly
random JSON header, an integer header field respelt as int() would still read it ("-0", " 1_0 "),
or a 0 dimension beside huge ones) and handed to `codec.loads`. Every case must end in a `KvgraftError` subclass or
a valid artifact that writes back; any other exception, or a case running over 10 s, fails the run.

    python -m scripts.fuzz_long --cases 10000 --seed 1     # the figure in docs/RELIABILITY.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    import retrieval  # noqa: F401  (faiss before torch: see retrieval/__init__.py)
    from graft_core import model, tiny
    from tests.test_reliability import MUTATIONS, base_artifacts, check_reader, mutated

    with tempfile.TemporaryDirectory(prefix="kvgraft-fuzz-") as tmp:
        gemma = model.load(str(tiny.build("gemma3", Path(tmp) / "gemma3")))
        llama = model.load(str(tiny.build("llama", Path(tmp) / "llama")), machine_bound=True)
    bases = list(base_artifacts(gemma, llama).values())
    outcomes: Counter = Counter()
    by_kind: dict[str, Counter] = {k: Counter() for k in MUTATIONS}

    @seed(args.seed)
    @settings(
        max_examples=args.cases,
        deadline=timedelta(seconds=5),
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=mutated(bases), as_bytearray=st.booleans())
    def run(case, as_bytearray):
        kind, data = case
        got = check_reader(data, as_bytearray)
        outcomes[got] += 1
        by_kind[kind][got] += 1

    t0 = time.perf_counter()
    run()
    total = sum(outcomes.values())
    report = {
        "cases": total,
        "seconds": round(time.perf_counter() - t0, 1),
        "seed": args.seed,
        "outcomes": dict(outcomes.most_common()),
        "by_mutation": {k: dict(v.most_common()) for k, v in by_kind.items()},
        "other_exceptions": 0,
        "hangs": 0,
    }
    print(json.dumps(report, indent=2))
    if total < args.cases:
        print(f"FAIL: only {total} of {args.cases} cases ran", file=sys.stderr)
        return 1
    unused = [k for k in MUTATIONS if not by_kind[k]]
    if unused:  # e.g. meta_int, empty_huge_shape (security findings) must be exercised, not just listed
        print(f"FAIL: mutations never drawn: {', '.join(unused)}", file=sys.stderr)
        return 1
    print(f"OK: {total} fuzz cases, every one a clean kvgraft error or a valid artifact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
