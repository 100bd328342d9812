"""The event loop's own SQLite connection.

With SQLite in WAL mode and synchronous=NORMAL, a short read or a small commit costs tens of
microseconds, less than handing the work to a thread and back (a thread hop, the GIL changing
hands and a wake-up of the loop: about 0.3-0.5 ms of latency here). So the per-call reads and
writes of the dispatcher run on the loop, on a connection that never waits: when it would
have to (another writer holds the lock), the caller falls back to its thread and the busy
timeout. Only for SQLite files on the standard driver; PostgreSQL always uses threads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from shared.db.engine import WAL_SIZE_LIMIT


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

    @classmethod
    def for_engine(cls, engine: Engine) -> LoopConnection | None:
        """One for the engine's SQLite file; None for any other database."""
        path = sqlite_file(engine)
        return None if path is None else cls(path)

    def get(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_nonblocking(self.path)
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """A write transaction that never waits (BEGIN IMMEDIATE with no busy timeout: a
        held lock raises sqlite3.OperationalError at once), committed when the block ends and
        rolled back if it raises."""
        conn = self.get()
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
