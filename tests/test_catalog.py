"""The catalog on both backends: SQLite in tmp_path and a real PostgreSQL started for the session."""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from db import connection as dbconn
from db import migrations, schema
from db.blobs import BlobStore
from db.catalog import Catalog, _verification
from db.retention import Retention
from db.rows import ArtifactRow, LedgerRow, LedgerTotals, SourceRow, VerificationRow
from errors import ArtifactNotFound, IntegrityError, InvalidInput, KvgraftError

FP = "f" * 64  # a model fingerprint
EMBEDDER = "all-MiniLM-L6-v2"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def vec(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def cat(url, home):
    c = Catalog.open(url, home)
    yield c
    c.close()


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


class Depositor:
    """Builds rows the way services/deposit.py does: key known first, blob written inside the transaction."""

    def __init__(self, cat: Catalog, store: BlobStore):
        self.cat, self.store, self.blob_calls = cat, store, 0

    def rows(self, name: str, text: str, parent: ArtifactRow | None = None, tokens: int = 10, kind: str = "verified", **kw):
        artifact = ArtifactRow(
            id=sha(f"{FP}|{parent.id if parent else ''}|{name}"),
            content_sha256="",
            model_fingerprint=FP,
            tokens=tokens,
            start=parent.end_pos if parent else 0,
            kind=kind,
            title=name,
            parent_id=parent.id if parent else None,
            bytes=len(self.blob(name)),
            **kw,
        )
        source = SourceRow(artifact.id, text, question=f"What is {name}?", solution="by definition", answer="42")
        verification = VerificationRow(None, sha(text), "exact", "pass", reference="42", detail="42 == 42")
        return artifact, source, verification, (EMBEDDER, vec(1.0, 0.0, 0.5), 3, sha(text))

    @staticmethod
    def blob(name: str) -> bytes:
        return f"safetensors bytes of {name}".encode()

    def write_blob(self, name: str):
        def write() -> str:
            self.blob_calls += 1
            return self.store.put(self.blob(name))

        return write

    def deposit(self, name: str, text: str, parent: ArtifactRow | None = None, **kw) -> ArtifactRow:
        return self.cat.add_deposit(*self.rows(name, text, parent, **kw), write_blob=self.write_blob(name))


@pytest.fixture
def dep(cat, store) -> Depositor:
    return Depositor(cat, store)


def ledger_row(**kw) -> LedgerRow:
    base = dict(
        query="What is x?",
        prompt_sha256=sha("p"),
        artifact_ids=("a" * 64, "b" * 64),
        tier="exact",
        model_fingerprint=FP,
        output_token_ids=(1, 2, 3),
        output_sha256=sha("o"),
        grafted_tokens=800,
        computed_tokens=12,
        decode_tokens=3,
        baseline_tokens=815,
        baseline_measured=True,
        ttft_s=0.05,
        total_s=0.2,
        flops=10**12,
        baseline_flops=7 * 10**13,
        logits_sha256=sha("l"),
        baseline_ttft_s=1.5,
        exact=True,
        check_json='{"kl": 0.0}',
    )
    values = {**base, **kw}
    values.setdefault("query_sha256", sha(values["query"]))  # as the catalog stores it: the whole question's hash
    values.setdefault("query_chars", len(values["query"]))
    return LedgerRow(**values)


# -- migrations and connection --------------------------------------------------------------------

ALL_STEPS = [
    "m001_initial",
    "m002_ledger_bounds",
    "m003_verification_record",
    "m004_aggregates",
    "m005_artifact_origin",
    "m006_models",
]


def test_migrations_are_idempotent_and_match_schema(url, home):
    with Catalog.open(url, home) as first:
        assert migrations.applied(first._engine) == ALL_STEPS
        assert first.version() == 0
    with Catalog.open(url, home) as second:
        assert migrations.migrate(second._engine) == []
        assert migrations.applied(second._engine) == ALL_STEPS
        assert second.version() == 0
        inspector = sa.inspect(second._engine)
        assert set(inspector.get_table_names()) == set(schema.metadata.tables)
        for name, table in schema.metadata.tables.items():
            columns = [(c["name"], c["nullable"]) for c in inspector.get_columns(name)]
            assert columns == [(c.name, c.nullable) for c in table.columns], name
            assert inspector.get_pk_constraint(name)["constrained_columns"] == [c.name for c in table.primary_key], name


def test_a_failing_migration_step_leaves_nothing_behind(url, home, monkeypatch):
    Catalog.open(url, home).close()

    def m003_broken(conn):
        conn.execute(sa.text("CREATE TABLE half_done (x INTEGER)"))
        raise RuntimeError("step failed midway")

    monkeypatch.setattr(migrations, "STEPS", (*migrations.STEPS, ("m003_broken", m003_broken)))
    with pytest.raises(RuntimeError, match="step failed midway"):
        Catalog.open(url, home)
    monkeypatch.undo()
    with Catalog.open(url, home) as cat:
        assert "half_done" not in sa.inspect(cat._engine).get_table_names()
        assert migrations.applied(cat._engine) == ALL_STEPS


def test_a_catalog_from_a_newer_kvgraft_is_refused(url, home):
    with Catalog.open(url, home) as cat, dbconn.write(cat._engine) as conn:
        conn.execute(sa.insert(schema.schema_migrations).values(name="m999_future", applied_at=sa.func.now()))
    with pytest.raises(KvgraftError) as e:
        Catalog.open(url, home)
    assert str(e.value) == "this catalog was migrated by a newer kvgraft (unknown steps: m999_future); upgrade kvgraft to open it"


def test_sqlite_default_location_and_pragmas(home):
    with Catalog.open(None, home) as cat:
        assert cat.url == f"sqlite:///{home}/catalog.sqlite3"
        assert (home / "catalog.sqlite3").exists()
        with cat._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == dbconn.BUSY_TIMEOUT_MS
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


@pytest.mark.postgres
def test_postgres_url_is_displayed_without_password(pg_server, home):
    db = pg_server.create_database()
    with_password = db.replace("postgresql+psycopg://kvgraft@", "postgresql://kvgraft:s3cret@")  # trust auth ignores it
    with Catalog.open(with_password, home) as cat:
        assert cat.url == db.replace("kvgraft@", "kvgraft:***@")
        assert "s3cret" not in cat.url


def test_unreachable_postgres_says_what_to_check(home):
    from tests.pgserver import _free_port

    url = f"postgresql+psycopg://kvgraft:pw@127.0.0.1:{_free_port()}/nowhere"
    with pytest.raises(KvgraftError) as e:
        Catalog.open(url, home)
    message = str(e.value)
    assert message.startswith(f"cannot open the catalog at {url.replace(':pw@', ':***@')}: ")
    assert message.endswith("; check KVGRAFT_DB_URL and that the database server is running")
    assert "pw@" not in message


def test_unsupported_url_is_refused(home):
    with pytest.raises(InvalidInput) as e:
        Catalog.open("mysql://root:pw@localhost/kv", home)
    assert str(e.value) == (
        "catalog URL 'mysql://root:***@localhost/kv' is not supported; use postgresql+psycopg://user@host:port/dbname, "
        "or leave KVGRAFT_DB_URL unset for SQLite in the home folder"
    )


# -- deposits and reads ---------------------------------------------------------------------------


def test_deposit_get_chain_children_search(cat, dep, store):
    root = dep.deposit("Pythagoras", "In a right triangle a^2 + b^2 = c^2.")
    child = dep.deposit("Triples", "3, 4, 5 is a Pythagorean TRIPLE.", parent=root, tokens=7)
    leaf = dep.deposit("Scaling", "6, 8, 10 as well.", parent=child, tokens=5, kind="attested")
    other = dep.deposit("Free text", "Nothing to do with triangles.", kind="text")

    assert root.content_sha256 == hashlib.sha256(dep.blob("Pythagoras")).hexdigest() and store.exists(root.content_sha256)
    assert (root.root_id, root.depth, child.root_id, child.depth, leaf.depth) == (root.id, 0, root.id, 1, 2)
    assert (child.start, child.end_pos, leaf.start, leaf.end_pos) == (10, 17, 17, 22)
    assert cat.get(leaf.id) == leaf
    assert cat.get(leaf.id[:8]) == leaf and cat.get(leaf.id[:20].upper()) == leaf
    assert cat.chain(leaf.id) == [root, child, leaf]
    assert cat.chain(root.id) == [root]
    assert cat.children(root.id) == [child] and cat.children(leaf.id) == []
    assert cat.source(child.id) == SourceRow(
        child.id, "3, 4, 5 is a Pythagorean TRIPLE.", "What is Triples?", "by definition", "42"
    )
    [v] = cat.verifications(child.id)
    assert (v.artifact_id, v.verifier, v.verdict, v.reference, v.detail) == (child.id, "exact", "pass", "42", "42 == 42")
    assert isinstance(v.id, int)

    assert cat.list_artifacts() == [other, leaf, child, root]  # newest first
    assert cat.list_artifacts("triple") == [child]  # source text, any case
    assert cat.list_artifacts("PYTHAG") == [child, root]  # title or text
    assert cat.list_artifacts("triangle", kind="text") == [other]
    assert cat.list_artifacts("100%") == []  # LIKE wildcards are literal
    assert cat.list_artifacts(limit=2, offset=1) == [leaf, child]
    assert cat.count_artifacts() == 4 and cat.total_tokens() == 10 + 7 + 5 + 10
    assert cat.all_content_hashes() == {r.content_sha256 for r in (root, child, leaf, other)}
    assert cat.embeddings(EMBEDDER) == [
        (r.id, vec(1.0, 0.0, 0.5)) for r in sorted((root, child, leaf, other), key=lambda r: r.id)
    ]
    assert cat.embeddings("another-embedder") == []
    with pytest.raises(InvalidInput) as e:
        cat.list_artifacts(kind="solved")
    assert str(e.value) == "kind must be one of verified, text, attested; got 'solved'"


def test_lookup_errors_say_how_to_list_ids(cat, dep):
    twins = []
    for tail in ("0", "1"):
        artifact = replace(dep.rows(tail, tail)[0], id="abcdef0123" + tail * 54)
        twins.append(cat.add_deposit(artifact, SourceRow(artifact.id, tail), None, None, dep.write_blob(tail)))
    missing = "0123abcd" * 8
    with pytest.raises(ArtifactNotFound) as e:
        cat.get(missing)
    assert str(e.value) == f"no artifact {missing} in this catalog; list ids with `cli.py list`"
    with pytest.raises(ArtifactNotFound) as e:
        cat.source("abcdef0")
    assert str(e.value) == (
        "'abcdef0' is not an artifact id: give the 64-hex id or a unique prefix of at least 8 hex digits; list ids with `cli.py list`"
    )
    with pytest.raises(ArtifactNotFound) as e:
        cat.chain("abcdef0123")
    assert (
        str(e.value)
        == "id prefix abcdef0123 matches more than one artifact (abcdef0123000000, abcdef0123111111, ...); give more hex digits"
    )
    assert cat.get("abcdef01231") == twins[1] and cat.get(" ABCDEF01230 ") == twins[0]


def test_deposit_is_idempotent_and_skips_write_blob(cat, dep):
    first = dep.deposit("once", "only once")
    version = cat.version()
    again = dep.deposit("once", "only once")
    assert again == first and dep.blob_calls == 1
    assert cat.count_artifacts() == 1 and cat.version() == version and len(cat.verifications(first.id)) == 1


def test_write_blob_that_raises_records_nothing(cat, dep):
    def broken() -> str:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cat.add_deposit(*dep.rows("x", "x"), write_blob=broken)
    assert cat.count_artifacts() == 0 and cat.version() == 0 and cat.embeddings(EMBEDDER) == []


def test_failure_after_write_blob_records_nothing(cat, dep, store):
    artifact, source, verification, embedding = dep.rows("zero", "zero tokens", tokens=0)  # violates CHECK tokens > 0
    with pytest.raises(sa_exc.IntegrityError):
        cat.add_deposit(artifact, source, verification, embedding, dep.write_blob("zero"))
    assert dep.blob_calls == 1 and len(list(store)) == 1  # the orphan blob is fsck's business
    assert cat.count_artifacts() == 0 and cat.version() == 0 and cat.embeddings(EMBEDDER) == []

    artifact, source, verification, embedding = dep.rows("lie", "wrong hash")
    artifact = replace(artifact, content_sha256="e" * 64)
    with pytest.raises(IntegrityError) as e:
        cat.add_deposit(artifact, source, verification, embedding, dep.write_blob("lie"))
    actual = hashlib.sha256(dep.blob("lie")).hexdigest()
    assert (
        str(e.value)
        == f"blob written for artifact {artifact.id} hashes to {actual}, not the expected {'e' * 64}; nothing was recorded"
    )
    assert cat.count_artifacts() == 0 and cat.version() == 0
    with cat._engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(schema.verifications)) == 0


