"""Running totals kept beside the rows they sum, so that an anonymous read never scans the ledger.

Owns three tables (see `schema.py`): `totals` (one row: the ledger's sums and the store's size),
`discoveries` (per item `solve` found: what finding it cost and what its recalls computed) and
`recall_points` (the flywheel's cumulative tokens saved, one point per recall, newest kept). The
catalog calls the `on_*` functions inside the same transaction as the write they account for, so a
total is never ahead of or behind its rows; pruning the ledger leaves every total as it was. The
reads here are a bounded number of primary-key or indexed, LIMITed statements whatever the ledger's
size. Knows nothing about what the dashboard draws.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, insert, select, update

from db import connection as dbconn
from db.rows import LedgerTotals, as_utc
from db.schema import artifacts, discoveries, ledger, recall_points, totals

LEDGER_SUMS = tuple(f.name for f in LedgerTotals.__dataclass_fields__.values())
RECALL_POINTS_KEPT = 2_000  # the newest recall points kept (each carries the running total, so older ones add nothing)


@dataclass(frozen=True)
class StoreSize:
    artifacts: int
    tokens: int  # sum of every artifact's own tokens: chains counted once


@dataclass(frozen=True)
class Discovery:
    """One item `solve` found and deposited: the tokens finding it cost and, since then, its recalls
    (answers whose leaf artifact it was), what they computed, and what they saved against finding it again."""

    artifact_id: str
    tokens_spent: int
    recalls: int
    recall_tokens: int
    saved: int
    created_at: datetime


# ---- writes: called by the catalog inside its own transaction ---------------------------------


def ledger_delta(values: dict) -> dict[str, int]:
    """What one ledger row (its column values) adds to each of the ledger sums (LedgerTotals' rules)."""
    decode = values["decode_tokens"] if values["baseline_measured"] else 0
    return {
        "answers": 1,
        "grafted_tokens": values["grafted_tokens"],
        "computed_tokens": values["computed_tokens"],
        "decode_tokens": values["decode_tokens"],
        "baseline_tokens": values["baseline_tokens"],
        "tokens_saved": values["baseline_tokens"] - values["computed_tokens"] - decode,
        "flops": values["flops"],
        "baseline_flops": values["baseline_flops"],
        "checks_passed": 1 if values["exact"] is True else 0,
        "checks_failed": 1 if values["exact"] is False else 0,
    }


def _add(conn: Connection, delta: dict[str, int]) -> None:
    c = totals.c
    changes = {c[k]: c[k] + v for k, v in delta.items() if v}
    if changes:
        conn.execute(update(totals).where(c.id == 1).values(changes))


def on_ledger(conn: Connection, values: dict, leaf: str | None) -> None:
    """Account for one new ledger row (its column values; `leaf` the last artifact grafted): the ledger sums,
    and where the leaf is an item `solve` found, the flywheel's recall figures."""
    _add(conn, ledger_delta(values))
    if leaf is not None:
        _recall(conn, leaf, values["computed_tokens"] + values["decode_tokens"], values["created_at"])


def _recall(conn: Connection, leaf: str, cost: int, at: datetime) -> None:
    spent = conn.scalar(select(discoveries.c.tokens_spent).where(discoveries.c.artifact_id == leaf))
    if spent is None:
        return
    gain = max(0, spent - cost)
    d = discoveries.c
    conn.execute(
        update(discoveries)
        .where(d.artifact_id == leaf)
        .values(recalls=d.recalls + 1, recall_tokens=d.recall_tokens + cost, saved=d.saved + gain)
    )
    saved = conn.execute(
        update(totals).where(totals.c.id == 1).values(recall_saved=totals.c.recall_saved + gain).returning(totals.c.recall_saved)
    ).scalar_one()
    conn.execute(insert(recall_points).values(created_at=as_utc(at), saved_total=saved))


def on_artifacts(conn: Connection, count: int, tokens: int) -> None:
    """Artifacts added (count > 0) or removed (count < 0) with their own tokens."""
    _add(conn, {"artifacts": count, "store_tokens": tokens})


def on_discovery(conn: Connection, artifact_id: str, tokens_spent: int, at: datetime) -> None:
    """`solve` found and deposited `artifact_id` for `tokens_spent` tokens; a later solve of the same item
    replaces the cost (recalls already counted keep what they saved)."""
    conn.execute(update(totals).where(totals.c.id == 1).values(flywheel_filled=True))  # kept here from now on
    d = discoveries.c
    done = conn.execute(update(discoveries).where(d.artifact_id == artifact_id).values(tokens_spent=tokens_spent)).rowcount
    if not done:
        conn.execute(
            insert(discoveries).values(
                artifact_id=artifact_id, tokens_spent=tokens_spent, recalls=0, recall_tokens=0, saved=0, created_at=as_utc(at)
            )
        )


def prune(conn: Connection) -> int:
    """Drop recall points beyond the newest RECALL_POINTS_KEPT (the totals keep their contribution)."""
    floor = conn.scalar(select(recall_points.c.id).order_by(recall_points.c.id.desc()).offset(RECALL_POINTS_KEPT - 1).limit(1))
    return 0 if floor is None else conn.execute(delete(recall_points).where(recall_points.c.id < floor)).rowcount


# ---- reads: each a bounded statement ----------------------------------------------------------


def ledger_totals(conn: Connection) -> LedgerTotals:
    row = conn.execute(select(*(totals.c[k] for k in LEDGER_SUMS)).where(totals.c.id == 1)).one()
    return LedgerTotals(*(int(v) for v in row))


def store_size(conn: Connection) -> StoreSize:
    row = conn.execute(select(totals.c.artifacts, totals.c.store_tokens).where(totals.c.id == 1)).one()
    return StoreSize(int(row[0]), int(row[1]))


def growth(conn: Connection, last: int) -> list[tuple[datetime, int]]:
    """(when, artifacts in the store right after it) for the newest `last` deposits still present,
    oldest first: the library's size over time without reading every artifact."""
    count = int(conn.scalar(select(totals.c.artifacts).where(totals.c.id == 1)))
    whens = list(conn.scalars(select(artifacts.c.created_at).order_by(artifacts.c.created_at.desc(), artifacts.c.id).limit(last)))
    return [(as_utc(w), count - i) for i, w in enumerate(whens)][::-1]


def recent_discoveries(conn: Connection, last: int) -> list[Discovery]:
    """The newest `last` items `solve` found, oldest first."""
    rows = conn.execute(select(discoveries).order_by(discoveries.c.created_at.desc(), discoveries.c.artifact_id).limit(last))
    out = [Discovery(**{**m._mapping, "created_at": as_utc(m.created_at)}) for m in rows]
    return out[::-1]


def recent_recalls(conn: Connection, last: int) -> list[tuple[datetime, int]]:
    """(when, tokens saved by recalls so far) for the newest `last` recalls, oldest first."""
    rows = conn.execute(
        select(recall_points.c.created_at, recall_points.c.saved_total).order_by(recall_points.c.id.desc()).limit(last)
    )
    return [(as_utc(w), int(s)) for w, s in rows][::-1]


def read(catalog, *reads: tuple) -> list:
    """Run reads above, each `(function, *args)`, in one read transaction of `catalog`; their results in order."""
    with dbconn.read(catalog._engine) as conn:
        return [fn(conn, *args) for fn, *args in reads]


def fill(catalog, found: dict[str, tuple[int, datetime]]) -> bool:
    """`fill_flywheel` in one write transaction of `catalog`, unless the flag says it is done already."""
    if read(catalog, (flywheel_filled,))[0]:
        return False
    with dbconn.write(catalog._engine) as conn:
        return fill_flywheel(conn, found)


def flywheel_filled(conn: Connection) -> bool:
    return bool(conn.scalar(select(totals.c.flywheel_filled).where(totals.c.id == 1)))


def fill_flywheel(conn: Connection, found: dict[str, tuple[int, datetime]]) -> bool:
    """Back-fill `discoveries` and `recall_points` once, for a store whose solves were recorded before the
    catalog kept them (`found`: each discovered id -> (tokens spent, when)), by one pass over the ledger
    in ledger order, counting what a scan of the whole ledger counts. Claims the one-time flag first, so two
    openers never both fill; returns whether this call filled."""
    claimed = conn.execute(
        update(totals).where(totals.c.id == 1, totals.c.flywheel_filled.is_(False)).values(flywheel_filled=True)
    ).rowcount
    if not claimed or not found:
        return bool(claimed)
    for key, (spent, at) in found.items():
        on_discovery(conn, key, spent, at)
    c = ledger.c
    for at, ids, computed, decode in conn.execute(
        select(c.created_at, c.artifact_ids, c.computed_tokens, c.decode_tokens).order_by(c.id)
    ):
        leaf = (json.loads(ids) or [None])[-1]
        if leaf in found:
            _recall(conn, leaf, computed + decode, at)
    return True
