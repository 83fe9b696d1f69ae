"""The catalog: every SQL statement kvgraft runs, behind one class that speaks in frozen rows.

It records artifacts (with their source text, verifier records and embeddings), the answer ledger,
and a `version` that replicas poll. It never opens a blob: `add_deposit` is handed a `write_blob`
callable and only stores the content hash it returns. Every multi-row write is one transaction.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Select, delete, func, insert, or_, select, update
from sqlalchemy import exc as sa_exc

from db import aggregates, migrations
from db import connection as dbconn
from db.retention import Retention, prune
from db.rows import (
    HEX64,
    KINDS,
    LEDGER_QUERY_CHARS,
    ArtifactRow,
    LedgerRow,
    LedgerTotals,
    SourceRow,
    VerificationRow,
    artifact_row,
    ledger_row,
    utcnow,
    verification_row,
)
from db.schema import artifacts, embeddings, ledger, meta, sources, verifications
from errors import ArtifactNotFound, CatalogUnavailable, IncompatibleArtifact, IntegrityError, InvalidInput, KvgraftError

EXPORT_FORMAT = "kvgraft-catalog/1"
MIN_PREFIX = 8
LIST_HINT = "list ids with `cli.py list`"

Embedding = tuple[str, bytes, int, str]  # (embedder_id, float32 little-endian vector, dim, text_sha256)


def _artifact_values(row: ArtifactRow) -> dict[str, Any]:
    return {**asdict(row), "end_pos": row.end_pos}


def _new(row: VerificationRow | LedgerRow) -> dict[str, Any]:
    """Column values of a row about to be inserted: its id is the database's to assign."""
    values = {k: v for k, v in asdict(row).items() if k != "id"}
    if isinstance(row, VerificationRow):
        for k in ("question_token_ids", "generated_token_ids"):
            values[k] = json.dumps(list(values[k])) if values[k] else None
    return values


def _verification_json(v: VerificationRow) -> dict[str, Any]:
    d = {**asdict(v), "created_at": v.created_at.isoformat()}
    return d | {k: list(d[k]) for k in ("question_token_ids", "generated_token_ids")}


def _verification(m: Any) -> VerificationRow:
    return verification_row({c: m._mapping[c] for c in verifications.c.keys()})


def _check_embedding(embedding: Embedding) -> None:
    embedder_id, vector, dim, text_sha256 = embedding
    if not embedder_id:
        raise InvalidInput("embedder_id must not be empty")
    if dim <= 0 or len(vector) != 4 * dim:
        raise InvalidInput(f"embedding vector must be {dim} float32 values ({4 * dim} bytes); got {len(vector)} bytes")
    if not HEX64.match(text_sha256):
        raise InvalidInput(f"text_sha256 must be 64 lowercase hex digits (a SHA-256); got {text_sha256!r}")


def listing(
    stmt: Select,
    query: str = "",
    kind: str | None = None,
    limit: int = 100,
    offset: int = 0,
    fingerprints: tuple[str, ...] | None = None,
) -> Select:
    """The artifact list's filters and order on a select over `artifacts` joined with `sources`: `query`
    matches the title or the source text (case-insensitive), `fingerprints` (db.models.fingerprints_of) keeps
    those models' artifacts, newest first, then paged.

    One definition for every listing: `Catalog.list_artifacts` and `db.queries.library_rows` both build on it."""
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
    if fingerprints is not None:
        stmt = stmt.where(artifacts.c.model_fingerprint.in_(fingerprints))
    return stmt.order_by(artifacts.c.created_at.desc(), artifacts.c.id).limit(limit).offset(offset)


