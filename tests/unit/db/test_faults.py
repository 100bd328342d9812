"""Database faults below the services: a SQLite file deleted, replaced, made read-only, full or
not a database under open connections; PostgreSQL read-only, or a connection the server
terminates in the middle of a write. Pooled connections and the event loop's connection follow
the file at the path, writes are refused while the file is read-only and taken again after,
every such failure is UNAVAILABLE with its reason, and the call log neither reports a cleanup
error in place of the real one nor runs a tool it could not log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, TextClause, create_engine, event, text
from sqlalchemy.pool import QueuePool

from services.dispatcher.logstore import CallRecord, EventRecord, SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared.db.engine import make_engine, session_factory, translate_db_errors, upgrade
from shared.db.inline import LoopConnection
from shared.errors import Unavailable
from tests.conftest import fresh_database_url
from tests.support.call_records import call_record
from tests.support.readonly import read_only


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite database, copied for each test."""
    path = tmp_path_factory.mktemp("faults") / "migrated.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def db(tmp_path: Path, migrated: Path) -> Path:
    path = tmp_path / "toolmesh.db"
    shutil.copy(migrated, path)
    return path


def put_in_place(source: Path, db: Path) -> None:
    """A file renamed over the database, as a restore does, and the old file's -wal and -shm
    removed: SQLite finds a WAL by the database's path, and would apply the old file's frames
    to the new one."""
    staged = db.with_name("staged.tmp")
    shutil.copy(source, staged)
    os.replace(staged, db)
    for path in db.parent.glob(db.name + "-*"):
        path.unlink()


def count_seeds(engine: Engine) -> int:
    with translate_db_errors(), engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM seed_log")).scalar_one())


def add_seed(engine: Engine, key: str) -> None:
    with translate_db_errors(), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO seed_log (key, value, pinned, updated_at) "
                "VALUES (:k, 'v', :pinned, CURRENT_TIMESTAMP)"
            ),
            {"k": key, "pinned": True},
        )


