"""The lean decode step under OpenMP's two wait policies: spinning (libgomp's default) and sleeping
(`OMP_WAIT_POLICY=PASSIVE`), at 1, 8 and 32 sessions a pass, on the real model. Each policy runs in a process of
its own (libgomp reads the variable when it loads), alternating, `--runs` times; ms a step and tokens/s, median.

    .venv/bin/python -m bench.omp_wait [--runs 2] [--steps 10]

Run it on a quiet machine and again under load (another process on each core) to see both sides: spinning is
the faster on free cores, sleeping degrades far less when the cores are taken. The wait policy changes no
bytes (which thread computes which output is fixed by the kernels). Prints one JSON object; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SESSIONS = (1, 8, 32)


def _one(steps: int) -> dict:
    """Inside a process: ms a step at each session count (10 steps on caches of a 60-token prompt)."""
    import copy
    import time

    import torch

    from graft_core import model
    from graft_core.batch import Batcher, Session
    from graft_core.forward import forward_chunk, new_cache

    lm = model.load()
    ids = list(range(100, 160))
    out = {}
    with torch.inference_mode():
        c0 = new_cache(lm.model)
        forward_chunk(lm.model, c0, ids, 0)
        for n in SESSIONS:
            b = Batcher(lm.model, widths=(4, 8, n))
            caches = [copy.deepcopy(c0) for _ in range(n)]
            t = time.perf_counter()
            for k in range(steps):
                b.step([Session(c, 7 + k, len(ids) + k) for c in caches])
            out[str(n)] = round((time.perf_counter() - t) / steps * 1000, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_one(args.steps)))
        return
    runs: dict[str, list[dict]] = {"spin": [], "passive": []}
    for _ in range(args.runs):
        for policy in runs:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy == "passive":
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            cmd = [sys.executable, "-m", "bench.omp_wait", "--child", "--steps", str(args.steps)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[policy].append(json.loads(r.stdout.strip().splitlines()[-1]))
    result = {"load_average": os.getloadavg()[0], "runs": args.runs, "steps": args.steps, "ms_a_step": {}}
    for policy, rs in runs.items():
        result["ms_a_step"][policy] = {n: statistics.median(r[str(n)] for r in rs) for n in SESSIONS}
    result["passive_over_spin"] = {
        n: round(result["ms_a_step"]["passive"][n] / result["ms_a_step"]["spin"][n], 2) for n in SESSIONS
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
