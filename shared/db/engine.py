"""Database engines: SQLite (WAL) embedded by default, PostgreSQL via TOOLMESH_DATABASE_URL;
Alembic migrations; and the translation of driver failures into UNAVAILABLE."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import InterfaceError as SAInterfaceError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from shared.errors import FailedPrecondition, InvalidArgument, Unavailable

if TYPE_CHECKING:
    from alembic.config import Config

logger = logging.getLogger(__name__)

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


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
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
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args={"connect_timeout": 5}
    )


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
    except (OperationalError, ProgrammingError) as exc:
        if _schema_missing(exc):  # a database not migrated to this release (yet)
            logger.warning("database schema not ready: %s", exc.orig or exc)
            raise Unavailable(
                f"the database schema is not migrated to this release ({first_line(exc)}): run "
                "`toolmesh db upgrade`, or start the registry, which migrates on start",
                reason="SCHEMA_NOT_READY",
            ) from exc
        if isinstance(exc, ProgrammingError):
            raise
        logger.warning("database unavailable: %s", exc.orig or exc)
        raise Unavailable(
            f"database unavailable: {first_line(exc)}", reason="DATABASE_UNAVAILABLE"
        ) from exc
    except SAInterfaceError as exc:
        logger.warning("database unavailable: %s", exc.orig or exc)
        raise Unavailable(
            f"database unavailable: {first_line(exc)}", reason="DATABASE_UNAVAILABLE"
        ) from exc
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
        if exc.connection_invalidated:
            raise Unavailable(
                f"database connection lost: {first_line(exc)}", reason="DATABASE_UNAVAILABLE"
            ) from exc
        raise


# PostgreSQL's undefined table / column; SQLite says it in words.
_SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})
_SQLITE_SCHEMA_MISSING = ("no such table", "no such column")


def _schema_missing(exc: DBAPIError) -> bool:
    """Whether `exc` says a table or column this release uses does not exist."""
    if getattr(exc.orig, "sqlstate", None) in _SCHEMA_SQLSTATES:
        return True
    return str(exc.orig).startswith(_SQLITE_SCHEMA_MISSING)


def first_line(exc: BaseException, default: str = "") -> str:
    """The first line of a database error's message (the driver's, under SQLAlchemy's
    wrapper), or `default` when it has none."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else default
