"""Read-only queries across several catalog tables that the service layer needs in one round trip.

Kept beside `catalog.py` (which owns every write and the listing filters); each function takes an open `Catalog`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from db import connection as dbconn
from db.catalog import Catalog, listing
from db.rows import ArtifactRow, artifact_row, verification_row
from db.schema import artifacts, sources, verifications


@dataclass(frozen=True)
class Listed:
    """One artifact as the library table shows it: its row and its latest verification record."""

    row: ArtifactRow
    verifier: str  # "none" when the artifact has no verification record
    verdict: str  # the latest record's label (VerificationRow.label); "unverified" when it has none


def library_rows(
    catalog: Catalog,
    query: str = "",
    kind: str | None = None,
    limit: int = 100,
    offset: int = 0,
    fingerprints: tuple[str, ...] | None = None,
) -> list[Listed]:
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
    stmt = listing(stmt, query, kind, limit, offset, fingerprints)
    out = []
    with dbconn.read(catalog._engine) as conn:
        for m in conn.execute(stmt):
            if m.v_id is None:
                out.append(Listed(artifact_row(m), "none", "unverified"))
                continue
            v = verification_row({c.name: m._mapping[f"v_{c.name}"] for c in verifications.c})
            out.append(Listed(artifact_row(m), v.verifier, v.label))
    return out