def test_parent_must_exist_and_fit(cat, dep):
    root = dep.deposit("root", "root")
    ghost = replace(root, id="9" * 64)
    artifact, source, _, _ = dep.rows("orphan", "orphan", parent=ghost)
    with pytest.raises(ArtifactNotFound) as e:
        cat.add_deposit(artifact, source, None, None, dep.write_blob("orphan"))
    assert (
        str(e.value) == f"parent artifact {'9' * 64} of {artifact.id} is not in this catalog; deposit or import the parent first"
    )
    artifact, source, _, _ = dep.rows("gap", "gap", parent=root)
    artifact = replace(artifact, start=root.end_pos + 1)
    with pytest.raises(InvalidInput) as e:
        cat.add_deposit(artifact, source, None, None, dep.write_blob("gap"))
    assert (
        str(e.value)
        == f"artifact {artifact.id} starts at position 11 but its parent ends at 10; a child continues where its parent ends"
    )
    assert dep.blob_calls == 1 and cat.count_artifacts() == 1


def test_delete_refuses_while_children_exist(cat, dep, store):
    root = dep.deposit("root", "root")
    child = dep.deposit("child", "child", parent=root)
    with pytest.raises(KvgraftError) as e:
        cat.delete(root.id[:12])
    assert str(e.value) == (
        f"cannot delete artifact {root.id}: 1 artifact(s) continue its chain (first: {child.id}); delete those first, leaves before parents"
    )
    version = cat.version()
    assert cat.delete(child.id) == child.content_sha256
    assert cat.version() == version + 1 and cat.content_refcount(child.content_sha256) == 0
    with pytest.raises(ArtifactNotFound):
        cat.get(child.id)
    assert cat.children(root.id) == [] and cat.embeddings(EMBEDDER) == [(root.id, vec(1.0, 0.0, 0.5))]
    with cat._engine.connect() as conn:  # the verifier record outlives the artifact, unlinked
        rows = conn.execute(sa.select(schema.verifications.c.artifact_id).order_by(schema.verifications.c.id)).all()
    assert [r[0] for r in rows] == [root.id, None]
    assert cat.content_refcount(root.content_sha256) == 1
    assert cat.delete(root.id) == root.content_sha256
    assert cat.count_artifacts() == 0 and cat.all_content_hashes() == set()


