"""The catalog's schema history: an ordered list of named steps, each applied once, in its own
transaction, and recorded in `schema_migrations` in that same transaction.

A step is a function of a Connection. It declares the tables it creates in its own frozen MetaData,
never `schema.py`'s (which describes the latest state and will move on); to change the schema,
append a step `m002_...` and update `schema.py` to match. Concurrent openers are serialised (SQLite:
`BEGIN IMMEDIATE`; PostgreSQL: a transaction-scoped advisory lock), so a step never runs twice.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    text,
)

from db import connection as dbconn
from db.rows import KINDS, TIERS, VERDICTS, VERIFIERS, utcnow
from db.schema import schema_migrations
from errors import KvgraftError

_LOCK_KEY = 0x6B76_6772_6166_7401  # pg_advisory_xact_lock key: "kvgraft" migrations


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def m001_initial(conn: Connection) -> None:
    """artifacts, sources, verifications, embeddings, ledger, and the one-row meta (version 0)."""
    md = MetaData()
    h, when = String(64), DateTime(timezone=True)
    Table(
        "artifacts",
        md,
        Column("id", h, primary_key=True),
        Column("content_sha256", h, nullable=False, index=True),
        Column("model_fingerprint", Text, nullable=False),
        Column("tokens", Integer, nullable=False),
        Column("start", Integer, nullable=False),
        Column("end_pos", Integer, nullable=False),
        Column("parent_id", h, ForeignKey("artifacts.id"), nullable=True, index=True),
        Column("root_id", h, nullable=False, index=True),
        Column("depth", Integer, nullable=False),
        Column("title", Text, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("bytes", BigInteger, nullable=False),
        Column("created_at", when, nullable=False),
        CheckConstraint("tokens > 0", name="ck_artifacts_tokens"),
        CheckConstraint("start >= 0 AND end_pos = start + tokens", name="ck_artifacts_span"),
        CheckConstraint(
            "(parent_id IS NULL AND depth = 0 AND root_id = id) OR (parent_id IS NOT NULL AND depth > 0)",
            name="ck_artifacts_lineage",
        ),
        CheckConstraint("bytes >= 0", name="ck_artifacts_bytes"),
        CheckConstraint(_in("kind", KINDS), name="ck_artifacts_kind"),
    )
    Table(
        "sources",
        md,
        Column("artifact_id", h, ForeignKey("artifacts.id"), primary_key=True),
        Column("text", Text, nullable=False),
        Column("question", Text, nullable=True),
        Column("solution", Text, nullable=True),
        Column("answer", Text, nullable=True),
    )
    Table(
        "verifications",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("artifact_id", h, ForeignKey("artifacts.id"), nullable=True, index=True),
        Column("item_sha256", h, nullable=False),
        Column("verifier", String(16), nullable=False),
        Column("reference", Text, nullable=True),
        Column("verdict", String(16), nullable=False),
        Column("detail", Text, nullable=False),
        Column("created_at", when, nullable=False),
        CheckConstraint(_in("verifier", VERIFIERS), name="ck_verifications_verifier"),
        CheckConstraint(_in("verdict", VERDICTS), name="ck_verifications_verdict"),
    )
    Table(
        "embeddings",
        md,
        Column("artifact_id", h, ForeignKey("artifacts.id"), primary_key=True),
        Column("embedder_id", String(200), primary_key=True, index=True),
        Column("dim", Integer, nullable=False),
        Column("vector", LargeBinary, nullable=False),
        Column("text_sha256", h, nullable=False),
        CheckConstraint("dim > 0 AND length(vector) = 4 * dim", name="ck_embeddings_float32"),
    )
    Table(
        "ledger",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("created_at", when, nullable=False),
        Column("query_sha256", h, nullable=False),
        Column("query", Text, nullable=False),
        Column("prompt_sha256", h, nullable=False),
        Column("artifact_ids", Text, nullable=False),
        Column("tier", String(16), nullable=False),
        Column("model_fingerprint", Text, nullable=False),
        Column("output_token_ids", Text, nullable=False),
        Column("output_sha256", h, nullable=False),
        Column("logits_sha256", h, nullable=True),
        Column("grafted_tokens", Integer, nullable=False),
        Column("computed_tokens", Integer, nullable=False),
        Column("decode_tokens", Integer, nullable=False),
        Column("baseline_tokens", Integer, nullable=False),
        Column("baseline_measured", Boolean, nullable=False),
        Column("ttft_s", Float, nullable=False),
        Column("baseline_ttft_s", Float, nullable=True),
        Column("total_s", Float, nullable=False),
        Column("exact", Boolean, nullable=True),
        Column("check_json", Text, nullable=True),
        Column("flops", BigInteger, nullable=False),
        Column("baseline_flops", BigInteger, nullable=False),
        CheckConstraint(_in("tier", TIERS), name="ck_ledger_tier"),
        CheckConstraint(
            "grafted_tokens >= 0 AND computed_tokens >= 0 AND decode_tokens >= 0 AND baseline_tokens >= 0",
            name="ck_ledger_tokens",
        ),
    )
    meta = Table(
        "meta",
        md,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("version", BigInteger, nullable=False),
        CheckConstraint("id = 1", name="ck_meta_one_row"),
    )
    md.create_all(conn)
    conn.execute(insert(meta).values(id=1, version=0))


def m002_ledger_bounds(conn: Connection) -> None:
    """ledger.query_chars (the full question's length) and an index on ledger.created_at for retention;
    questions already stored are cut to 500 characters (query_sha256 already hashes the whole question)."""
    conn.execute(text("ALTER TABLE ledger ADD COLUMN query_chars INTEGER"))
    conn.execute(text("UPDATE ledger SET query_chars = length(query)"))
    conn.execute(text("UPDATE ledger SET query = substr(query, 1, 500) WHERE length(query) > 500"))
    conn.execute(text("CREATE INDEX ix_ledger_created_at ON ledger (created_at)"))


def m003_verification_record(conn: Connection) -> None:
    """What makes a verification replayable (question and generated token ids with their SHA-256, the
    generated answer, provenance) and each artifact's probe hash and quarantine reason. Rows written
    before the behavioural gate get the provenance 'not gated': they are never shown as verified."""
    for column, kind in (
        ("question_token_ids", "TEXT"),
        ("question_sha256", "VARCHAR(64)"),
        ("generated_token_ids", "TEXT"),
        ("generated_sha256", "VARCHAR(64)"),
        ("generated_answer", "TEXT"),
        ("provenance", "VARCHAR(32)"),
    ):
        conn.execute(text(f"ALTER TABLE verifications ADD COLUMN {column} {kind}"))
    conn.execute(text("UPDATE verifications SET provenance = 'attested' WHERE verifier = 'attested'"))
    conn.execute(text("UPDATE verifications SET provenance = 'not gated' WHERE provenance IS NULL"))
    conn.execute(text("ALTER TABLE artifacts ADD COLUMN probe_sha256 VARCHAR(64)"))
    conn.execute(text("ALTER TABLE artifacts ADD COLUMN quarantine TEXT"))


_SUMS = (
    ("answers", "COUNT(*)"),
    ("grafted_tokens", "SUM(grafted_tokens)"),
    ("computed_tokens", "SUM(computed_tokens)"),
    ("decode_tokens", "SUM(decode_tokens)"),
    ("baseline_tokens", "SUM(baseline_tokens)"),
    ("tokens_saved", "SUM(baseline_tokens - computed_tokens - CASE WHEN baseline_measured THEN decode_tokens ELSE 0 END)"),
    ("flops", "SUM(flops)"),
    ("baseline_flops", "SUM(baseline_flops)"),
    ("checks_passed", "SUM(CASE WHEN exact THEN 1 ELSE 0 END)"),
    ("checks_failed", "SUM(CASE WHEN NOT exact THEN 1 ELSE 0 END)"),
)


def m004_aggregates(conn: Connection) -> None:
    """Running totals (`totals`, one row), the flywheel's `discoveries` and `recall_points`, and an index on
    artifacts.created_at: what the dashboard reads instead of scanning the ledger. The totals are back-filled
    once here from the rows already stored; the discoveries from flywheel.jsonl at the first open of a
    Library (the catalog does not know that file)."""
    md = MetaData()
    h, when = String(64), DateTime(timezone=True)
    names = [n for n, _ in _SUMS] + ["artifacts", "store_tokens", "recall_saved"]
    Table(
        "totals",
        md,
        Column("id", Integer, primary_key=True, autoincrement=False),
        *(Column(n, BigInteger, nullable=False) for n in names),
        Column("flywheel_filled", Boolean, nullable=False),
        CheckConstraint("id = 1", name="ck_totals_one_row"),
    )
    Table(
        "discoveries",
        md,
        Column("artifact_id", h, primary_key=True),
        Column("tokens_spent", BigInteger, nullable=False),
        Column("recalls", BigInteger, nullable=False),
        Column("recall_tokens", BigInteger, nullable=False),
        Column("saved", BigInteger, nullable=False),
        Column("created_at", when, nullable=False, index=True),
    )
    Table(
        "recall_points",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("created_at", when, nullable=False),
        Column("saved_total", BigInteger, nullable=False),
    )
    md.create_all(conn)
    sums = ", ".join(e if e == "COUNT(*)" else f"COALESCE({e}, 0)" for _, e in _SUMS)
    conn.execute(
        text(
            f"INSERT INTO totals (id, {', '.join(names)}, flywheel_filled) SELECT 1, {sums}, "
            "(SELECT COUNT(*) FROM artifacts), (SELECT COALESCE(SUM(tokens), 0) FROM artifacts), 0, :no FROM ledger"
        ),
        {"no": False},
    )
    conn.execute(text("CREATE INDEX ix_artifacts_created_at ON artifacts (created_at)"))


def m005_artifact_origin(conn: Connection) -> None:
    """artifacts.origin: where an artifact's bytes come from when not from a deposit here (None): "imported"
    (a bundle's bytes, recomputed here and found byte-identical) or "rebuilt: ..." (recomputed here from its
    tokens because the bundle was made under another numerical definition; the bundle's bytes were not kept)."""
    conn.execute(text("ALTER TABLE artifacts ADD COLUMN origin TEXT"))


def m006_models(conn: Connection) -> None:
    """models: the names each model fingerprint was opened under in this store (artifacts record only the
    fingerprint), and an index on artifacts.model_fingerprint (one model's artifacts among several, without a
    scan). Not back-filled: a fingerprint no Library has named since is listed by its hash."""
    md = MetaData()
    Table(
        "models",
        md,
        Column("fingerprint", String(64), primary_key=True),
        Column("name", Text, primary_key=True),
        Column("first_seen", DateTime(timezone=True), nullable=False),
    )
    md.create_all(conn)
    conn.execute(text("CREATE INDEX ix_artifacts_model_fingerprint ON artifacts (model_fingerprint)"))


STEPS: tuple[tuple[str, Callable[[Connection], None]], ...] = (
    ("m001_initial", m001_initial),
    ("m002_ledger_bounds", m002_ledger_bounds),
    ("m003_verification_record", m003_verification_record),
    ("m004_aggregates", m004_aggregates),
    ("m005_artifact_origin", m005_artifact_origin),
    ("m006_models", m006_models),
)


def _begin_step(conn: Connection) -> set[str]:
    """Serialise against other openers, make sure the record table exists, return applied names."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    schema_migrations.create(conn, checkfirst=True)
    return set(conn.scalars(select(schema_migrations.c.name)))


def migrate(engine: Engine) -> list[str]:
    """Apply every step not yet recorded, in order; returns the names applied now (empty: up to date).

    Raises KvgraftError when the database records steps this code does not know (a newer kvgraft
    migrated it)."""
    known = [name for name, _ in STEPS]
    applied_now: list[str] = []
    for name, step in STEPS:
        with dbconn.write(engine) as conn:
            applied = _begin_step(conn)
            unknown = sorted(applied - set(known))
            if unknown:
                raise KvgraftError(
                    f"this catalog was migrated by a newer kvgraft (unknown steps: {', '.join(unknown)}); "
                    "upgrade kvgraft to open it"
                )
            if name in applied:
                continue
            step(conn)
            conn.execute(insert(schema_migrations).values(name=name, applied_at=utcnow()))
            applied_now.append(name)
    return applied_now


def applied(engine: Engine) -> list[str]:
    """Names recorded in schema_migrations, in order of application."""
    with dbconn.read(engine) as conn:
        rows = conn.execute(select(schema_migrations.c.name).order_by(schema_migrations.c.applied_at, schema_migrations.c.name))
        return [r[0] for r in rows]
