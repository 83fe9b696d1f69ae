"""Crash safety: SIGKILL a depositing process at random points and check the store after each kill.

A child process (`--child`) opens a `services.Library` on the tiny Gemma-3 model with the hash
embedder and deposits texts (some as chain children) in a loop, printing `committed <id>` after each
deposit returns. The parent kills it with SIGKILL after a random delay, then checks with
`maintenance.fsck`: no catalog row without its blob, no corrupt blob, every blob on disk hash-valid,
no partial file visible as a blob, and every id the child printed is in the catalog. Orphan blobs and
partial files are allowed (a kill between the blob write and the commit leaves them; fsck --repair
removes them), and are repaired before the next round so that every round starts clean.

    python scripts/crash_deposits.py --kills 50            # the figure in docs/RELIABILITY.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def child(home: str, model_dir: str, seed: int) -> None:
    """Deposit forever, announcing each committed id on stdout before the next one starts."""
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=home, model_name=model_dir, embedder=HashEmbedder())
    rng = random.Random(seed)
    parent = None
    i = 0
    while True:  # chains of three ~70-token deposits stay well inside the tiny model's 512 positions
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "kv", "graft", "store", "fact"]) for _ in range(10))
        text = f"Note {seed}-{i}: {words}."
        d = lib.deposit_text(text, parent=parent if i % 3 else None)
        print(f"committed {d.id}", flush=True)
        if i == 0:  # the first deposit warms the model up; the kill window starts after it
            print("ready", flush=True)
        parent = d.id
        i += 1


def _check(home: Path, model_dir: str, committed: list[str]) -> dict:
    """fsck the store after a kill; raise AssertionError on any inconsistency, repair leftovers."""
    import maintenance
    import services
    from db.blobs import sha256_bytes
    from retrieval import HashEmbedder

    lib = services.Library(home=home, model_name=model_dir, embedder=HashEmbedder())
    try:
        rep = maintenance.fsck(lib)
        assert not rep.missing, f"catalog rows without their blob: {rep.missing}"
        assert not rep.corrupt, f"corrupt blobs: {rep.corrupt}"
        blobs = list(lib.blobs)
        for h in blobs:  # every visible blob, referenced or orphan, is complete and hash-valid
            assert sha256_bytes(lib.blobs.path(h).read_bytes()) == h, f"blob {h} is visible but not hash-valid"
        assert not any(Path(p).name.endswith(".safetensors") for p in rep.partials), "a partial file looks like a blob"
        ids = {r.id for r in lib.catalog.list_artifacts(limit=max(lib.catalog.count_artifacts(), 1))}
        lost = [c for c in committed if c not in ids]
        assert not lost, f"committed deposits lost after SIGKILL: {lost}"
        fixed = maintenance.fsck(lib, repair=True, grace_s=0)
        assert fixed.consistent, f"store not consistent after repair: {fixed.as_dict()}"
        return {
            "artifacts": rep.artifacts,
            "orphans": len(rep.orphans),
            "partials": len(rep.partials),
            "index": rep.index["status"],
        }
    finally:
        lib.catalog.close()


def run(kills: int, seed: int = 0, work: str | os.PathLike | None = None, max_delay_s: float = 1.0, log=print) -> dict:
    """Kill `kills` deposit processes at random points; returns counts. Raises AssertionError on a fault."""
    import retrieval  # noqa: F401  (faiss before torch: see retrieval/__init__.py)
    from graft_core import tiny

    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="kvgraft-crash-"))
    home = work / "home"
    model_dir = str(tiny.build("gemma3", work / "tiny-gemma3"))
    totals = {"kills": 0, "committed": 0, "killed_mid_deposit_with_orphan": 0, "partials_seen": 0, "index_stale_or_missing": 0}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in range(kills):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(home), model_dir, str(seed * 1000 + k)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        lines: list[str] = []
        while (line := proc.stdout.readline().decode().strip()) != "ready":
            if not line:
                proc.kill()
                raise RuntimeError(f"deposit child did not start: {proc.stderr.read().decode()[-2000:]}")
            lines.append(line)
        delay = rng.uniform(0.0, max_delay_s)
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:  # drain stdout while waiting, so the child never blocks
            r, _, _ = select.select([proc.stdout], [], [], left)
            if r:
                got = proc.stdout.readline()
                if not got:
                    break
                lines.append(got.decode().strip())
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"child exited by itself ({proc.returncode}): {err.decode()[-2000:]}"
        lines += out.decode().split("\n")
        committed = [x.split()[1] for x in lines if x.startswith("committed ")]
        state = _check(home, model_dir, committed)
        totals["kills"] += 1
        totals["committed"] += len(committed)
        totals["killed_mid_deposit_with_orphan"] += int(state["orphans"] > 0)
        totals["partials_seen"] += state["partials"]
        totals["index_stale_or_missing"] += int(state["index"] != "ok")
        totals["artifacts"] = state["artifacts"]
        log(
            f"kill {k + 1}/{kills} after {delay:.2f} s: {len(committed)} committed this round, "
            f"{state['artifacts']} in catalog, orphans {state['orphans']}, partials {state['partials']}, index {state['index']}"
        )
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=float, default=1.0, help="kill after a uniform random delay in [0, this] seconds")
    p.add_argument("--work", default=None, help="folder for the store and the tiny model (default: a new temp folder)")
    p.add_argument("--child", nargs=3, metavar=("HOME", "MODEL_DIR", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    t0 = time.perf_counter()
    totals = run(args.kills, seed=args.seed, work=args.work, max_delay_s=args.max_delay)
    totals["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(totals, indent=2))
    print(
        f"OK: {totals['kills']} SIGKILLs, {totals['committed']} committed deposits, none lost, store consistent after every kill"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
