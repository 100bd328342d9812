"""Database engines: SQLite (WAL) embedded by default, PostgreSQL via TOOLMESH_DATABASE_URL;
Alembic migrations; the translation of driver failures into UNAVAILABLE; and the SQLite file
guard that keeps a pooled connection from outliving the file it was opened on (see
SqliteFileIdentity)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    InvalidatePoolError,
    NoSuchModuleError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from shared.errors import FailedPrecondition, InvalidArgument, Unavailable

if TYPE_CHECKING:
    from alembic.config import Config

logger = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# SQLite: how long a connection waits for a lock; and the size a WAL is cut back to when it
# restarts after a checkpoint (bounding the file a burst left behind; below it, the WAL's
# pages are reused rather than the file extended again).
BUSY_TIMEOUT_MS = 10_000
WAL_SIZE_LIMIT = 64 * 1024 * 1024


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for a bare postgresql:// URL."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def sqlite_pragmas(dbapi_conn: Any, _record: Any = None) -> None:
    """Every SQLite connection's settings (engines from make_engine, and the migrations')."""
    cur = dbapi_conn.cursor()
    # The busy timeout first, so what follows waits for a lock rather than failing; and WAL is
    # set only on a file not in WAL yet: switching needs a lock another process's checkpoint
    # may hold, and a new connection answered "database is locked" under load.
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
    cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def _check_url(url: str) -> None:
    """A URL SQLAlchemy cannot open (malformed, an unknown dialect, a driver not installed)
    as a FailedPrecondition naming it, its password hidden."""
    try:
        make_url(url).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        try:
            shown = make_url(url).render_as_string(hide_password=True)
        except ArgumentError:
            shown = "(unparsable)"
        raise FailedPrecondition(
            f"TOOLMESH_DATABASE_URL {shown} cannot be opened: {first_line(exc)} (expected "
            "sqlite:///path/to/file.db or postgresql://user:password@host:port/database)",
            reason="DATABASE_URL_INVALID",
        ) from exc


@dataclass(frozen=True)
class SqliteFileIdentity:
    """Which file a SQLite connection was opened on, and whether it could write it then.

    SQLite resolves a database's path once, when it opens it: a connection goes on reading
    and writing the file it opened, even after that file was deleted or replaced (its rows
    then go nowhere anyone will read: calls were answered OK and their log rows lost), and a
    connection opened while the file was read-only stays read-only after it is writable again
    (a pooled one refused every write it served, for good). Compared before a connection is
    used, a different identity means the connection must be opened again."""

    device: int
    inode: int
    writable: bool

    @classmethod
    def of(cls, path: str) -> SqliteFileIdentity | None:
        """The identity of the file at `path` now; None when there is none."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        # access(2) also says no for an immutable file, or one on a read-only mount (where
        # root's permissions do not matter).
        return cls(st.st_dev, st.st_ino, os.access(path, os.W_OK))

    def apply(self, dbapi_conn: Any) -> None:
        """Make a connection opened on a file that is not writable refuse writes itself.
        SQLite would open it read-only, but within a process it reuses the writable file
        descriptor of a connection closed while others held locks on the file, so a reopened
        connection may well write on; with query_only it refuses as the file does ("attempt to
        write a readonly database")."""
        if not self.writable:
            dbapi_conn.execute("PRAGMA query_only = 1")

    def changed(self, path: str) -> str | None:
        """What changed about the file at `path` since this identity was taken, or None."""
        # Compared field by field, no identity built: this runs before every commit.
        try:
            st = os.stat(path)
        except OSError:
            return "it was deleted"
        if st.st_ino != self.inode or st.st_dev != self.device:
            return "it was replaced by another file"
        writable = os.access(path, os.W_OK)
        if writable == self.writable:
            return None
        return "it became writable" if writable else "it became read-only"


