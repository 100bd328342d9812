"""The event loop's own SQLite connection.

With SQLite in WAL mode and synchronous=NORMAL, a short read or a small commit costs tens of
microseconds, less than handing the work to a thread and back (a thread hop, the GIL changing
hands and a wake-up of the loop: about 0.3-0.5 ms of latency here). So the per-call reads and
writes of the dispatcher run on the loop, on a connection that never waits: when it would
have to (another writer holds the lock), the caller falls back to its thread and the busy
timeout. Only for SQLite files on the standard driver; PostgreSQL always uses threads.

The connection is opened again when its file was deleted, replaced or changed between read-only
and writable since it was opened (shared.db.engine.SqliteFileIdentity), checked before every
write and now and then before a read: a connection kept for the life of the process must not
go on writing a file nobody else will ever read.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from shared.db.engine import WAL_SIZE_LIMIT, SqliteFileIdentity

logger = logging.getLogger(__name__)

# A read on the loop's connection checks that the file is still the one it opened at most this
# often (a write, every time).
READ_CHECK_S = 0.1


def sqlite_file(engine: Engine) -> str | None:
    """The path of the engine's SQLite file database on the standard driver, else None."""
    url = engine.url
    if engine.dialect.name != "sqlite" or engine.dialect.driver != "pysqlite":
        return None
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:") or url.query:
        return None
    return database


def open_nonblocking(path: str) -> sqlite3.Connection:
    """A connection for the event loop's thread: autocommit mode (a writer says BEGIN
    IMMEDIATE itself), no busy wait, and no automatic checkpoint (a checkpoint syncs files:
    whoever writes through this connection checkpoints from a thread, see
    services.dispatcher.logstore)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    except BaseException:
        conn.close()
        raise
    return conn


class LoopConnection:
    """The event loop's connection to a SQLite file, opened on first use. Whatever reads and
    writes on the loop should share one: SQLite drops a connection's page cache whenever
    another connection commits, so a reader beside a writer re-reads its pages on every call
    (measured: the guardrail snapshot read 0.15-0.2 ms on its own connection, ~0.03 ms on the
    call log's)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._opened: SqliteFileIdentity | None = None  # the file it was opened on
        self._checked_at = float("-inf")

    @classmethod
    def for_engine(cls, engine: Engine) -> LoopConnection | None:
        """One for the engine's SQLite file; None for any other database."""
        path = sqlite_file(engine)
        return None if path is None else cls(path)

    def get(self) -> sqlite3.Connection:
        """The open connection for a read: opened on first use, and again when its file
        changed (checked at most every READ_CHECK_S: a stat and an access check cost a few
        microseconds, more than the read itself saves)."""
        return self._connection(check=time.monotonic() - self._checked_at >= READ_CHECK_S)

    def _connection(self, *, check: bool) -> sqlite3.Connection:
        conn = self._conn
        if conn is not None:
            if not check:
                return conn
            self._checked_at = time.monotonic()
            opened = self._opened
            change = None if opened is None else opened.changed(self.path)
            if change is None:
                return conn
            logger.warning(
                "SQLite database %s changed since it was opened (%s): reopening", self.path, change
            )
            self.close()
        conn = self._conn = open_nonblocking(self.path)
        opened = self._opened = SqliteFileIdentity.of(self.path)
        self._checked_at = time.monotonic()
        if opened is not None:
            opened.apply(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """A write transaction that never waits (BEGIN IMMEDIATE with no busy timeout: a
        held lock raises sqlite3.OperationalError at once), committed when the block ends and
        rolled back if it raises. A write checks the file every time: it must not commit to a
        file that was replaced or deleted, nor while the file is read-only."""
        conn = self._connection(check=True)
        cursor = conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
                cursor.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        finally:
            cursor.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._opened = None
