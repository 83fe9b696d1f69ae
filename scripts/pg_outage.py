"""A PostgreSQL catalog killed under load: depositors and askers run on one Library while the server is
SIGKILLed and restarted on the same port and data, in the same kvgraft process.

Each depositor deposits new texts and retries a text that failed (as a client would) until it is
acknowledged; each asker answers questions. After `before` acknowledged deposits the server is killed
(the postmaster and every backend), left down for `down_s` seconds, and restarted; the run goes on
until every depositor has `after` acknowledged deposits made after the restart. Returned: every
acknowledged id, the errors seen (type, message) and when, and the catalog's rows per id afterwards.
The caller (tests/test_faults.py, bench/faults.py) judges them. Needs tests/pgserver.py's throwaway
cluster (the apt package `postgresql`), started crash-safe: with synchronous_commit=off a server crash
loses commits it had already acknowledged (measured: `--fast-commits`), whatever the client does.

    python -m scripts.pg_outage          # one run on the tiny model, its figures as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from services import AnswerOptions

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(
    server, lm, home: Path, depositors: int = 4, askers: int = 16, before: int = 8, after: int = 2, down_s: float = 2.0
) -> dict:
    """One outage against `server` (a tests.pgserver.PgServer) with the loaded model `lm`; see the module doc."""
    import sqlalchemy as sa

    import services
    from errors import KvgraftError
    from retrieval import HashEmbedder

    url = server.create_database()
    lib = services.Library(home=home, db_url=url, lm=lm, embedder=HashEmbedder())
    lib.deposit_text("Seed fact: the catalog of this run lives in PostgreSQL.")  # so that askers have something
    phase = {"now": "before"}  # before -> down -> after
    lock = threading.Lock()
    acked: list[dict] = []
    errors: list[dict] = []
    answers = {"before": 0, "down": 0, "after": 0}
    stop = threading.Event()
    after_acks = [0] * depositors

    def note(kind: str, e: BaseException) -> None:
        with lock:
            errors.append(
                {
                    "who": kind,
                    "phase": phase["now"],
                    "type": type(e).__name__,
                    "kvgraft": isinstance(e, KvgraftError),
                    "message": str(e),
                }
            )

    def depositor(d: int) -> None:
        i = 0
        while not stop.is_set():
            text = f"Depositor {d} fact {i}: the outage run keeps every acknowledged deposit exactly once."
            try:
                r = lib.deposit_text(text)
            except Exception as e:  # noqa: BLE001  (every error is recorded and judged by the caller)
                note("depositor", e)
                time.sleep(0.2)
                continue  # the same text again: a retry that reached the catalog before is found by its key
            with lock:
                acked.append({"id": r.id, "depositor": d, "i": i, "created": r.created, "phase": phase["now"]})
                if phase["now"] == "after":
                    after_acks[d] += 1
            i += 1

    def asker(a: int) -> None:
        while not stop.is_set():
            try:
                lib.answer(f"Which facts did depositor {a % depositors} keep?", AnswerOptions(k=2, max_new_tokens=2))
                with lock:
                    answers[phase["now"]] += 1
            except Exception as e:  # noqa: BLE001
                note("asker", e)
                time.sleep(0.2)

    threads = [threading.Thread(target=depositor, args=(d,), daemon=True) for d in range(depositors)]
    threads += [threading.Thread(target=asker, args=(a,), daemon=True) for a in range(askers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        while len(acked) < before:
            time.sleep(0.05)
        with lock:
            phase["now"] = "down"
        killed = server.kill()
        down_at = time.monotonic()
        time.sleep(down_s)
        server.restart()
        outage_s = time.monotonic() - down_at
        with lock:
            phase["now"] = "after"
        deadline = time.monotonic() + 600
        while min(after_acks) < after and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = {
            table: dict(conn.execute(sa.text(f"SELECT {col}, count(*) FROM {table} GROUP BY {col}")).all())
            for table, col in (("artifacts", "id"), ("sources", "artifact_id"), ("embeddings", "artifact_id"))
        }
    engine.dispose()
    fsck = services.fsck(lib)
    repaired = services.fsck(lib, repair=True, grace_s=0)
    unreadable = []
    for a in sorted({x["id"] for x in acked}):
        try:
            lib.load_artifact(a)
        except KvgraftError as e:
            unreadable.append(f"{a}: {e}")
    lib.close()
    return {
        "depositors": depositors,
        "askers": askers,
        "server_processes_killed": killed,
        "outage_s": round(outage_s, 2),
        "seconds": round(time.monotonic() - t0, 1),
        "acknowledged": acked,
        "answers": answers,
        "errors": errors,
        "rows": {t: {k: v for k, v in r.items()} for t, r in rows.items()},
        "after_acks": after_acks,
        "unreadable": unreadable,
        "fsck_before_repair": fsck.to_json()["counts"] | {"consistent": fsck.consistent},
        "fsck_after_repair": repaired.to_json()["counts"] | {"consistent": repaired.consistent},
    }


def summary(result: dict) -> dict:
    """The figures: acknowledged deposits, lost and duplicated ones, errors by phase and kind."""
    acked = {a["id"] for a in result["acknowledged"]}
    rows = result["rows"]
    lost = sorted(a for a in acked if rows["artifacts"].get(a, 0) != 1)
    duplicated = sorted(a for t in rows.values() for a, n in t.items() if n > 1)
    errs = result["errors"]
    return {
        "acknowledged": len(acked),
        "acknowledged_after_restart": sum(1 for a in result["acknowledged"] if a["phase"] == "after"),
        "retries_found_existing": sum(1 for a in result["acknowledged"] if not a["created"]),
        "lost": len(lost),
        "unreadable": len(result["unreadable"]),
        "duplicated": len(duplicated),
        "errors": len(errs),
        "errors_not_kvgraft": sum(1 for e in errs if not e["kvgraft"]),
        "errors_multiline": sum(1 for e in errs if "\n" in e["message"]),
        "errors_by_phase": {p: sum(1 for e in errs if e["phase"] == p) for p in ("before", "down", "after")},
        "answers": result["answers"],
        "outage_s": result["outage_s"],
        "server_processes_killed": result["server_processes_killed"],
        "fsck_after_repair_consistent": result["fsck_after_repair"]["consistent"],
        "orphans_left_by_the_outage": result["fsck_before_repair"]["orphans"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depositors", type=int, default=4)
    p.add_argument("--askers", type=int, default=16)
    p.add_argument("--down", type=float, default=2.0)
    p.add_argument(
        "--fast-commits",
        action="store_true",
        help="run the server with synchronous_commit=off (it may then lose acknowledged commits)",
    )
    args = p.parse_args(argv)
    import retrieval  # noqa: F401  (faiss before torch)
    from graft_core import model, tiny
    from tests import pgserver

    work = Path(tempfile.mkdtemp(prefix="kvgraft-pg-outage-"))
    lm = model.load(str(tiny.build("gemma3", work / "tiny-gemma3")))
    server = pgserver.start(crash_safe=not args.fast_commits)
    try:
        result = run(server, lm, work / "home", args.depositors, args.askers, down_s=args.down)
    finally:
        server.stop()
    print(json.dumps(summary(result) | {"errors_seen": sorted({e["message"] for e in result["errors"]})[:10]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
