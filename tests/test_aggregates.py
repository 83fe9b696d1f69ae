"""The dashboard's figures come from running totals (db/aggregates.py), never a scan of the ledger: the same
numbers as a scan over a few thousand rows, a render's SELECT count independent of the row count, totals
that survive retention, and a migration that back-fills a store that already has rows."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import event, text

from db import aggregates
from db import connection as dbconn
from db.catalog import Catalog
from db.retention import Retention
from db.rows import ArtifactRow, LedgerRow, LedgerTotals, SourceRow
from services import Library
from services.solve import FLYWHEEL_LOG, GROWTH_POINTS, ITEMS_SHOWN, RECALL_POINTS

FP = "f" * 64
T0 = datetime(2026, 11, 1, tzinfo=UTC)
FAKE_LM = SimpleNamespace(
    fingerprint="e" * 64, info=SimpleNamespace(max_positions=32_768, name="fake")
)  # all a Library asks of it


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def deposit(cat: Catalog, i: int, tokens: int) -> ArtifactRow:
    row = ArtifactRow(
        id=sha(f"artifact {i}"),
        content_sha256="",
        model_fingerprint=FP,
        tokens=tokens,
        start=0,
        kind="text",
        title=f"item {i}",
        parent_id=None,
        bytes=100,
        created_at=T0 + timedelta(seconds=i),
    )
    return cat.add_deposit(row, SourceRow(row.id, f"text {i}"), None, None, write_blob=lambda: sha(f"blob {i}"))


def answer(rng: random.Random, i: int, ids: list[str]) -> LedgerRow:
    computed, decode = rng.randint(1, 60), rng.randint(1, 16)
    measured = rng.random() < 0.3
    return LedgerRow(
        query_sha256="",
        query=f"question {i}",
        prompt_sha256=sha(f"p{i}"),
        artifact_ids=() if rng.random() < 0.2 else (rng.choice(ids[:8] if rng.random() < 0.3 else ids),),  # 8 found by solve
        tier="exact",
        model_fingerprint=FP,
        output_token_ids=(1, 2),
        output_sha256=sha(f"o{i}"),
        grafted_tokens=rng.randint(0, 900),
        computed_tokens=computed,
        decode_tokens=decode,
        baseline_tokens=computed + rng.randint(0, 900) + (decode if measured else 0),
        baseline_measured=measured,
        ttft_s=0.01,
        total_s=0.1,
        flops=rng.randint(10**9, 10**12),
        baseline_flops=rng.randint(10**12, 10**14),
        exact=rng.choice([None, True, True, False]),
        created_at=T0 + timedelta(hours=1, seconds=i),
    )


def build(cat: Catalog, artifacts: int, answers: int, seed: int = 7) -> tuple[list[ArtifactRow], dict[str, int], list[LedgerRow]]:
    """`artifacts` deposits (the first eight found by `solve`), then `answers` ledger rows."""
    rng = random.Random(seed)
    rows = [deposit(cat, i, rng.randint(5, 400)) for i in range(artifacts)]
    found = {r.id: rng.randint(100, 4000) for r in rows[:8]}
    for n, (key, spent) in enumerate(found.items()):
        cat.record_discovery(key, spent, T0 + timedelta(seconds=n))
    ledger = [answer(rng, i, [r.id for r in rows]) for i in range(answers)]
    for entry in ledger:
        cat.add_ledger(entry)
    return rows, found, ledger


def scan_totals(rows: list[LedgerRow]) -> LedgerTotals:
    """The sums as a scan of the whole ledger defines them (LedgerTotals' docstring)."""
    return LedgerTotals(
        answers=len(rows),
        grafted_tokens=sum(r.grafted_tokens for r in rows),
        computed_tokens=sum(r.computed_tokens for r in rows),
        decode_tokens=sum(r.decode_tokens for r in rows),
        baseline_tokens=sum(r.baseline_tokens for r in rows),
        tokens_saved=sum(r.baseline_tokens - r.computed_tokens - (r.decode_tokens if r.baseline_measured else 0) for r in rows),
        flops=sum(r.flops for r in rows),
        baseline_flops=sum(r.baseline_flops for r in rows),
        checks_passed=sum(r.exact is True for r in rows),
        checks_failed=sum(r.exact is False for r in rows),
    )


def scan_flywheel(found: dict[str, int], rows: list[LedgerRow]):
    """The flywheel as a loop over the whole ledger computes it: per item (id, spent, mean recall, recalls), cumulative saved."""
    recalls: dict[str, list[int]] = {k: [] for k in found}
    saved, cumulative = 0, []
    for row in rows:
        leaf = row.artifact_ids[-1] if row.artifact_ids else None
        if leaf in found:
            cost = row.computed_tokens + row.decode_tokens
            recalls[leaf].append(cost)
            saved += max(0, found[leaf] - cost)
            cumulative.append((row.created_at.timestamp(), saved))
    items = tuple((k, found[k], round(sum(v) / len(v), 1) if v else None, len(v)) for k, v in recalls.items())
    return items, tuple(cumulative)


def selects(lib: Library, fn) -> int:
    seen: list[str] = []
    listener = lambda conn, cursor, stmt, *a: seen.append(stmt)  # noqa: E731
    event.listen(lib.store.catalog._engine, "before_cursor_execute", listener)
    try:
        fn()
    finally:
        event.remove(lib.store.catalog._engine, "before_cursor_execute", listener)
    return sum(1 for s in seen if s.lstrip().upper().startswith("SELECT"))


def test_dashboard_figures_equal_a_scan_and_a_render_reads_a_bounded_number_of_rows(url, tmp_path):
    from web.dashboard_tab import figures as _dashboard

    lib = Library(home=tmp_path / "home", db_url=url, lm=FAKE_LM, embedder=object())
    try:
        cat = lib.store.catalog
        arts, found, ledger = build(cat, 250, 300)
        small = selects(lib, lambda: _dashboard(lib))
        rng = random.Random(8)
        more = [answer(rng, i, [r.id for r in arts]) for i in range(300, 3000)]
        for entry in more:
            cat.add_ledger(entry)
        ledger += more
        # stats: 3 reads and the models named (a table of one row per model), flywheel: 4, whatever the size
        assert selects(lib, lambda: _dashboard(lib)) == small <= 8

        stored = cat.ledger()
        assert len(stored) == 3000
        s = lib.stats()
        assert s.totals == scan_totals(stored)
        assert (s.artifacts, s.store_tokens) == (250, sum(r.tokens for r in arts)) == (lib.count(), cat.total_tokens())
        assert s.recent == tuple(stored[-60:])

        f = lib.flywheel()
        items, cumulative = scan_flywheel(found, stored)
        assert len(items) <= ITEMS_SHOWN and f.items == items
        assert sum(n for *_, n in items) > RECALL_POINTS and f.cumulative_saved == cumulative[-RECALL_POINTS:]
        sizes = sorted(r.created_at.timestamp() for r in cat.list_artifacts(limit=1000))
        assert f.growth == tuple((t, i + 1) for i, t in enumerate(sizes))[-GROWTH_POINTS:]
    finally:
        lib.close()


def test_a_deleted_artifact_leaves_the_store_size_and_the_ledger_totals_keep_pruned_rows(tmp_path):
    with Catalog.open(None, tmp_path, retention=Retention(max_rows=50, every=40)) as cat:
        arts, _, ledger = build(cat, 20, 400)
        assert len(cat.ledger()) < 100  # retention pruned as it went
        assert cat.ledger_totals() == scan_totals(ledger)  # every answer ever recorded still counts
        cat.delete(arts[3].id)
        size = aggregates.read(cat, (aggregates.store_size,))[0]
        assert (
            size == aggregates.StoreSize(19, cat.total_tokens()) and size.tokens == sum(r.tokens for r in arts) - arts[3].tokens
        )


def test_the_migration_back_fills_the_totals_and_a_library_the_flywheel_once(tmp_path):
    home = tmp_path / "home"
    with Catalog.open(None, home) as cat:
        arts, found, ledger = build(cat, 30, 600)
        with dbconn.write(cat._engine) as conn:  # the store as kvgraft left it before m004_aggregates
            for table in ("totals", "discoveries", "recall_points"):
                conn.execute(text(f"DROP TABLE {table}"))
            conn.execute(text("DROP INDEX ix_artifacts_created_at"))
            conn.execute(text("DELETE FROM schema_migrations WHERE name = 'm004_aggregates'"))
    log = [{"at": T0.timestamp() + n, "source": "model", "id": k, "tokens_spent": s} for n, (k, s) in enumerate(found.items())]
    log.append({"at": T0.timestamp(), "source": "library", "id": arts[0].id, "tokens_spent": 3})
    Path(home, FLYWHEEL_LOG).write_text("".join(json.dumps(x) + "\n" for x in log), encoding="utf-8")
    lib = Library(home=home, lm=FAKE_LM, embedder=object())
    try:
        assert lib.stats().totals == scan_totals(ledger)
        assert (lib.count(), lib.stats().store_tokens) == (30, sum(r.tokens for r in arts))
        items, cumulative = scan_flywheel(found, ledger)
        f = lib.flywheel()
        assert f.items == items and f.cumulative_saved == cumulative[-RECALL_POINTS:]
    finally:
        lib.close()
    again = Library(home=home, lm=FAKE_LM, embedder=object())  # filled once: a second open adds nothing
    try:
        assert again.flywheel() == f
    finally:
        again.close()