def seeds_in(path: Path) -> set[str]:
    """The seed_log keys of the file at `path`, read afresh."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {r[0] for r in conn.execute("SELECT key FROM seed_log")}


# --- the file at the path -----------------------------------------------------------------------


def test_a_pooled_connection_follows_its_file_when_it_is_replaced(db: Path, migrated: Path) -> None:
    """Before, the pooled connection went on reading and writing the replaced file: the
    write below was answered and went where nobody would ever read it."""
    engine = make_engine(f"sqlite:///{db}")
    try:
        add_seed(engine, "before")
        assert count_seeds(engine) == 1
        put_in_place(migrated, db)  # a backup without that row
        assert count_seeds(engine) == 0
        add_seed(engine, "after")
        assert seeds_in(db) == {"after"}
    finally:
        engine.dispose()


def test_a_pooled_connection_whose_file_was_deleted_is_unavailable_not_served(db: Path) -> None:
    engine = make_engine(f"sqlite:///{db}")
    try:
        add_seed(engine, "before")
        for path in db.parent.glob(db.name + "*"):
            path.unlink()
        with pytest.raises(Unavailable) as raised:
            add_seed(engine, "after")  # before: answered, into the deleted file
        assert raised.value.reason == "SCHEMA_NOT_READY"
    finally:
        engine.dispose()


def test_the_loop_connection_follows_its_file_when_it_is_replaced(db: Path, migrated: Path) -> None:
    loop_db = LoopConnection(str(db))
    try:
        with loop_db.transaction() as cursor:
            cursor.execute("INSERT INTO seed_log VALUES ('before', 'v', 1, CURRENT_TIMESTAMP)")
        put_in_place(migrated, db)
        with loop_db.transaction() as cursor:
            cursor.execute("INSERT INTO seed_log VALUES ('after', 'v', 1, CURRENT_TIMESTAMP)")
        assert seeds_in(db) == {"after"}
    finally:
        loop_db.close()


def test_pooled_connections_refuse_writes_while_the_file_is_read_only_and_take_them_after(
    db: Path,
) -> None:
    """Before, the two connections opened before went on writing (into the WAL), the one
    opened meanwhile was read-only — and stayed so, refusing every write it served after."""
    engine = make_engine(f"sqlite:///{db}")
    try:
        held = [engine.connect() for _ in range(2)]  # two connections in the pool
        for conn in held:
            conn.close()
        with read_only(db):
            opened = [engine.connect() for _ in range(3)]  # the third opened read-only
            for i, conn in enumerate(opened):
                with pytest.raises(Exception) as raised, translate_db_errors(), conn.begin():
                    conn.execute(
                        text("INSERT INTO seed_log VALUES (:k, 'v', 1, CURRENT_TIMESTAMP)"),
                        {"k": f"ro{i}"},
                    )
                assert isinstance(raised.value, Unavailable), raised.value
                assert "readonly" in raised.value.message
                conn.close()
            assert count_seeds(engine) == 0  # reads go on
        for i in range(6):  # through every pooled connection
            add_seed(engine, f"rw{i}")
        assert seeds_in(db) == {f"rw{i}" for i in range(6)}
    finally:
        engine.dispose()


def test_the_loop_connection_refuses_writes_while_the_file_is_read_only(db: Path) -> None:
    loop_db = LoopConnection(str(db))
    try:
        loop_db.get()
        with (
            read_only(db),
            pytest.raises(sqlite3.OperationalError, match="readonly"),
            loop_db.transaction() as c,
        ):
            c.execute("INSERT INTO seed_log VALUES ('ro', 'v', 1, CURRENT_TIMESTAMP)")
        with loop_db.transaction() as cursor:
            cursor.execute("INSERT INTO seed_log VALUES ('rw', 'v', 1, CURRENT_TIMESTAMP)")
        assert seeds_in(db) == {"rw"}
    finally:
        loop_db.close()


def test_a_file_that_is_not_a_database_is_unavailable_not_an_internal_error(db: Path) -> None:
    """Before, SQLite's DatabaseError ("file is not a database") went through as it was: an
    INTERNAL answer with a traceback, and a background loop that only survives Unavailable
    (the surface's derivation, the sandbox's job workers) died of it."""
    engine = make_engine(f"sqlite:///{db}")
    try:
        count_seeds(engine)
        staged = db.with_name("garbage.tmp")
        staged.write_bytes(b"not a database\n" * 1024)
        os.replace(staged, db)
        for path in db.parent.glob(db.name + "-*"):
            path.unlink()
        with pytest.raises(Unavailable, match="not a database") as raised:
            count_seeds(engine)
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
    finally:
        engine.dispose()


# --- the call log -------------------------------------------------------------------------------


def record(tool_use_id: str, payload_bytes: int = 0) -> CallRecord:
    data = {"text": "x" * payload_bytes}
    return call_record(tool_use_id, events=[EventRecord("tool_result", data, tool_use_id)])


def test_a_call_log_write_on_a_full_database_says_so(db: Path) -> None:
    """Before: "call log write failed: ProgrammingError: Cannot operate on a closed database"
    (reason UNAVAILABLE), with the cleanup's traceback logged as an error: the connection was
    invalidated, then its cursor closed. SQLite's page limit stands in for a full disk."""
    engine = make_engine(f"sqlite:///{db}")
    pages = int(sqlite3.connect(db).execute("PRAGMA page_count").fetchone()[0])
    limit = f"PRAGMA max_page_count = {pages}"
    event.listen(engine, "connect", lambda conn, _record: conn.execute(limit))
    loop_db = LoopConnection(str(db))
    loop_db.get().execute(limit)
    log = SqlCallLog(session_factory(engine), loop_db=loop_db)
    try:
        with pytest.raises(Unavailable) as raised:
            asyncio.run(log.write(record("toolu_full", payload_bytes=200_000)))
        assert raised.value.reason == "DATABASE_UNAVAILABLE", raised.value.message
        assert "full" in raised.value.message
    finally:
        log.close()
        loop_db.close()
        engine.dispose()


