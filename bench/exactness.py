"""The verification figures of the README: seed the built-in library into an empty store through the
deposit gate (acceptance rate and the gate's cost per deposit: seconds and tokens), then the N-sample
exactness report at own position and relocated, exactly as `cli.py verify --json` prints them.

Run from the repository root: `.venv/bin/python -m bench.exactness [HOME]` (or `make bench-verify`); a HOME
that already holds the seeded store is reused (no second seeding). Writes
docs/bench/gate.json, docs/bench/verify.json (`verify --samples 50`), docs/bench/relocate.json
(`verify --samples 10 --relocate 1000`) and docs/bench/relocate0.json (`--relocate 0`, which must be
byte-equal on every sample). Timings depend on the machine's load; the token counts do not.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import retrieval  # noqa: E402,F401  (faiss before torch: services does not import it)
import services  # noqa: E402
from errors import VerificationFailed  # noqa: E402
from services.seed import seed_items  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench"
STORE = "the built-in seed library (library_seed/), deposited through the gate into an empty store"


def _write(name: str, payload: dict) -> None:
    (OUT / name).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote docs/bench/{name}", flush=True)


def seed(lib: services.Library) -> dict:
    """Deposit every built-in item through the gate (and the fact sheets, attested); what it cost."""
    items, sheets = seed_items()
    rows = []
    for it in items:
        t0 = time.perf_counter()
        try:
            d = lib.deposit_item(**it)
            rows.append(
                {
                    "question": it["question"],
                    "accepted": True,
                    "artifact": d.id,
                    "prefill_tokens": d.prefill_tokens,
                    "prefill_s": round(d.prefill_s, 3),
                    "gate_tokens": d.gate_tokens,
                    "gate_s": round(d.gate_s, 3),
                    "deposit_s": round(time.perf_counter() - t0, 3),
                }
            )
        except VerificationFailed as e:
            rows.append({"question": it["question"], "accepted": False, "reason": str(e)})
        print(json.dumps(rows[-1]), flush=True)
    for title, text in sheets:
        lib.deposit_text(text, title=title, attested_by="kvgraft built-in library", admin=True)
    ok = [r for r in rows if r["accepted"]]
    return {
        "command": "python -m bench.exactness",
        "store": STORE,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "offered": len(rows),
        "accepted": len(ok),
        "acceptance_rate": len(ok) / max(1, len(rows)),
        "median_gate_s": statistics.median(r["gate_s"] for r in ok) if ok else None,
        "median_gate_tokens": statistics.median(r["gate_tokens"] for r in ok) if ok else None,
        "median_prefill_tokens": statistics.median(r["prefill_tokens"] for r in ok) if ok else None,
        "median_prefill_s": statistics.median(r["prefill_s"] for r in ok) if ok else None,
        "note": "gate = the scratch fact graft + its answer, and the graft of the new artifact + its answer; "
        "seconds on a shared 2-core CPU are noisy, tokens are exact",
        "items": rows,
    }


def main(argv: list[str]) -> int:
    home = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="kvgraft-bench-verify-"))
    lib = services.Library(home=home)
    if lib.count() == 0:  # a store given again (argv[0]) keeps its seeding and its gate.json
        _write("gate.json", seed(lib))
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for name, samples, relocate in (("relocate0.json", 10, 0), ("relocate.json", 10, 1000), ("verify.json", 50, None)):
        rep = lib.exactness_report(samples, relocate=relocate)
        flag = "" if relocate is None else f" --relocate {relocate}"
        head = {"command": f"python cli.py verify --samples {samples}{flag} --json", "store": STORE, "date": date}
        _write(name, head | rep.to_json())
    lib.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