def sqlite_file_path(url: str) -> str | None:
    """The file of a SQLite URL on the standard driver (a plain path: no URI filename, no
    query), None for any other database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.get_driver_name() not in ("", "pysqlite"):
        return None
    database = parsed.database or ""
    if not database or database == ":memory:" or database.startswith("file:") or parsed.query:
        return None
    return database


_FILE_IDENTITY = "toolmesh_sqlite_file"


def _guard_sqlite_file(engine: Engine, path: str) -> None:
    """Record the file each connection opens, and open a connection again when its file was
    deleted, replaced, or changed between read-only and writable since (see
    SqliteFileIdentity): on checkout, so a request never runs on a stale connection, and
    every pooled connection of the old file is recycled at its next checkout."""

    @event.listens_for(engine, "connect")
    def _record_file(dbapi_conn: Any, record: Any) -> None:
        opened = record.info[_FILE_IDENTITY] = SqliteFileIdentity.of(path)
        if opened is not None:
            opened.apply(dbapi_conn)

    @event.listens_for(engine, "checkout")
    def _check_file(_dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        opened = record.info.get(_FILE_IDENTITY)
        change = None if opened is None else opened.changed(path)
        if change is None:  # the same file (or one this process could not stat: unguarded)
            return
        logger.warning(
            "SQLite database %s changed since it was opened (%s): reopening", path, change
        )
        raise InvalidatePoolError(f"the SQLite database file {path} changed: {change}")


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    _check_url(url)
    if url.startswith("sqlite"):
        _ensure_sqlite_dir(url)
        # Connections to a file are cheap: enough of them for the registry's handler threads
        # (TOOLMESH_HANDLER_THREADS) and its own reads at once; beyond pool_size they are closed
        # when returned. (An in-memory database has one connection per thread, no such pool.)
        database = make_url(url).database or ""
        in_memory = database in ("", ":memory:") or "mode=memory" in url
        pool: dict[str, Any] = {} if in_memory else {"pool_size": 5, "max_overflow": 40}
        engine = create_engine(url, connect_args={"timeout": 10}, **pool)
        event.listen(engine, "connect", sqlite_pragmas)
        path = sqlite_file_path(url)
        if path is not None:
            _guard_sqlite_file(engine, path)
        return engine
    # Parameters the URL sets itself (`?keepalives_idle=60`) win over these defaults.
    given = set(make_url(url).query)
    connect_args = {k: v for k, v in POSTGRES_CONNECT_DEFAULTS.items() if k not in given}
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args
    )


# libpq connection parameters of every PostgreSQL connection. A server whose host vanished
# (powered off, partitioned: no RST comes back) left a connection waiting for its answer until
# the kernel's defaults gave up — two hours of keepalive idle for a read, about fifteen minutes
# of retransmissions for a write — holding a handler thread and a pool connection throughout.
# With these a dead peer is found within about half a minute: keepalive probes after 10 s idle,
# every 5 s, 3 unanswered, and sent data unacknowledged for 30 s (TCP_USER_TIMEOUT).
POSTGRES_CONNECT_DEFAULTS: dict[str, int] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    # Alembic is imported where migrations run, not by every service that opens an engine.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str) -> None:
    """Apply every migration up to head (idempotent)."""
    from alembic import command

    url = normalize_url(url)
    _check_url(url)
    _ensure_sqlite_dir(url)
    with translate_db_errors():
        command.upgrade(alembic_config(url), "head")


@contextlib.contextmanager
def translate_db_errors() -> Iterator[None]:
    """Turn a database that cannot be reached into Unavailable (gRPC UNAVAILABLE), and a value
    it cannot store into InvalidArgument."""
    try:
        yield
    except PoolTimeoutError as exc:  # every connection of this process's pool stayed busy
        logger.warning("database connection pool exhausted: %s", exc)
        raise Unavailable(
            f"database busy: no free connection in this process's pool ({first_line(exc)})",
            reason="DATABASE_UNAVAILABLE",
        ) from exc
    except DataError as exc:  # a value this database cannot hold (PostgreSQL: NUL, too long)
        raise InvalidArgument(
            f"a value cannot be stored: {first_line(exc)}", reason="VALUE_NOT_STORABLE"
        ) from exc
    except DBAPIError as exc:
        error = database_error(exc)
        if error is None:
            raise
        raise error from exc


R = TypeVar("R")


def upsert_row(
    sessions: sessionmaker[Session],
    row_type: type[R],
    key: dict[str, Any],
    fill: Callable[[R], None],
) -> None:
    """Insert the `row_type` row of primary key `key` (column names to values), or update the
    stored one, `fill` setting its other columns, in one transaction. Writers racing on a new
    key all succeed: the one whose insert loses on the key updates the row the other inserted
    (a read-then-insert alone fails it)."""
    for attempt in range(2):
        try:
            with translate_db_errors(), sessions.begin() as s:
                row = s.get(row_type, key)
                if row is None:
                    row = row_type(**key)
                    s.add(row)
                fill(row)
            return
        except IntegrityError:
            if attempt:
                raise


def database_error(exc: BaseException) -> Unavailable | None:
    """The Unavailable to answer for a database error — SQLAlchemy's DBAPIError or the
    driver's own, raised by code that works on the driver's connection — when the database
    cannot serve (is_unavailable) or lacks this release's schema; None for an error of the
    statement itself (a bug: it stays what it is)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if _schema_missing(orig):  # a database not migrated to this release (yet)
        logger.warning("database schema not ready: %s", orig)
        return Unavailable(
            f"the database schema is not migrated to this release ({first_line(exc)}): run "
            "`toolmesh db upgrade`, or start the registry, which migrates on start",
            reason="SCHEMA_NOT_READY",
        )
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        logger.warning("database connection lost: %s", orig)
        return Unavailable(
            f"database connection lost: {first_line(exc)}", reason="DATABASE_UNAVAILABLE"
        )
    if is_unavailable(orig):
        logger.warning("database unavailable: %s", orig)
        return unavailable(exc)
    return None