class Catalog:
    """Open with `Catalog.open(url, home)`; close with `.close()` (or use it as a context manager)."""

    def __init__(self, engine: Engine, retention: Retention | None = None):
        self._engine = engine
        self.retention = Retention.from_env() if retention is None else retention

    @classmethod
    def open(cls, url: str | None, home: Path, retention: Retention | None = None) -> Catalog:
        """url None or "": SQLite at `<home>/catalog.sqlite3`. Runs pending migrations. Ledger retention
        comes from the environment unless given."""
        engine = dbconn.create(url, Path(home))
        try:
            migrations.migrate(engine)
        except (sa_exc.OperationalError, CatalogUnavailable) as e:
            engine.dispose()
            e = e.__cause__ if isinstance(e, CatalogUnavailable) else e  # the driver's own words
            reason = str(e.orig).strip().splitlines()[0] if getattr(e, "orig", None) else str(e)
            shown = engine.url.render_as_string(hide_password=True)
            raise KvgraftError(
                f"cannot open the catalog at {shown}: {reason}; check KVGRAFT_DB_URL and that the database server is running"
            ) from e
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, retention)

    @property
    def url(self) -> str:
        """The database URL with any password masked, for display."""
        return self._engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- artifacts: reads ------------------------------------------------------------------------

    def _resolve(self, conn: Connection, ref: str) -> str:
        """Full id for a 64-hex id or a unique prefix of at least 8 hex digits."""
        key = (ref or "").strip().lower()
        if not (MIN_PREFIX <= len(key) <= 64 and all(c in "0123456789abcdef" for c in key)):
            raise ArtifactNotFound(
                f"{ref!r} is not an artifact id: give the 64-hex id or a unique prefix of at least {MIN_PREFIX} hex digits; {LIST_HINT}"
            )
        if len(key) == 64:
            found = list(conn.scalars(select(artifacts.c.id).where(artifacts.c.id == key)))
        else:
            found = list(
                conn.scalars(select(artifacts.c.id).where(artifacts.c.id.startswith(key)).order_by(artifacts.c.id).limit(3))
            )
        if not found:
            raise ArtifactNotFound(f"no artifact {key} in this catalog; {LIST_HINT}")
        if len(found) > 1:
            raise ArtifactNotFound(
                f"id prefix {key} matches more than one artifact ({', '.join(f[:16] for f in found[:2])}, ...); give more hex digits"
            )
        return found[0]

    def _row(self, conn: Connection, artifact_id: str) -> ArtifactRow | None:
        m = conn.execute(select(artifacts).where(artifacts.c.id == artifact_id)).first()
        return artifact_row(m) if m else None

    def get(self, ref: str) -> ArtifactRow:
        """The artifact with this id (or unique id prefix of >= 8 hex digits); ArtifactNotFound otherwise."""
        with dbconn.read(self._engine) as conn:
            row = self._row(conn, self._resolve(conn, ref))
            assert row is not None, "a resolved id must have a row"
            return row

    def source(self, ref: str) -> SourceRow:
        with dbconn.read(self._engine) as conn:
            m = conn.execute(select(sources).where(sources.c.artifact_id == self._resolve(conn, ref))).first()
            assert m is not None, "every artifact is deposited with its source"
            return SourceRow(**m._mapping)

    def verifications(self, ref: str) -> list[VerificationRow]:
        with dbconn.read(self._engine) as conn:
            key = self._resolve(conn, ref)
            rows = conn.execute(select(verifications).where(verifications.c.artifact_id == key).order_by(verifications.c.id))
            return [_verification(m) for m in rows]

    def chain(self, ref: str) -> list[ArtifactRow]:
        """The artifact and its ancestors, root first: the order in which they are grafted."""
        with dbconn.read(self._engine) as conn:
            return self._chain(conn, self._resolve(conn, ref))

    def _chain(self, conn: Connection, key: str) -> list[ArtifactRow]:
        out: list[ArtifactRow] = []
        next_id: str | None = key
        while next_id is not None:
            row = self._row(conn, next_id)
            assert row is not None, f"artifact {next_id} is referenced as a parent but missing"
            out.append(row)
            next_id = row.parent_id
        out.reverse()
        assert out[0].depth == 0 and len(out) == out[-1].depth + 1, f"chain of {key} is inconsistent with its depth"
        return out

    def children(self, ref: str) -> list[ArtifactRow]:
        """Artifacts deposited with this one as their parent, oldest first."""
        with dbconn.read(self._engine) as conn:
            key = self._resolve(conn, ref)
            rows = conn.execute(
                select(artifacts).where(artifacts.c.parent_id == key).order_by(artifacts.c.created_at, artifacts.c.id)
            )
            return [artifact_row(m) for m in rows]

    def list_artifacts(
        self,
        query: str = "",
        kind: str | None = None,
        limit: int = 100,
        offset: int = 0,
        fingerprints: tuple[str, ...] | None = None,
    ) -> list[ArtifactRow]:
        """Newest first. `query` matches case-insensitively (ASCII case) anywhere in the title or source text;
        `fingerprints` keeps those models' artifacts."""
        stmt = listing(
            select(artifacts).join(sources, sources.c.artifact_id == artifacts.c.id), query, kind, limit, offset, fingerprints
        )
        with dbconn.read(self._engine) as conn:
            return [artifact_row(m) for m in conn.execute(stmt)]

    def count_artifacts(self) -> int:
        with dbconn.read(self._engine) as conn:
            return int(conn.scalar(select(func.count()).select_from(artifacts)) or 0)

    def total_tokens(self) -> int:
        """Sum of every artifact's own tokens: what the store holds, chains counted once."""
        with dbconn.read(self._engine) as conn:
            return int(conn.scalar(select(func.coalesce(func.sum(artifacts.c.tokens), 0))) or 0)

    def content_refcount(self, content_sha256: str) -> int:
        """How many artifact rows point at this blob (0: the blob may be removed)."""
        with dbconn.read(self._engine) as conn:
            return int(
                conn.scalar(select(func.count()).select_from(artifacts).where(artifacts.c.content_sha256 == content_sha256)) or 0
            )

    def all_content_hashes(self) -> set[str]:
        """Every blob the catalog references (fsck compares this with the blob store)."""
        with dbconn.read(self._engine) as conn:
            return set(conn.scalars(select(artifacts.c.content_sha256).distinct()))

    def version(self) -> int:
        """Bumped by every change to artifacts or embeddings; a replica whose index was built at an
        older version must rebuild it."""
        with dbconn.read(self._engine) as conn:
            return int(conn.scalar(select(meta.c.version).where(meta.c.id == 1)))

    # -- artifacts: writes -----------------------------------------------------------------------

    @staticmethod
    def _bump(conn: Connection) -> None:
        conn.execute(update(meta).where(meta.c.id == 1).values(version=meta.c.version + 1))

    def _lineage(self, conn: Connection, row: ArtifactRow) -> ArtifactRow:
        """`row` with root_id and depth derived from its parent, after checking the parent fits."""
        if row.parent_id is None:
            return replace(row, root_id=row.id, depth=0)
        parent = self._row(conn, row.parent_id)
        if parent is None:
            raise ArtifactNotFound(
                f"parent artifact {row.parent_id} of {row.id} is not in this catalog; deposit or import the parent first"
            )
        if parent.model_fingerprint != row.model_fingerprint:
            raise IncompatibleArtifact(
                f"artifact {row.id} was made by model {row.model_fingerprint[:16]} but its parent {parent.id} by {parent.model_fingerprint[:16]}; "
                "a chain must use one model"
            )
        if row.start != parent.end_pos:
            raise InvalidInput(
                f"artifact {row.id} starts at position {row.start} but its parent ends at {parent.end_pos}; a child continues where its parent ends"
            )
        return replace(row, root_id=parent.root_id, depth=parent.depth + 1)

    @staticmethod
    def _insert_embedding(conn: Connection, artifact_id: str, embedding: Embedding) -> None:
        embedder_id, vector, dim, text_sha256 = embedding
        conn.execute(
            insert(embeddings).values(
                artifact_id=artifact_id, embedder_id=embedder_id, dim=dim, vector=bytes(vector), text_sha256=text_sha256
            )
        )

    def add_deposit(
        self,
        artifact: ArtifactRow,
        source: SourceRow,
        verification: VerificationRow | None,
        embedding: Embedding | None,
        write_blob: Callable[[], str],
    ) -> ArtifactRow:
        """Record a new artifact in ONE transaction, calling `write_blob()` inside it before commit.

        `write_blob` writes the file atomically and returns its content hash; if `artifact.content_sha256`
        is set it must match. If anything raises, nothing is recorded (a blob already written stays
        behind as an orphan for fsck). Depositing an id that exists returns the existing row and does
        not call `write_blob`, also when a concurrent writer got there first."""
        if source.artifact_id != artifact.id:
            raise InvalidInput(f"source.artifact_id {source.artifact_id!r} must be the artifact's id {artifact.id}")
        if verification is not None:
            if verification.verdict != "pass":
                raise InvalidInput(
                    "a deposit's verification must have verdict 'pass'; record refused items with record_refusal()"
                )
            if verification.artifact_id not in (None, artifact.id):
                raise InvalidInput(
                    f"verification.artifact_id {verification.artifact_id!r} must be None or the artifact's id {artifact.id}"
                )
        if embedding is not None:
            _check_embedding(embedding)
        try:
            with dbconn.write(self._engine) as conn:
                existing = self._row(conn, artifact.id)
                if existing is not None:
                    return existing
                row = self._lineage(conn, artifact)
                content = write_blob()
                assert isinstance(content, str) and HEX64.match(content), (
                    f"write_blob must return a SHA-256 hex digest, got {content!r}"
                )
                if artifact.content_sha256 and artifact.content_sha256 != content:
                    raise IntegrityError(
                        f"blob written for artifact {artifact.id} hashes to {content}, not the expected {artifact.content_sha256}; nothing was recorded"
                    )
                row = replace(row, content_sha256=content)
                conn.execute(insert(artifacts).values(**_artifact_values(row)))
                conn.execute(insert(sources).values(**asdict(source)))
                aggregates.on_artifacts(conn, 1, row.tokens)
                if verification is not None:
                    conn.execute(insert(verifications).values(**_new(replace(verification, artifact_id=row.id))))
                if embedding is not None:
                    self._insert_embedding(conn, row.id, embedding)
                self._bump(conn)
                return row
        except sa_exc.IntegrityError:
            with dbconn.read(self._engine) as conn:  # lost a race to a concurrent deposit of the same id?
                existing = self._row(conn, artifact.id)
            if existing is None:
                raise
            return existing

    def record_refusal(self, verification: VerificationRow) -> VerificationRow:
        """Record an item the verifier refused (nothing was deposited); returns it with its id."""
        if verification.verdict != "refused":
            raise InvalidInput(
                "record_refusal takes a verification with verdict 'refused'; passing items are recorded by add_deposit"
            )
        with dbconn.write(self._engine) as conn:
            new_id = conn.execute(insert(verifications).values(**_new(verification)).returning(verifications.c.id)).scalar_one()
        return replace(verification, id=new_id)

    def set_quarantine(self, ref: str, reason: str | None) -> None:
        """Quarantine an artifact (never grafted, skipped by retrieval) or, with None, release it."""
        with dbconn.write(self._engine) as conn:
            key = self._resolve(conn, ref)
            conn.execute(update(artifacts).where(artifacts.c.id == key).values(quarantine=reason))
            self._bump(conn)

    def quarantined(self) -> list[ArtifactRow]:
        """Every quarantined artifact, by id."""
        with dbconn.read(self._engine) as conn:
            return [
                artifact_row(m)
                for m in conn.execute(select(artifacts).where(artifacts.c.quarantine.is_not(None)).order_by(artifacts.c.id))
            ]

    def embeddings(self, embedder_id: str) -> list[tuple[str, bytes]]:
        """(artifact id, float32 little-endian vector) for every artifact embedded by `embedder_id` and not
        quarantined (retrieval never finds a quarantined artifact), by id."""
        with dbconn.read(self._engine) as conn:
            rows = conn.execute(
                select(embeddings.c.artifact_id, embeddings.c.vector)
                .join(artifacts, artifacts.c.id == embeddings.c.artifact_id)
                .where(embeddings.c.embedder_id == embedder_id, artifacts.c.quarantine.is_(None))
                .order_by(embeddings.c.artifact_id)
            )
            return [(a, bytes(v)) for a, v in rows]

    def unembedded(self, embedder_id: str) -> list[tuple[str, str]]:
        """(artifact id, the text its embedding is made from: the source's question, else its text) for every
        artifact with no embedding by `embedder_id` (a store made under another embedder), by id."""
        have = select(embeddings.c.artifact_id).where(embeddings.c.embedder_id == embedder_id)
        with dbconn.read(self._engine) as conn:
            rows = conn.execute(
                select(sources.c.artifact_id, sources.c.question, sources.c.text)
                .where(sources.c.artifact_id.not_in(have))
                .order_by(sources.c.artifact_id)
            )
            return [(a, q or t) for a, q, t in rows]

    def add_embeddings(self, made: list[tuple[str, Embedding]]) -> None:
        """Add or replace (artifact id, embedding) pairs in one transaction (bumps the version once)."""
        for _, embedding in made:
            _check_embedding(embedding)
        with dbconn.write(self._engine) as conn:
            for artifact_id, embedding in made:
                key = self._resolve(conn, artifact_id)
                conn.execute(delete(embeddings).where(embeddings.c.artifact_id == key, embeddings.c.embedder_id == embedding[0]))
                self._insert_embedding(conn, key, embedding)
            self._bump(conn)

    def set_embedding(self, artifact_id: str, embedder_id: str, vector: bytes, dim: int, text_sha256: str) -> None:
        """Add or replace the artifact's embedding by `embedder_id` (bumps the version)."""
        embedding = (embedder_id, vector, dim, text_sha256)
        _check_embedding(embedding)
        with dbconn.write(self._engine) as conn:
            key = self._resolve(conn, artifact_id)
            conn.execute(delete(embeddings).where(embeddings.c.artifact_id == key, embeddings.c.embedder_id == embedder_id))
            self._insert_embedding(conn, key, embedding)
            self._bump(conn)

    def delete(self, ref: str) -> str:
        """Remove an artifact, its source and embeddings; its verifier records stay, unlinked. Refuses
        while other artifacts continue its chain. Returns its content hash: remove the blob when
        `content_refcount` of it is 0."""
        with dbconn.write(self._engine) as conn:
            key = self._resolve(conn, ref)
            kids = list(conn.scalars(select(artifacts.c.id).where(artifacts.c.parent_id == key).order_by(artifacts.c.id)))
            if kids:
                raise KvgraftError(
                    f"cannot delete artifact {key}: {len(kids)} artifact(s) continue its chain (first: {kids[0]}); delete those first, leaves before parents"
                )
            content, tokens = conn.execute(
                select(artifacts.c.content_sha256, artifacts.c.tokens).where(artifacts.c.id == key)
            ).one()
            aggregates.on_artifacts(conn, -1, -tokens)
            conn.execute(delete(embeddings).where(embeddings.c.artifact_id == key))
            conn.execute(delete(sources).where(sources.c.artifact_id == key))
            conn.execute(update(verifications).where(verifications.c.artifact_id == key).values(artifact_id=None))
            conn.execute(delete(artifacts).where(artifacts.c.id == key))
            self._bump(conn)
            return content

    # -- ledger ----------------------------------------------------------------------------------

    def add_ledger(self, entry: LedgerRow) -> int:
        """Append one answer; returns its ledger id. Whatever the caller hands in, the row keeps the first
        LEDGER_QUERY_CHARS characters of the question, its full length and the SHA-256 of the whole of it;
        the running totals (db/aggregates.py) move in the same transaction, and every `retention.every`-th
        row prunes the ledger there too."""
        values = _new(entry)
        values["query"] = entry.query[:LEDGER_QUERY_CHARS]
        values["query_chars"] = len(entry.query)
        values["query_sha256"] = hashlib.sha256(entry.query.encode("utf-8", "surrogatepass")).hexdigest()
        values["artifact_ids"] = json.dumps(list(entry.artifact_ids))
        values["output_token_ids"] = json.dumps(list(entry.output_token_ids))
        with dbconn.write(self._engine) as conn:
            new_id = int(conn.execute(insert(ledger).values(**values).returning(ledger.c.id)).scalar_one())
            aggregates.on_ledger(conn, values, entry.artifact_ids[-1] if entry.artifact_ids else None)
            if new_id % self.retention.every == 0:
                prune(conn, self.retention, entry.created_at)
            return new_id

    def prune_ledger(self, now: datetime | None = None) -> int:
        """Delete ledger rows the retention does not keep (older than `days` before `now`, beyond the
        newest `max_rows`); returns how many were deleted."""
        with dbconn.write(self._engine) as conn:
            return prune(conn, self.retention, now or utcnow())

    def ledger(self, last: int | None = None) -> list[LedgerRow]:
        """Ledger entries, oldest first; only the newest `last` of them when given."""
        stmt = select(ledger).order_by(ledger.c.id.desc())
        if last is not None:
            stmt = stmt.limit(max(last, 0))
        with dbconn.read(self._engine) as conn:
            rows = [ledger_row(m) for m in conn.execute(stmt)]
        rows.reverse()
        return rows

    def ledger_totals(self) -> LedgerTotals:
        """Sums over every answer ever recorded, pruned rows included (kept as running totals, one
        primary-key read); see LedgerTotals for what `tokens_saved` counts."""
        with dbconn.read(self._engine) as conn:
            return aggregates.ledger_totals(conn)

    def record_discovery(self, artifact_id: str, tokens_spent: int, at: datetime | None = None) -> None:
        """`solve` found and deposited `artifact_id` for `tokens_spent` tokens: later answers grafting it
        as their leaf count as its recalls on the dashboard's flywheel."""
        with dbconn.write(self._engine) as conn:
            aggregates.on_discovery(conn, artifact_id, tokens_spent, at or utcnow())

    # -- portable rows ---------------------------------------------------------------------------

    def export_rows(self, ids: Iterable[str]) -> dict[str, Any]:
        """JSON-serialisable rows of these artifacts and all their ancestors (a child is unusable
        without its chain), parents before children, with sources, verifier records and embeddings."""
        with dbconn.read(self._engine) as conn:
            chosen: dict[str, ArtifactRow] = {}
            for ref in ids:
                for row in self._chain(conn, self._resolve(conn, ref)):
                    chosen[row.id] = row
            keys = list(chosen)
            rows = sorted(chosen.values(), key=lambda r: (r.depth, r.id))
            srcs = conn.execute(select(sources).where(sources.c.artifact_id.in_(keys)).order_by(sources.c.artifact_id))
            vers = conn.execute(select(verifications).where(verifications.c.artifact_id.in_(keys)).order_by(verifications.c.id))
            embs = conn.execute(
                select(embeddings)
                .where(embeddings.c.artifact_id.in_(keys))
                .order_by(embeddings.c.artifact_id, embeddings.c.embedder_id)
            )
            return {
                "format": EXPORT_FORMAT,
                "artifacts": [{**asdict(r), "created_at": r.created_at.isoformat()} for r in rows],
                "sources": [dict(m._mapping) for m in srcs],
                "verifications": [_verification_json(v) for v in map(_verification, vers)],
                "embeddings": [{**dict(m._mapping), "vector": base64.b64encode(m.vector).decode("ascii")} for m in embs],
            }

    def import_rows(self, data: dict[str, Any]) -> list[str]:
        """Add the artifacts of an `export_rows` dict in ONE transaction; returns the ids that were new.

        Artifacts already present are skipped (their content hash must agree, else IntegrityError).
        Write the blobs first: rows are recorded as referencing them."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise InvalidInput(f"not a kvgraft catalog export: format is {found!r}, expected {EXPORT_FORMAT!r}")
        try:
            rows = [ArtifactRow(**{**a, "created_at": datetime.fromisoformat(a["created_at"])}) for a in data["artifacts"]]
            srcs = {s["artifact_id"]: SourceRow(**s) for s in data["sources"]}
            vers = [
                VerificationRow(**{**v, "created_at": datetime.fromisoformat(v["created_at"]), "id": None})
                for v in data["verifications"]
            ]
            embs = [
                (e["artifact_id"], (e["embedder_id"], base64.b64decode(e["vector"]), int(e["dim"]), e["text_sha256"]))
                for e in data["embeddings"]
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(f"catalog export is malformed ({type(e).__name__}: {e}); re-export it") from None
        for _, embedding in embs:
            _check_embedding(embedding)
        new: list[str] = []
        with dbconn.write(self._engine) as conn:
            for row in sorted(rows, key=lambda r: r.depth):
                existing = self._row(conn, row.id)
                if existing is not None:
                    if existing.content_sha256 != row.content_sha256:
                        raise IntegrityError(
                            f"artifact {row.id} is already in this catalog with content {existing.content_sha256}, "
                            f"but the import says {row.content_sha256}; one of the two stores is corrupt, run `cli.py fsck` on both"
                        )
                    continue
                if row.id not in srcs:
                    raise InvalidInput(f"catalog export has no source row for artifact {row.id}; re-export it")
                if not row.content_sha256:
                    raise InvalidInput(f"catalog export has no content hash for artifact {row.id}; re-export it")
                row = self._lineage(conn, row)
                conn.execute(insert(artifacts).values(**_artifact_values(row)))
                conn.execute(insert(sources).values(**asdict(srcs[row.id])))
                aggregates.on_artifacts(conn, 1, row.tokens)
                new.append(row.id)
            fresh = set(new)
            for v in vers:
                if v.artifact_id in fresh:
                    conn.execute(insert(verifications).values(**_new(v)))
            for artifact_id, embedding in embs:
                if artifact_id in fresh:
                    self._insert_embedding(conn, artifact_id, embedding)
            if new:
                self._bump(conn)
        return new
