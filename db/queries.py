"""Read-only queries across several catalog tables that the service layer needs in one round trip.

Kept beside `catalog.py` (which owns the rows and every write); each function takes an open `Catalog`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, func, or_, select

from db import connection as dbconn
from db.catalog import Catalog, _artifact, _verification_of
from db.rows import KINDS, ArtifactRow
from db.schema import artifacts, sources, verifications
from errors import InvalidInput


@dataclass(frozen=True)
class Listed:
    """One artifact as the library table shows it: its row and its latest verification record."""

    row: ArtifactRow
    verifier: str  # "none" when the artifact has no verification record
    verdict: str  # the latest record's label (VerificationRow.label); "unverified" when it has none


def listing(stmt: Select, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0) -> Select:
    """The artifact list's filters and order on a select over `artifacts` joined with `sources`: `query`
    matches the title or the source text (case-insensitive), newest first, then paged.

    One definition for every listing: `Catalog.list_artifacts` and `library_rows` both build on it."""
    if kind is not None and kind not in KINDS:
        raise InvalidInput(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if limit < 0 or offset < 0:
        raise InvalidInput(f"limit and offset must be >= 0; got limit={limit}, offset={offset}")
    if query:
        stmt = stmt.where(
            or_(artifacts.c.title.icontains(query, autoescape=True), sources.c.text.icontains(query, autoescape=True))
        )
    if kind is not None:
        stmt = stmt.where(artifacts.c.kind == kind)
    return stmt.order_by(artifacts.c.created_at.desc(), artifacts.c.id).limit(limit).offset(offset)


def library_rows(catalog: Catalog, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0) -> list[Listed]:
    """Newest first, like `Catalog.list_artifacts` (same filters), each row joined with its latest
    verification in the same query: one statement for the whole table, not one per row."""
    latest = (
        select(verifications.c.artifact_id, func.max(verifications.c.id).label("vid"))
        .where(verifications.c.artifact_id.is_not(None))
        .group_by(verifications.c.artifact_id)
        .subquery()
    )
    vcols = [c.label(f"v_{c.name}") for c in verifications.c]
    stmt = (
        select(artifacts, *vcols)
        .join(sources, sources.c.artifact_id == artifacts.c.id)
        .outerjoin(latest, latest.c.artifact_id == artifacts.c.id)
        .outerjoin(verifications, verifications.c.id == latest.c.vid)
    )
    stmt = listing(stmt, query, kind, limit, offset)
    out = []
    with dbconn.read(catalog._engine) as conn:
        for m in conn.execute(stmt):
            if m.v_id is None:
                out.append(Listed(_artifact(m), "none", "unverified"))
                continue
            v = _verification_of({c.name: m._mapping[f"v_{c.name}"] for c in verifications.c})
            out.append(Listed(_artifact(m), v.verifier, v.label))
    return out