# PostgreSQL SQLSTATE classes of a server that cannot serve now rather than of a statement in
# error: connection exception, insufficient resources (disk full, out of memory, too many
# connections), operator intervention (shutting down or starting up, a terminated backend) and
# system error (I/O); and a read-only transaction (a standby after a failover, or
# default_transaction_read_only), which psycopg raises as an InternalError.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "58")
_UNAVAILABLE_SQLSTATES = frozenset({"25006"})
# SQLite's errors about the file rather than the statement, by their primary error name (its
# extended names start with it, e.g. SQLITE_IOERR_WRITE): some are a DatabaseError, not an
# OperationalError (a damaged file, or one that is not a database).
_SQLITE_UNAVAILABLE = (
    "SQLITE_CANTOPEN",
    "SQLITE_CORRUPT",
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_NOTADB",
    "SQLITE_READONLY",
)


# PEP 249's classes for a database that cannot serve (a driver's own subclasses of them too,
# e.g. psycopg's AdminShutdown), named so that no driver need be imported.
_PEP249_UNAVAILABLE = frozenset({"OperationalError", "InterfaceError"})


def is_unavailable(error: BaseException | None) -> bool:
    """Whether a driver error (sqlite3 or psycopg) says the database cannot serve now: it is
    down, unreachable, out of room or connections, read-only, or its file is damaged; not that
    a statement or a value is wrong."""
    if error is None:
        return False
    if any(cls.__name__ in _PEP249_UNAVAILABLE for cls in type(error).__mro__):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and (
        sqlstate in _UNAVAILABLE_SQLSTATES or sqlstate.startswith(_UNAVAILABLE_SQLSTATE_CLASSES)
    ):
        return True
    name = getattr(error, "sqlite_errorname", None)
    return isinstance(name, str) and name.startswith(_SQLITE_UNAVAILABLE)


async def bounded_db_wait(operation: Awaitable[T], wait_s: float, what: str) -> T:
    """Await a database operation that runs in a thread, `what` it is, for at most `wait_s`.

    A database that stops answering without closing its connections (a frozen server or
    host, a network path that drops packets) leaves a driver blocked in a read that no
    timeout of its own ends: the call would wait for its gRPC deadline, and without one,
    for as long as the freeze lasts. Past `wait_s` it answers UNAVAILABLE
    (DATABASE_UNAVAILABLE, which clients retry) instead. The thread is not stopped (no
    thread can be): it finishes when the database answers or the connection drops, and an
    operation still queued for a thread is dropped."""
    try:
        return await asyncio.wait_for(operation, wait_s)
    except TimeoutError:
        raise db_wait_exceeded(what, wait_s) from None


async def db_thread(
    wait_s: float, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any
) -> T:
    """`fn(*args, **kwargs)`, a blocking database operation (`what` it is), run in a thread
    and waited for at most `wait_s` (bounded_db_wait)."""
    return await bounded_db_wait(asyncio.to_thread(fn, *args, **kwargs), wait_s, what)


def db_wait_exceeded(what: str, wait_s: float) -> Unavailable:
    """The Unavailable of a database operation (`what`) that did not answer within `wait_s`
    (logged)."""
    logger.warning("database did not answer %s within %gs", what, wait_s)
    return Unavailable(
        f"database unavailable: it did not answer {what} within {wait_s:g}s (TOOLMESH_DB_WAIT_S)",
        reason="DATABASE_UNAVAILABLE",
    )


def unavailable(error: BaseException) -> Unavailable:
    """The Unavailable (DATABASE_UNAVAILABLE) for a database that cannot serve, saying why in
    the driver's own words (its first line)."""
    return Unavailable(
        f"database unavailable: {first_line(error, type(error).__name__)}",
        reason="DATABASE_UNAVAILABLE",
    )


# PostgreSQL's undefined table / column; SQLite says it in words.
_SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})
_SQLITE_SCHEMA_MISSING = ("no such table", "no such column")


def _schema_missing(error: BaseException | None) -> bool:
    """Whether a driver error says a table or column this release uses does not exist."""
    if error is None:
        return False
    if getattr(error, "sqlstate", None) in _SCHEMA_SQLSTATES:
        return True
    return str(error).startswith(_SQLITE_SCHEMA_MISSING)


def first_line(exc: BaseException, default: str = "") -> str:
    """The first line of a database error's message (the driver's, under SQLAlchemy's
    wrapper), or `default` when it has none."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else default
