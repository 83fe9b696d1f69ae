"""Anonymous reads at scale: seconds per dashboard render and per library search, before and after the
running totals (db/aggregates.py).

Builds temporary SQLite stores of 10,000 artifacts and 56,000 / 224,000 synthetic ledger rows (bulk
inserts; no model: the figures only read the catalog), eight of the artifacts found by `solve` so the
flywheel has recalls. "before" is the previous per-render code, kept below verbatim in substance: the
ledger's sums by one SUM over every row, the store's size by COUNT and SUM over every artifact, and the
flywheel by reading every artifact and every ledger row; the library search before runs without the
index on artifacts.created_at that m004_aggregates added. "after" is `Library.stats()` + `flywheel()`
(what `web.dashboard_tab.figures` reads) and `Library.entries()`. Both render the same plots. Median of a few
runs each; writes docs/bench/reads.json.

    .venv/bin/python -m bench.reads            # about 4 minutes on 2 shared cores (the scans before are most of it)
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import case, func, insert, select, text

from db import aggregates
from db import connection as dbconn
from db.catalog import Catalog, Retention
from db.schema import artifacts, ledger, sources
from services import Flywheel, Library, StoreStats
from services.solve import FLYWHEEL_LOG

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "reads.json"
SIZES = (56_000, 224_000)
ARTIFACTS = 10_000
FOUND = 8
RUNS = 3
SEARCHES = {"empty (newest 500)": "", "common word": "river", "rare word": "zanthorpe", "no match": "qqqxyz"}
FAKE_LM = SimpleNamespace(info=SimpleNamespace(max_positions=32_768))
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = "the river stone tower lamp north field bridge winter copper market silver garden harbour".split()


def _sha(i: int, salt: str) -> str:
    import hashlib

    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def build(home: Path, rows: int, rng: random.Random) -> Library:
    """A store of ARTIFACTS artifacts and `rows` ledger rows, totals and flywheel filled as the app keeps them."""
    cat = Catalog.open(None, home, retention=Retention())
    ids = [_sha(i, "a") for i in range(ARTIFACTS)]
    tokens = [rng.randint(20, 600) for _ in ids]
    with dbconn.write(cat._engine) as conn:
        conn.execute(
            insert(artifacts),
            [
                dict(
                    id=k,
                    content_sha256=_sha(i, "c"),
                    model_fingerprint="f" * 64,
                    tokens=tokens[i],
                    start=0,
                    end_pos=tokens[i],
                    parent_id=None,
                    root_id=k,
                    depth=0,
                    title=f"item {i} " + " ".join(rng.choices(WORDS, k=3)),
                    kind="text",
                    bytes=1000,
                    created_at=T0 + timedelta(seconds=i),
                )
                for i, k in enumerate(ids)
            ],
        )
        text_of = lambda i: " ".join(rng.choices(WORDS, k=60)) + (" zanthorpe" if i % 997 == 0 else "")  # noqa: E731
        conn.execute(insert(sources), [dict(artifact_id=k, text=text_of(i)) for i, k in enumerate(ids)])
        aggregates.on_artifacts(conn, ARTIFACTS, sum(tokens))
    found = ids[:FOUND]
    sums: dict[str, int] = {}
    batch = []
    for n in range(rows):
        computed, decode, measured = rng.randint(1, 60), rng.randint(1, 16), rng.random() < 0.3
        leaf = rng.choice(found) if rng.random() < 0.1 else rng.choice(ids)
        v = dict(
            created_at=T0 + timedelta(days=1, seconds=n),
            query_sha256=_sha(n, "q"),
            query=f"question {n} " + " ".join(rng.choices(WORDS, k=8)),
            prompt_sha256=_sha(n, "p"),
            artifact_ids=json.dumps([leaf]),
            tier="exact",
            model_fingerprint="f" * 64,
            output_token_ids=json.dumps(list(range(decode))),
            output_sha256=_sha(n, "o"),
            logits_sha256=_sha(n, "l"),
            grafted_tokens=rng.randint(20, 600),
            computed_tokens=computed,
            decode_tokens=decode,
            baseline_tokens=computed + rng.randint(20, 600) + (decode if measured else 0),
            baseline_measured=measured,
            ttft_s=0.02,
            baseline_ttft_s=0.3 if measured else None,
            total_s=0.2,
            exact=rng.choice([None, True]),
            check_json=None,
            flops=10**11,
            baseline_flops=10**12,
            query_chars=40,
        )
        for k, x in aggregates.ledger_delta(v).items():
            sums[k] = sums.get(k, 0) + x
        batch.append(v)
        if len(batch) == 20_000 or n == rows - 1:
            with dbconn.write(cat._engine) as conn:
                conn.execute(insert(ledger), batch)
            batch = []
    with dbconn.write(cat._engine) as conn:
        aggregates._add(conn, sums)
    cat.close()
    solves = [{"at": T0.timestamp() + i, "source": "model", "id": k, "tokens_spent": 2000 + i} for i, k in enumerate(found)]
    (home / FLYWHEEL_LOG).write_text("".join(json.dumps(s) + "\n" for s in solves), encoding="utf-8")
    return Library(home=home, lm=FAKE_LM, embedder=object())  # back-fills the flywheel once, as an upgraded store does


# ---- before: the per-render code the running totals replaced ------------------------------------------


def old_totals(cat: Catalog):
    from db.rows import LedgerTotals

    c = ledger.c
    saved = c.baseline_tokens - c.computed_tokens - case((c.baseline_measured.is_(True), c.decode_tokens), else_=0)
    sums = (c.grafted_tokens, c.computed_tokens, c.decode_tokens, c.baseline_tokens, saved, c.flops, c.baseline_flops)
    columns = [
        func.count(),
        *(func.coalesce(func.sum(x), 0) for x in sums),
        func.coalesce(func.sum(case((c.exact.is_(True), 1), else_=0)), 0),
        func.coalesce(func.sum(case((c.exact.is_(False), 1), else_=0)), 0),
    ]
    with dbconn.read(cat._engine) as conn:
        return LedgerTotals(*(int(v) for v in conn.execute(select(*columns)).one()))


def _catalog(lib: Library) -> Catalog:
    """The store's catalog opened beside the library (the old scans need raw SQL, which the Library keeps inside)."""
    return Catalog.open(None, lib.home)