def test_version_bumps_only_with_artifacts_and_embeddings(cat, dep):
    assert cat.version() == 0
    a = dep.deposit("a", "a")
    assert cat.version() == 1
    cat.set_embedding(a.id, EMBEDDER, vec(0.0, 1.0, 0.0), 3, sha("a"))
    cat.set_embedding(a.id[:8], "other", vec(2.0), 1, sha("a"))
    assert cat.version() == 3
    assert cat.embeddings(EMBEDDER) == [(a.id, vec(0.0, 1.0, 0.0))] and cat.embeddings("other") == [(a.id, vec(2.0))]
    cat.add_ledger(ledger_row())
    cat.record_refusal(VerificationRow(None, sha("bad"), "numeric", "refused", reference="7", detail="6.9 != 7"))
    assert cat.version() == 3
    cat.delete(a.id)
    assert cat.version() == 4
    with pytest.raises(InvalidInput) as e:
        cat.set_embedding("0" * 64, EMBEDDER, vec(1.0), 2, sha("a"))
    assert str(e.value) == "embedding vector must be 2 float32 values (8 bytes); got 4 bytes"


def test_record_refusal(cat):
    refused = cat.record_refusal(VerificationRow(None, sha("item"), "sympy", "refused", reference="x**2", detail="not equal"))
    assert isinstance(refused.id, int) and refused.artifact_id is None
    with pytest.raises(InvalidInput) as e:
        cat.record_refusal(replace(refused, verdict="pass"))
    assert str(e.value) == "record_refusal takes a verification with verdict 'refused'; passing items are recorded by add_deposit"


