"""Connecting to the catalog database: URL choice, SQLite pragmas, and the two kinds of transaction.

SQLite (the default, `<home>/catalog.sqlite3`) runs in WAL mode with a busy timeout and foreign keys
on, all set by a connect listener. SQLAlchemy, not the sqlite3 module, emits BEGIN, so DDL is
transactional and a write transaction can start with `BEGIN IMMEDIATE` (it takes the write lock up
front, so two writers queue on the busy timeout instead of failing on a stale snapshot). PostgreSQL
is used through psycopg 3 (connections are pinged before use, so a restarted server is reconnected to
without restarting kvgraft). A disk that fails under SQLite (full, I/O error, read-only) and a PostgreSQL
server that cannot be reached come out of `write` and `read` as kvgraft errors with one line saying what
to do (`StorageError`, `CatalogUnavailable`), never as a driver traceback. This module knows no table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from errors import CatalogUnavailable, InvalidInput, storage_error

SQLITE_NAME = "catalog.sqlite3"
BUSY_TIMEOUT_MS = 15_000
_WRITE = "kvgraft_write"  # execution option that marks a write transaction


def resolve_url(url: str | None, home: Path) -> URL:
    """None or "" -> SQLite in `home`; postgres:// and postgresql:// get the psycopg (3) driver."""
    if not url:
        home.mkdir(parents=True, exist_ok=True)
        return URL.create("sqlite", database=str(Path(home) / SQLITE_NAME))
    for bare in ("postgres://", "postgresql://"):
        if url.startswith(bare):
            url = "postgresql+psycopg://" + url[len(bare) :]
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidInput(f"catalog URL {url.split('@')[-1]!r} is not a database URL; {_URL_HINT}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return parsed
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        return parsed
    raise InvalidInput(f"catalog URL {parsed.render_as_string(hide_password=True)!r} is not supported; {_URL_HINT}")


_URL_HINT = "use postgresql+psycopg://user@host:port/dbname, or leave KVGRAFT_DB_URL unset for SQLite in the home folder"


def create(url: str | None, home: Path) -> Engine:
    resolved = resolve_url(url, home)
    if resolved.get_backend_name() == "postgresql":
        return create_engine(resolved, pool_pre_ping=True)
    engine = create_engine(resolved)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None  # the driver emits no BEGIN of its own; _sqlite_on_begin does
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")  # first: switching to WAL may wait for a lock
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


# SQLite's primary result codes for a failing disk, as the errno a file write would have raised.
_SQLITE_DISK = {13: 28, 10: 5, 8: 30}  # SQLITE_FULL -> ENOSPC, SQLITE_IOERR -> EIO, SQLITE_READONLY -> EROFS
# PostgreSQL's "the server went away" states (class 08 is connection exceptions); a deadlock or a
# constraint carries its own state and is not one of these.
_SERVER_GONE = {"57P01", "57P02", "57P03"}  # admin shutdown, crash shutdown, cannot connect now


def _translated(engine: Engine, exc: sa_exc.DBAPIError) -> Exception | None:
    """The kvgraft error a driver error stands for, or None when it is kvgraft's own business (a constraint,
    a lock timeout) and should propagate as it is."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        code = _SQLITE_DISK.get((getattr(exc.orig, "sqlite_errorcode", 0) or 0) & 0xFF)
        if code is None:
            return None
        return storage_error(code, Path(url.database).parent, needed_bytes=1 << 20)
    state = getattr(exc.orig, "sqlstate", None) or ""
    lost = state.startswith("08") or state in _SERVER_GONE or (not state and isinstance(exc, sa_exc.OperationalError))
    if exc.connection_invalidated or lost or isinstance(exc, sa_exc.InterfaceError):
        reason = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        where = f"{url.host}:{url.port or 5432}/{url.database}"
        return CatalogUnavailable(
            f"the catalog database at {where} cannot be reached ({reason}); try again when it is back "
            "(a deposit that did reach it is found again by its key, never stored twice)"
        )
    return None


@contextmanager
def _translating(engine: Engine) -> Iterator[None]:
    try:
        yield
    except sa_exc.DBAPIError as exc:
        err = _translated(engine, exc)
        if err is None:
            raise
        raise err from exc


@contextmanager
def write(engine: Engine) -> Iterator[Connection]:
    """One write transaction: commits when the block ends, rolls back if it raises."""
    with _translating(engine), engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """A connection for reads; its transaction begins on first use and is rolled back at the end."""
    with _translating(engine), engine.connect() as conn:
        yield conn
