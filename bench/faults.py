"""Faults, counted: every write point of every store operation failed by a full disk and by an I/O error,
a real full file system, a PostgreSQL server killed under load, and SIGKILLs spread over deposits,
imports and `fsck --repair`. Writes docs/bench/faults.json with --write: runs, faults injected,
acknowledged work and how much of it was lost (0), each figure computed from the runs.

    .venv/bin/python -m bench.faults --write             # everything (about 15-30 min on 2 shared cores)
    .venv/bin/python -m bench.faults --kills 10          # a shorter kill run, printed only

The parts that need root (the tmpfs) or PostgreSQL are recorded as skipped, with the reason, where
they cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = [(op, err, 1) for op in ("deposit", "import", "export", "index", "ledger") for err in ("ENOSPC", "EIO")]


def _sweeps(model_dir: Path, work: Path) -> dict:
    from scripts import sweeps

    results = sweeps.sweep(SWEEPS, model_dir, work / "sweeps")
    rows = []
    for r in results:
        recs = r["records"]
        problems = sweeps.judge(r)
        rows.append(
            {
                "op": r["op"],
                "errno": r["errno"],
                "write_points": r["write_points"],
                "runs": len(recs),
                "faults_injected": sum(x["faults"] for x in recs),
                "refused": sum(1 for x in recs if x["error"] is not None),
                "absorbed_by_sqlite": sum(1 for x in recs if x["faults"] and x["error"] is None),
                "storefull_messages": sum(1 for x in recs if x["error"] and x["error"]["type"] == "StoreFull"),
                "io_error_messages": sum(1 for x in recs if x["error"] and x["error"]["type"] == "StorageError"),
                "acknowledged_before": len(r["pristine"]["artifacts"]),
                "lost": sweeps.lost_acknowledged(r),
                "problems": problems,
                "seconds": r["seconds"],
            }
        )
    return {
        "what": "every write, pwrite, writev, fsync and fdatasync under the store's folder (SQLite's own included) failed in turn, "
        "ENOSPC staying full until the operation ends, EIO once (scripts/faultfs.c preloaded)",
        "sweeps": rows,
        "runs": sum(x["runs"] for x in rows),
        "faults_injected": sum(x["faults_injected"] for x in rows),
        "lost": sum(x["lost"] for x in rows),
        "problems": sum(len(x["problems"]) for x in rows),
    }


def _full_filesystem(model_dir: Path, lm) -> dict:
    from retrieval import HashEmbedder
    from scripts import sweeps

    try:
        with sweeps.small_filesystem(24) as mount:
            r = sweeps.full_disk_run(mount, model_dir, lm, HashEmbedder())
    except sweeps.FilesystemUnavailable as e:
        return {"skipped": str(e)}
    refused = [a for a in r["full"] if not a["ok"]]
    return {
        "what": "a 24 MB tmpfs filled to the last page, then the CLI's deposit, a deposit, an import, an export, an index "
        "rebuild and a ledger write; then the filler removed and each again",
        "filler_bytes": r["filler_bytes"],
        "operations_tried_full": len(r["full"]) + 1,
        "refused_full": len(refused) + int(r["cli_full"]["code"] != 0),
        "messages": [r["cli_full"]["stderr"].strip()] + [a["message"] for a in refused],
        "store_unchanged": r["at_full"]["artifacts"] == r["before"]["artifacts"]
        and r["at_full"]["blobs"] == r["before"]["blobs"],
        "fsck_consistent_when_full": r["at_full"]["fsck_consistent"],
        "worked_after_freeing": sum(1 for a in r["freed"] if a["ok"]) + int(r["cli_again"]["code"] == 0),
        "fsck_consistent_after": r["after"]["fsck_consistent"],
        "lost": sum(1 for v in r["at_full"]["exact"].values() if v is not True)
        + sum(1 for v in r["after"]["exact"].values() if v is not True),
    }


def _postgres(lm, work: Path) -> dict:
    from scripts import pg_outage
    from tests import pgserver

    try:
        server = pgserver.start(crash_safe=True)
    except pgserver.PgUnavailable as e:
        return {"skipped": str(e)}
    try:
        result = pg_outage.run(server, lm, work / "pg-home", depositors=4, askers=16, before=8, after=3, down_s=2.0)
    finally:
        server.stop()
    return {
        "what": "4 depositor and 16 asker threads on one Library; the server's postmaster and backends SIGKILLed, "
        "restarted on the same port and data after 2 s; synchronous_commit on",
        **pg_outage.summary(result),
        "messages": sorted({e["message"].split(" (", 1)[0] + " (...)" for e in result["errors"]}),
    }


def _kills(kills: int, work: Path, seed: int) -> dict:
    from scripts import crash_deposits

    t0 = time.perf_counter()
    totals = crash_deposits.run(
        kills=kills, seed=seed, work=work / "kills", fork=True, ops=("deposit", "import", "repair"), log=lambda s: None
    )
    totals["seconds"] = round(time.perf_counter() - t0, 1)
    totals["what"] = (
        "SIGKILLs of children forked from one warm process, in turn depositing, importing bundles and running "
        "fsck --repair, each at a uniform random moment in the second after its first operation; fsck after each"
    )
    return totals


def _machine() -> str:
    """The CPU model and logical cores, from /proc/cpuinfo where there is one."""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--write", action="store_true", help="write docs/bench/faults.json")
    args = ap.parse_args(argv)
    import retrieval  # noqa: F401  (faiss before torch)
    from graft_core import model, tiny

    work = Path(tempfile.mkdtemp(prefix="kvgraft-bench-faults-"))
    model_dir = tiny.build("gemma3", work / "tiny-gemma3")
    lm = model.load(str(model_dir))
    t0 = time.perf_counter()
    out = {
        "date": date.today().isoformat(),
        "machine": _machine(),
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        "model": "tiny Gemma-3 (graft_core/tiny.py), hash embedder",
        "write_sweeps": _sweeps(model_dir, work),
        "full_filesystem": _full_filesystem(model_dir, lm),
        "postgres_outage": _postgres(lm, work),
        "sigkills": _kills(args.kills, work, args.seed),
    }
    parts = [out["write_sweeps"], out["full_filesystem"], out["postgres_outage"], out["sigkills"]]
    out["totals"] = {
        "faults_injected": out["write_sweeps"]["faults_injected"]
        + (0 if "skipped" in out["full_filesystem"] else out["full_filesystem"]["operations_tried_full"])
        + (0 if "skipped" in out["postgres_outage"] else 1)
        + out["sigkills"]["kills"],
        "runs": out["write_sweeps"]["runs"]
        + (0 if "skipped" in out["full_filesystem"] else 1)
        + (0 if "skipped" in out["postgres_outage"] else 1)
        + out["sigkills"]["rounds"],
        "acknowledged": sum(
            [
                sum(x["acknowledged_before"] * x["runs"] for x in out["write_sweeps"]["sweeps"]),  # each run: its own store
                0 if "skipped" in out["postgres_outage"] else out["postgres_outage"]["acknowledged"],
                out["sigkills"]["acknowledged"],
            ]
        ),
        "lost": sum(p.get("lost", 0) for p in parts),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))
    if args.write:
        (ROOT / "docs" / "bench" / "faults.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["totals"]["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