def test_two_catalogs_see_each_other_immediately(url, home, cat, store):
    with Catalog.open(url, home) as other:
        mine, theirs = Depositor(cat, store), Depositor(other, store)
        a = mine.deposit("a", "a")
        assert other.get(a.id) == a and other.version() == 1
        b = theirs.deposit("b", "b", parent=a)
        assert cat.chain(b.id) == [a, b] and cat.version() == 2
        assert theirs.deposit("a", "a") == a and theirs.blob_calls == 1  # idempotent across instances too


def test_concurrent_deposits_of_one_id_record_one_row(url, home, cat, store):
    """Two writers race for the same id: both get the row, exactly one row exists."""
    with Catalog.open(url, home) as other:
        second_writing = threading.Event()
        results: dict[str, ArtifactRow] = {}
        mine, theirs = Depositor(cat, store), Depositor(other, store)

        def theirs_write() -> str:
            second_writing.set()
            return store.put(Depositor.blob("same"))

        def run_theirs() -> None:
            results["theirs"] = other.add_deposit(*theirs.rows("same", "same"), write_blob=theirs_write)

        thread = threading.Thread(target=run_theirs)

        def mine_write() -> str:
            thread.start()
            # PostgreSQL: the other writer cannot see our uncommitted row, so it writes too and then
            # blocks on our primary key. SQLite: it waits for our write lock and never writes.
            second_writing.wait(timeout=2 if cat._engine.dialect.name == "postgresql" else 0.2)
            return store.put(Depositor.blob("same"))

        results["mine"] = cat.add_deposit(*mine.rows("same", "same"), write_blob=mine_write)
        thread.join(timeout=30)
        assert results["theirs"] == results["mine"] and cat.count_artifacts() == 1 and cat.version() == 1
        assert second_writing.is_set() == (cat._engine.dialect.name == "postgresql")