def old_figures(lib: Library, cat: Catalog) -> tuple[StoreStats, Flywheel]:
    stats = StoreStats(
        totals=old_totals(cat),
        recent=tuple(cat.ledger(last=60)),
        store_tokens=cat.total_tokens(),
        artifacts=cat.count_artifacts(),
        window=FAKE_LM.info.max_positions,
    )
    sizes = sorted(r.created_at.timestamp() for r in cat.list_artifacts(limit=max(1, cat.count_artifacts())))
    found = {s["id"]: s for s in lib.solves() if s["source"] == "model" and s["id"]}
    recalls: dict[str, list[int]] = {k: [] for k in found}
    saved, cumulative = 0, []
    for row in cat.ledger():
        leaf = row.artifact_ids[-1] if row.artifact_ids else None
        if leaf in found:
            cost = row.computed_tokens + row.decode_tokens
            recalls[leaf].append(cost)
            saved += max(0, found[leaf]["tokens_spent"] - cost)
            cumulative.append((row.created_at.timestamp(), saved))
    items = tuple((k, found[k]["tokens_spent"], round(sum(v) / len(v), 1) if v else None, len(v)) for k, v in recalls.items())
    growth = tuple((t, i + 1) for i, t in enumerate(sizes))
    return stats, Flywheel(growth=growth, items=items, cumulative_saved=tuple(cumulative))


def new_figures(lib: Library) -> tuple[StoreStats, Flywheel]:
    return lib.stats(), lib.flywheel()


def render(figures) -> None:
    """What web.dashboard_tab.figures does with the figures: the stats panel and the four plots."""
    from web import views

    s, f = figures
    views.stats_html(s)
    views.tokens_plot(s.recent), views.speedup_plot(s.recent), views.store_plot(s.store_tokens, s.window)
    views.flywheel_plot(f)


def timed(fn, runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


def searches(lib: Library) -> dict[str, float]:
    return {name: timed(lambda q=q: lib.entries(query=q, limit=500)) for name, q in SEARCHES.items()}


def measure(lib: Library, rows: int) -> dict:
    render(new_figures(lib))  # warm imports (matplotlib) before any timing
    cat = _catalog(lib)  # opened once: the old scans' own cost, not a connection's, is timed
    before_s, after_s = old_figures(lib, cat), new_figures(lib)
    assert before_s[0].totals == after_s[0].totals, "the running totals must equal the scan"
    assert before_s[1].items == after_s[1].items, "the flywheel's items must equal the scan's"
    assert before_s[1].cumulative_saved[-500:] == after_s[1].cumulative_saved, "the recall series must be the scan's tail"
    after = {
        "dashboard_figures_s": timed(lambda: new_figures(lib)),
        "dashboard_render_s": timed(lambda: render(new_figures(lib))),
    }
    after["search_s"] = searches(lib)
    with dbconn.write(cat._engine) as conn:  # the search as it ran before m004's index
        conn.execute(text("DROP INDEX ix_artifacts_created_at"))
    before = {
        "dashboard_figures_s": timed(lambda: old_figures(lib, cat)),
        "dashboard_render_s": timed(lambda: render(old_figures(lib, cat))),
    }
    before["search_s"] = searches(lib)
    with dbconn.write(cat._engine) as conn:
        conn.execute(text("CREATE INDEX ix_artifacts_created_at ON artifacts (created_at)"))
    return {"ledger_rows": rows, "artifacts": ARTIFACTS, "before": before, "after": after}


def main() -> None:
    started = time.perf_counter()
    results = []
    for rows in SIZES:
        with tempfile.TemporaryDirectory(prefix="kvgraft-reads-") as tmp:
            t0 = time.perf_counter()
            lib = build(Path(tmp), rows, random.Random(rows))
            built = time.perf_counter() - t0
            try:
                r = measure(lib, rows)
            finally:
                lib.close()
            r["build_s"] = round(built, 1)
            print(json.dumps(r), flush=True)
            results.append(r)
    out = {
        "what": "seconds per dashboard read (figures: the catalog reads; render: + the stats panel and four plots) "
        "and per library search (limit 500), median of 3, SQLite, one process, nothing else running",
        "command": "python -m bench.reads",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    OUT.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} in {out['seconds']} s")


if __name__ == "__main__":
    main()