def test_the_call_log_is_not_available_while_its_database_takes_no_writes(db: Path) -> None:
    """A failed write makes the next call probe the log before its tool runs. The probe was a
    read, which a read-only file (or a full disk) still answers: every call ran its tool, then
    failed to log it. It writes now, and lets calls through again once writes succeed."""
    engine = make_engine(f"sqlite:///{db}")
    log = SqlCallLog(session_factory(engine))
    try:

        async def scenario() -> None:
            await log.ensure_available()
            with read_only(db):
                with pytest.raises(Unavailable):
                    await log.write(record("toolu_ro"))
                with pytest.raises(Unavailable, match="readonly"):
                    await log.ensure_available()
            await log.ensure_available()
            await log.write(record("toolu_rw"))

        asyncio.run(scenario())
    finally:
        log.close()
        engine.dispose()


# --- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_database_url(request, "postgres", str(tmp_path))


@pytest.mark.postgres
def test_a_read_only_postgres_is_unavailable_not_an_internal_error(pg_url: str) -> None:
    """A standby after a failover, or default_transaction_read_only: psycopg raises an
    InternalError (SQLSTATE 25006), which went through as INTERNAL."""
    engine = create_engine(pg_url, connect_args={"options": "-c default_transaction_read_only=on"})
    try:
        with pytest.raises(Unavailable, match="read-only") as raised:
            add_seed(engine, "k")
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
    finally:
        engine.dispose()


@dataclass(frozen=True)
class TerminateOnce:
    """A state write that has the server terminate its own connection the first time it runs
    (inside the call log's transaction, before the commit), and does nothing after."""

    tripped: list[bool]

    statement: ClassVar[TextClause] = text(
        "SELECT CASE WHEN :kill THEN pg_terminate_backend(pg_backend_pid()) END"
    )

    def params(self) -> dict[str, Any]:
        kill = not self.tripped
        self.tripped.append(True)
        return {"kill": kill}

    def row_key(self) -> tuple[Any, ...]:
        return ()


@pytest.mark.postgres
def test_a_call_log_commit_whose_connection_the_server_terminated_runs_again(
    pg_url: str,
) -> None:
    """The connection was lost before the commit was sent, so nothing was committed: the
    batch runs again on a new connection and the call is logged once. Before, the call (whose
    tool had run) was answered UNAVAILABLE."""
    engine = make_engine(pg_url)
    log = SqlCallLog(session_factory(engine))
    tool_use_id = f"toolu_{uuid.uuid4().hex[:12]}"
    try:
        call = record(tool_use_id)
        call.state_writes.append(TerminateOnce([]))
        asyncio.run(log.write(call))
        with engine.connect() as conn:
            logged = conn.execute(
                text("SELECT count(*) FROM tool_execution_log WHERE tool_use_id = :u"),
                {"u": tool_use_id},
            ).scalar_one()
        assert logged == 1
    finally:
        log.close()
        engine.dispose()


@pytest.mark.postgres
def test_a_snapshot_read_ends_its_transaction_before_the_connection_goes_back(
    pg_url: str,
) -> None:
    """Left open, the pool's reset rolled it back on return, and when the server had gone
    meanwhile that failure was logged as an error with a traceback."""
    engine = create_engine(pg_url, poolclass=QueuePool, pool_reset_on_return=None)
    try:
        SqlGuardrailStore(engine).snapshot("t1", "c1", [("ping", "abc")], ["ping"])
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            assert driver.info.transaction_status.name == "IDLE"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_connections_find_a_vanished_server_within_seconds_not_hours(
    pg_url: str,
) -> None:
    """With the kernel's defaults a connection to a server whose host vanished (no RST) waited
    two hours (keepalive) or ~15 minutes (retransmissions) before failing, holding a handler
    thread and a pool connection. Every connection now carries keepalives and a TCP user
    timeout; the URL's own parameters win."""
    engine = make_engine(pg_url)
    tuned = make_engine(pg_url + "?keepalives_idle=60&tcp_user_timeout=0")
    try:
        with engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert {
            k: params.get(k) for k in ("keepalives", "keepalives_idle", "tcp_user_timeout")
        } == {
            "keepalives": "1",
            "keepalives_idle": "10",
            "tcp_user_timeout": "30000",
        }
        with tuned.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert params.get("keepalives_idle") == "60"
        assert params.get("tcp_user_timeout", "0") == "0"
        assert params.get("keepalives_count") == "3"
    finally:
        engine.dispose()
        tuned.dispose()