# -- ledger ---------------------------------------------------------------------------------------


def test_ledger_round_trip_and_totals(cat):
    assert cat.ledger() == [] and cat.ledger_totals() == LedgerTotals(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    rows = [
        ledger_row(),
        ledger_row(
            tier="relocated", baseline_measured=False, baseline_tokens=812, baseline_ttft_s=None, exact=False, logits_sha256=None
        ),
        ledger_row(
            tier="none",
            artifact_ids=(),
            grafted_tokens=0,
            computed_tokens=30,
            decode_tokens=4,
            baseline_tokens=30,
            exact=None,
            check_json=None,
        ),
    ]
    ids = [cat.add_ledger(r) for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == 3
    stored = cat.ledger()
    assert stored == [replace(r, id=i) for r, i in zip(rows, ids, strict=True)]
    assert stored[1].artifact_ids == ("a" * 64, "b" * 64) and stored[0].output_token_ids == (1, 2, 3)
    assert stored[1].exact is False and stored[2].exact is None and stored[0].baseline_measured is True
    assert cat.ledger(last=2) == stored[1:] and cat.ledger(last=0) == []
    assert cat.ledger_totals() == LedgerTotals(
        answers=3,
        grafted_tokens=1600,
        computed_tokens=12 + 12 + 30,
        decode_tokens=3 + 3 + 4,
        baseline_tokens=815 + 812 + 30,
        tokens_saved=(815 - 12 - 3) + (812 - 12) + (30 - 30 - 4),
        flops=3 * 10**12,
        baseline_flops=21 * 10**13,
        checks_passed=1,
        checks_failed=1,
    )


# -- ledger bounds and retention -------------------------------------------------------------


def test_a_long_question_is_stored_bounded_with_the_whole_questions_hash(cat):
    question = "Why? " * 2_000 + "\u00e9"  # 10,001 characters, as an anonymous user may send
    ledger_id = cat.add_ledger(ledger_row(query=question, query_sha256="0" * 64, query_chars=None))
    (stored,) = cat.ledger()
    assert stored.id == ledger_id
    assert stored.query == question[:500] and len(stored.query) == 500
    assert stored.query_sha256 == hashlib.sha256(question.encode()).hexdigest()  # the caller's value is not trusted
    assert stored.query_chars == 10_001
    cat.add_ledger(ledger_row(query="What is x?"))
    assert cat.ledger()[-1].query == "What is x?" and cat.ledger()[-1].query_chars == 10


def test_retention_by_age_and_by_count(url, home):
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    with Catalog.open(url, home, retention=Retention(days=30, every=10**9)) as cat:
        for age in (90, 31, 29, 1, 0):
            cat.add_ledger(ledger_row(query=f"{age} days old", created_at=now - timedelta(days=age)))
        assert cat.prune_ledger(now) == 2
        assert [r.query for r in cat.ledger()] == ["29 days old", "1 days old", "0 days old"]
        assert cat.ledger_totals().answers == 5  # a pruned row's contribution stays in the totals
    with Catalog.open(url, home, retention=Retention(max_rows=2, every=1)) as cat:  # prunes on every insert
        cat.add_ledger(ledger_row(query="newest", created_at=now))
        assert [r.query for r in cat.ledger()] == ["0 days old", "newest"]
        assert cat.prune_ledger(now) == 0


def test_retention_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVGRAFT_LEDGER_DAYS", "7.5")
    monkeypatch.setenv("KVGRAFT_LEDGER_MAX_ROWS", "1000")
    assert Retention.from_env() == Retention(days=7.5, max_rows=1000)
    monkeypatch.setenv("KVGRAFT_LEDGER_MAX_ROWS", "lots")
    with pytest.raises(InvalidInput) as e:
        Retention.from_env()
    assert str(e.value) == "KVGRAFT_LEDGER_MAX_ROWS must be a whole number of at least 1, got 'lots'"
    monkeypatch.setenv("KVGRAFT_LEDGER_MAX_ROWS", "0")
    with pytest.raises(InvalidInput, match="^KVGRAFT_LEDGER_MAX_ROWS must be a whole number of at least 1, got '0'$"):
        Retention.from_env()
    monkeypatch.delenv("KVGRAFT_LEDGER_DAYS")
    monkeypatch.delenv("KVGRAFT_LEDGER_MAX_ROWS")
    assert Retention.from_env() == Retention(max_rows=100_000)  # bounded by default; no age limit


def test_m002_bounds_questions_already_in_the_ledger(url, home, monkeypatch):
    monkeypatch.setattr(migrations, "STEPS", migrations.STEPS[:1])
    old = Catalog.open(url, home, retention=Retention())
    values = {k: v for k, v in ledger_row(query="Q" * 1_500).__dict__.items() if k not in ("id", "query_chars")}
    values["artifact_ids"], values["output_token_ids"] = "[]", "[1]"
    with dbconn.write(old._engine) as conn:
        conn.execute(sa.insert(schema.ledger).values(**values))
    old.close()
    monkeypatch.undo()
    with Catalog.open(url, home) as cat:
        assert migrations.applied(cat._engine) == ALL_STEPS
        (row,) = cat.ledger()
        assert row.query == "Q" * 500 and row.query_chars == 1_500 and row.query_sha256 == sha("Q" * 1_500)
        assert "ix_ledger_created_at" in {i["name"] for i in sa.inspect(cat._engine).get_indexes("ledger")}


def test_m003_labels_rows_written_before_the_gate_as_not_gated(url, home, monkeypatch):
    monkeypatch.setattr(migrations, "STEPS", migrations.STEPS[:2])
    old = Catalog.open(url, home, retention=Retention())
    with dbconn.write(old._engine) as conn:
        for verifier in ("exact", "attested"):
            conn.execute(
                sa.insert(schema.verifications).values(
                    artifact_id=None, item_sha256="a" * 64, verifier=verifier, verdict="pass", detail="", created_at=sa.func.now()
                )
            )
    old.close()
    monkeypatch.undo()
    with Catalog.open(url, home) as cat:
        assert migrations.applied(cat._engine) == ALL_STEPS
        with dbconn.read(cat._engine) as conn:
            rows = [_verification(m) for m in conn.execute(sa.select(schema.verifications).order_by(schema.verifications.c.id))]
    assert [(v.provenance, v.label, v.counts_as_verified) for v in rows] == [
        ("not gated", "not verified", False),
        ("attested", "attested", False),
    ]


# -- portable rows --------------------------------------------------------------------------------


def test_export_import_round_trip(url, home, tmp_path, cat, dep, request):
    root = dep.deposit("root", "root text")
    leaf = dep.deposit("leaf", "leaf text", parent=root)
    dep.deposit("unrelated", "not exported")
    cat.set_embedding(leaf.id, "other", vec(3.0), 1, sha("leaf text"))
    data = json.loads(json.dumps(cat.export_rows([leaf.id[:8]])))  # JSON-serialisable
    assert [a["id"] for a in data["artifacts"]] == [root.id, leaf.id]  # the chain comes along, parents first

    target_url = None if url is None else request.getfixturevalue("pg_server").create_database()
    with Catalog.open(target_url, tmp_path / "target") as target:
        assert sorted(target.import_rows(data)) == sorted([root.id, leaf.id])
        assert target.chain(leaf.id) == [root, leaf] and target.count_artifacts() == 2 and target.version() == 1
        assert target.source(leaf.id) == cat.source(leaf.id)
        strip = lambda vs: [replace(v, id=None) for v in vs]  # noqa: E731 - ids are local serials
        assert strip(target.verifications(leaf.id)) == strip(cat.verifications(leaf.id))
        for embedder in (EMBEDDER, "other"):
            assert target.embeddings(embedder) == [e for e in cat.embeddings(embedder) if e[0] in (root.id, leaf.id)]
        assert target.import_rows(data) == [] and target.version() == 1  # idempotent
        assert target.export_rows([leaf.id]) == data

        data["artifacts"][0]["content_sha256"] = "d" * 64
        with pytest.raises(IntegrityError) as e:
            target.import_rows(data)
        assert str(e.value) == (
            f"artifact {root.id} is already in this catalog with content {root.content_sha256}, but the import says {'d' * 64}; "
            "one of the two stores is corrupt, run `cli.py fsck` on both"
        )
        with pytest.raises(InvalidInput) as e:
            target.import_rows({"format": "something/9"})
        assert str(e.value) == "not a kvgraft catalog export: format is 'something/9', expected 'kvgraft-catalog/1'"


def test_import_is_one_transaction(url, tmp_path, cat, dep, request):
    root = dep.deposit("root", "root text")
    leaf = dep.deposit("leaf", "leaf text", parent=root)
    data = cat.export_rows([leaf.id])
    data["sources"] = [s for s in data["sources"] if s["artifact_id"] != leaf.id]  # the root must not be imported alone
    target_url = None if url is None else request.getfixturevalue("pg_server").create_database()
    with Catalog.open(target_url, tmp_path / "target") as target:
        with pytest.raises(InvalidInput) as e:
            target.import_rows(data)
        assert str(e.value) == f"catalog export has no source row for artifact {leaf.id}; re-export it"
        assert target.count_artifacts() == 0 and target.version() == 0


def test_rows_validate_their_enumerations():
    with pytest.raises(InvalidInput) as e:
        ArtifactRow(id="a" * 64, content_sha256="", model_fingerprint=FP, tokens=1, start=0, kind="solved")
    assert str(e.value) == "kind must be one of verified, text, attested; got 'solved'"
    with pytest.raises(InvalidInput) as e:
        ArtifactRow(id="A1", content_sha256="", model_fingerprint=FP, tokens=1, start=0, kind="text")
    assert str(e.value) == "artifact id must be 64 lowercase hex digits (a SHA-256); got 'A1'"
    with pytest.raises(InvalidInput) as e:
        VerificationRow(None, sha("x"), "regex", "pass")
    assert str(e.value) == "verifier must be one of exact, numeric, sympy, attested, none; got 'regex'"
    with pytest.raises(InvalidInput) as e:
        ledger_row(tier="partial")
    assert str(e.value) == "tier must be one of exact, relocated, none; got 'partial'"
