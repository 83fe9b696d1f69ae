"""How long the answer ledger's rows live (`Retention`, from the environment) and the pruning that applies it
inside the catalog's write transaction. The totals the app shows are running sums (db/aggregates.py): a pruned
row's contribution stays in them. It owns no connection: the catalog hands it its open one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, select

import settings
from db import aggregates
from db.rows import as_utc
from db.schema import ledger


@dataclass(frozen=True)
class Retention:
    """How long ledger rows live: at most `days` old and the newest `max_rows`; None keeps them all.

    From KVGRAFT_LEDGER_DAYS and KVGRAFT_LEDGER_MAX_ROWS. The totals the app shows are running sums
    (db/aggregates.py): a pruned row's contribution stays in them."""

    days: float | None = None
    max_rows: int | None = None
    every: int = 100  # add_ledger prunes on every `every`-th ledger id

    @classmethod
    def from_env(cls) -> Retention:
        return cls(days=settings.get("KVGRAFT_LEDGER_DAYS"), max_rows=settings.get("KVGRAFT_LEDGER_MAX_ROWS"))


def prune(conn: Connection, keep: Retention, now: datetime) -> int:
    """Delete the ledger rows `keep` does not keep (older than `days` before `now`, beyond the newest
    `max_rows`) on `conn`, inside the caller's transaction; returns how many were deleted."""
    deleted = 0
    if keep.days is not None:
        cutoff = as_utc(now) - timedelta(days=keep.days)
        deleted += conn.execute(delete(ledger).where(ledger.c.created_at < cutoff)).rowcount
    if keep.max_rows is not None:
        oldest_kept = select(ledger.c.id).order_by(ledger.c.id.desc()).offset(keep.max_rows - 1).limit(1)
        floor = conn.execute(oldest_kept).scalar()
        if floor is not None:
            deleted += conn.execute(delete(ledger).where(ledger.c.id < floor)).rowcount
    aggregates.prune(conn)
    return deleted
