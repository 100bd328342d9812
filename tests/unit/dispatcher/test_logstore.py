"""The call log's write path, on SQLite and PostgreSQL: rows written on the driver's cursor
with precompiled statements are the rows SQLAlchemy writes; big event payloads go to the blob
table; a failing write leaves no partial rows and the log keeps serving. On a SQLite file the
commits run on the event loop: a lock held by another writer sends them to the writer thread
(nothing lost, the loop never waits), and the writer thread keeps the WAL checkpointed."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, Table, TextClause, bindparam, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.guardrails import LoopState
from services.dispatcher.logstore import (
    BLOB_THRESHOLD,
    SATURATED_LAG_S,
    CallRecord,
    ComingWrites,
    EventRecord,
    SqlCallLog,
)
from services.dispatcher.statestore import LoopStateWrite, SqlGuardrailStore
from shared.config import Settings
from shared.db.engine import make_engine, session_factory, upgrade
from shared.db.inline import LoopConnection
from shared.db.models import ConversationEventRow, ToolExecutionLogRow
from shared.db.prepared import Prepared
from shared.errors import ToolmeshError
from tests.support.call_records import call_record

_LOG: Table = ToolExecutionLogRow.__table__  # type: ignore[assignment]


@pytest.fixture
def log(sessions: sessionmaker[Session]) -> Iterator[SqlCallLog]:
    call_log = SqlCallLog(sessions)
    yield call_log
    call_log.close()


def record(tool_use_id: str, **kw: Any) -> CallRecord:
    fields: dict[str, Any] = {
        "tool_name": "query",
        "input_data": {"sql": "SELECT 1", "nested": [1, 2.5, None, {"ü": "日本"}]},
        "execution_ms": 1.25,
        "events": [EventRecord("tool_call", {"input": {"sql": "SELECT 1"}}, tool_use_id)],
    }
    fields.update(kw)
    return call_record(tool_use_id, **fields)


def migrated_sqlite(tmp_path: Path, name: str) -> Engine:
    """A migrated SQLite file database `name`.db in `tmp_path` (the loop's commits need a
    file)."""
    url = f"sqlite:///{tmp_path}/{name}.db"
    upgrade(url)
    return make_engine(url)


def log_rows(engine: Engine, **where: str) -> list[dict[str, Any]]:
    stmt = select(_LOG).order_by(_LOG.c.id)
    for column, value in where.items():
        stmt = stmt.where(_LOG.c[column] == value)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def test_a_prepared_insert_stores_what_sqlalchemy_stores(engine: Engine) -> None:
    values = {
        "tool_name": "query",
        "tenant_id": "t1",
        "user_id": "",
        "conversation_id": "c1",
        "tool_use_id": "",
        "args_hash": "",
        "input_data": {"a": [1, {"b": None}], "ü": "日本", "big": 2**53},
        "output_summary": "x" * 600,
        "success": False,
        "error": None,
        "execution_ms": 0.125,
        "trace_id": "",
        "created_at": datetime(2026, 12, 3, 12, 30, 1, 123456, tzinfo=UTC),
        "model": "claude-sonnet-4-5",
    }
    with engine.begin() as conn:
        conn.execute(insert(_LOG), [{**values, "tool_use_id": "by-sqlalchemy"}])
    prepared = Prepared(insert(_LOG), engine.dialect, list(values))
    with engine.connect() as conn:
        dbapi_conn = conn.connection.driver_connection
        assert dbapi_conn is not None
        cursor = dbapi_conn.cursor()
        prepared.execute_many(cursor, [{**values, "tool_use_id": "by-prepared"}])
        dbapi_conn.commit()
        cursor.close()
    ours, theirs = (log_rows(engine, tool_use_id=t)[0] for t in ("by-prepared", "by-sqlalchemy"))
    for row in (ours, theirs):
        del row["id"], row["tool_use_id"]
    assert ours == theirs
    assert ours["input_data"] == values["input_data"] and ours["success"] is False


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 12, 3, 12, 30, 1, 123456, tzinfo=UTC),
        datetime(2026, 12, 3, 12, 30, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        datetime(1, 1, 1),
        datetime(9999, 12, 31, 23, 59, 59, 999999),
        date(2026, 2, 28),
    ],
)
def test_a_prepared_timestamp_is_stored_as_sqlalchemy_stores_it(engine: Engine, when: Any) -> None:
    """The same text in the column, byte for byte, whatever the value (the fast path takes a
    datetime, a date goes through SQLAlchemy's own processor)."""
    column_type = _LOG.c.created_at.type
    statement = text("SELECT :at").bindparams(bindparam("at", type_=column_type))
    ours = Prepared(statement, engine.dialect, many=False).parameters({"at": when})
    theirs = column_type.dialect_impl(engine.dialect).bind_processor(engine.dialect)
    expected = theirs(when) if theirs is not None else when
    assert (ours[0] if isinstance(ours, tuple) else ours["at"]) == expected


def test_a_statement_left_to_python_defaults_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="created_at"):
        Prepared(insert(_LOG), engine.dialect, ["tool_name", "tenant_id", "success"])


async def test_the_log_writes_every_row_of_a_call_and_big_payloads_as_blobs(
    log: SqlCallLog, engine: Engine
) -> None:
    big = "é" * (BLOB_THRESHOLD // 2 + 10)  # under the threshold in characters, over in bytes
    await asyncio.gather(
        *(log.write(record(f"toolu_{i}")) for i in range(20)),
        log.write(record("toolu_big", events=[EventRecord("tool_result", {"text": big})])),
    )
    rows = log_rows(engine, conversation_id="c1")
    assert len(rows) == 21
    assert rows[0]["input_data"]["nested"][3] == {"ü": "日本"}
    assert log.page_events(tenant_id="t1", conversation_id="c1", event_type="", limit=100).entries
    with engine.connect() as conn:
        big_row = conn.execute(
            select(ConversationEventRow).where(ConversationEventRow.tool_use_id == "")
        ).one()
    assert big_row.data is None and big_row.blob_id is not None
    (event,) = log.page_events(
        tenant_id="t1", conversation_id="c1", event_type="tool_result", limit=10
    ).entries
    assert big in event.data_json


class BrokenWrite:
    """A state write whose statement fails in the call's transaction."""

    statement: ClassVar[TextClause] = text("INSERT INTO no_such_table (x) VALUES (:x)")

    def params(self) -> dict[str, Any]:
        return {"x": 1}

    def row_key(self) -> tuple[Any, ...]:
        return (1,)


async def test_a_failing_write_leaves_no_rows_and_the_log_keeps_serving(
    log: SqlCallLog, engine: Engine
) -> None:
    with pytest.raises(ToolmeshError):
        await log.write(record("toolu_broken", state_writes=[BrokenWrite()]))
    assert log_rows(engine, tool_use_id="toolu_broken") == []
    page = log.page_events(tenant_id="t1", conversation_id="c1", event_type="", limit=10)
    assert page.entries == []
    await log.write(record("toolu_after"))
    assert [r["tool_use_id"] for r in log_rows(engine)] == ["toolu_after"]


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Iterator[tuple[Engine, SqlCallLog]]:
    """A call log on a SQLite file (the commits-on-the-loop path)."""
    engine = migrated_sqlite(tmp_path, "toolmesh")
    call_log = SqlCallLog(session_factory(engine))
    yield engine, call_log
    call_log.close()
    engine.dispose()


async def test_a_lock_held_by_another_writer_never_blocks_the_loop_and_loses_nothing(
    sqlite_file: tuple[Engine, SqlCallLog],
) -> None:
    engine, log = sqlite_file
    assert engine.url.database
    path = engine.url.database
    await log.write(record("toolu_first"))  # the loop's own connection is open
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick = asyncio.create_task(ticker())
    writes = asyncio.gather(*(log.write(record(f"toolu_{i}")) for i in range(10)))
    await asyncio.sleep(0.5)
    assert not writes.done()  # waiting for the lock, in the writer thread...
    assert ticks >= 5  # ...while the loop keeps running
    other.execute("COMMIT")
    other.close()
    await asyncio.wait_for(writes, 10)
    tick.cancel()
    assert len(log_rows(engine)) == 11
    await log.write(record("toolu_last"))  # and back on the loop
    assert len(log_rows(engine)) == 12


async def wal_size_after(tmp_path: Path, name: str, checkpoint_every: int, calls: int) -> int:
    engine = migrated_sqlite(tmp_path, name)
    call_log = SqlCallLog(session_factory(engine), checkpoint_every=checkpoint_every)
    try:
        for i in range(calls):
            await call_log.write(record(f"toolu_{i}"))
            if i % checkpoint_every == 0:
                await asyncio.sleep(0.01)  # let the writer thread's checkpoint run
        wal = tmp_path / f"{name}.db-wal"
        return (await asyncio.to_thread(wal.stat)).st_size  # (closing removes it)
    finally:
        await asyncio.to_thread(call_log.close)
        engine.dispose()


async def test_the_writer_thread_checkpoints_the_wal_of_commits_made_on_the_loop(
    tmp_path: Path,
) -> None:
    checkpointed = await wal_size_after(tmp_path, "checkpointed", 10, 300)
    never = await wal_size_after(tmp_path, "never", 10**9, 300)
    assert checkpointed * 4 < never, (checkpointed, never)


async def test_the_log_and_the_guardrail_store_can_share_the_loops_connection(
    tmp_path: Path,
) -> None:
    engine = migrated_sqlite(tmp_path, "shared")
    loop_db = LoopConnection.for_engine(engine)
    assert loop_db is not None
    log = SqlCallLog(session_factory(engine), loop_db=loop_db)
    store = SqlGuardrailStore(engine, loop_db=loop_db)
    try:
        writes = [LoopStateWrite("t1", "c1", LoopState(1, "h1", 1))]
        await log.write(record("toolu_1", state_writes=writes))
        now = store.snapshot_now("t1", "c1", [], [])
        assert now is not None and now.loop == LoopState(1, "h1", 1)
        assert now == store.snapshot("t1", "c1", [], [])
    finally:
        await asyncio.to_thread(log.close)
        assert loop_db._conn is not None  # the log does not close what it was lent
        loop_db.close()
        engine.dispose()
    assert LoopConnection.for_engine(make_engine("sqlite://")) is None  # in memory: threads


async def test_the_wal_stays_bounded_under_steady_load(tmp_path: Path) -> None:
    """Calls logged without a pause: commits land while each passive checkpoint runs, so it
    never copies the whole WAL, and SQLite restarts the WAL only after a checkpoint that did.
    The writer thread must restart it, or the WAL grows for as long as the load lasts (it did:
    150 MB in 15 s in the mesh)."""
    engine = migrated_sqlite(tmp_path, "steady")
    call_log = SqlCallLog(session_factory(engine), checkpoint_every=10)
    wal = tmp_path / "steady.db-wal"

    async def worker(w: int) -> None:
        for i in range(250):
            await call_log.write(record(f"toolu_{w}_{i}"))
            await asyncio.sleep(0.001)  # as a call waits for its tool between log writes

    try:
        await asyncio.gather(*(worker(w) for w in range(4)))
        size = (await asyncio.to_thread(wal.stat)).st_size
        commits = call_log._inline_commits
    finally:
        await asyncio.to_thread(call_log.close)
        engine.dispose()
    frame = 4096 + 24  # a page and its frame header
    # The WAL's high-water mark: a few checkpoint intervals' commits of a few pages each, when
    # it is restarted; never restarted, it holds the pages of every commit (~6 a commit here).
    assert commits >= 200, commits
    assert size < 60 * 10 * frame, (size, commits)


async def test_group_commit_waits_for_coming_writes_only_while_the_loop_is_saturated(
    tmp_path: Path,
) -> None:
    engine = migrated_sqlite(tmp_path, "grouped")
    call_log = SqlCallLog(session_factory(engine), checkpoint_every=10**9)
    now = [0.0]
    coming = ComingWrites(clock=lambda: now[0])
    call_log.group_commits(coming, 0.5)  # long, so that no wait passes unnoticed
    loop = asyncio.get_running_loop()
    try:
        # An idle loop: another call still to come, but the commit does not wait for it.
        other = coming.begin()
        await asyncio.wait_for(call_log.write(record("idle")), 0.25)
        assert call_log._inline_commits == 1

        # Saturated (the loop's measured lag far above the threshold): the commit waits for
        # the coming call's write, and both go in one transaction as soon as it arrives.
        call_log._loop_lag_s = 1.0
        first = asyncio.ensure_future(call_log.write(record("first")))
        await asyncio.sleep(0.05)
        assert not first.done()
        coming.end(other)
        began = loop.time()
        await asyncio.wait_for(call_log.write(record("last")), 0.25)
        await first
        assert loop.time() - began < 0.25  # the last one came: no waiting out the delay
        assert call_log._inline_commits == 2

        # A coming call that never writes holds a commit for the delay at most.
        call_log._loop_lag_s = 1.0
        stuck = coming.begin()
        began = loop.time()
        await asyncio.wait_for(call_log.write(record("bounded")), 10)
        assert 0.45 <= loop.time() - began < 5
        assert call_log._inline_commits == 3

        # A call that started long ago (a slow tool) is not waited for.
        now[0] += 60
        call_log._loop_lag_s = 1.0
        await asyncio.wait_for(call_log.write(record("not held")), 0.25)
        coming.end(stuck)
        assert call_log._inline_commits == 4
        assert len(log_rows(engine)) == 5
    finally:
        await asyncio.to_thread(call_log.close)
        engine.dispose()


async def test_the_loop_lag_is_measured_from_the_writes(tmp_path: Path) -> None:
    engine = migrated_sqlite(tmp_path, "lag")
    call_log = SqlCallLog(session_factory(engine))
    call_log.group_commits(ComingWrites(), 0.002)
    try:
        call_log._loop_lag_s = 0.01
        for i in range(100):  # an idle loop: each probe runs at once
            await call_log.write(record(f"toolu_{i}"))
        assert call_log._loop_lag_s < SATURATED_LAG_S
    finally:
        await asyncio.to_thread(call_log.close)
        engine.dispose()


def test_the_group_commit_delay_is_read_and_checked() -> None:
    assert Settings.from_env({}).log_group_delay_ms == 2.0
    assert Settings.from_env({"TOOLMESH_LOG_GROUP_DELAY_MS": "0"}).log_group_delay_ms == 0.0
    for bad in ("-1", "101", "nan", "soon"):
        with pytest.raises(ValueError, match="TOOLMESH_LOG_GROUP_DELAY_MS"):
            Settings.from_env({"TOOLMESH_LOG_GROUP_DELAY_MS": bad})


def test_coming_writes_tell_recent_calls_from_old_ones() -> None:
    now = [100.0]
    coming = ComingWrites(clock=lambda: now[0])
    assert not coming.any_recent(1.0)
    old = coming.begin()
    now[0] += 5
    assert not coming.any_recent(1.0)  # only a call that started 5 s ago: a slow tool
    new = coming.begin()
    assert coming.any_recent(1.0)
    coming.end(new)
    coming.end(new)  # ending twice is harmless
    assert not coming.any_recent(1.0)
    assert coming.any_recent(10.0)
    coming.end(old)
    assert not coming.any_recent(10.0)


def _without_time(row: Any) -> Any:
    if isinstance(row, dict):
        return {k: v for k, v in row.items() if k != "now"}
    return tuple(v for v in row if not isinstance(v, str) or not v.startswith("20"))


class _Recording:
    """A DB-API cursor that records what is executed (and answers a RETURNING with an id)."""

    def __init__(self) -> None:
        self.executed: list[tuple[str, list[Any]]] = []

    def execute(self, sql: str, params: Any) -> _Recording:
        self.executed.append((sql, [params]))
        return self

    def executemany(self, sql: str, rows: list[Any]) -> None:
        self.executed.append((sql, list(rows)))

    def fetchone(self) -> tuple[int]:
        return (1,)


def test_a_group_commit_updates_state_rows_in_one_order_whatever_the_calls_order(
    engine: Engine,
) -> None:
    """Two replicas' group commits upserted the same observation rows in opposite orders
    (each in its calls' order) and PostgreSQL broke the deadlock by failing one commit: the
    calls of that group were answered UNAVAILABLE though their tools had run."""
    from services.dispatcher.logstore import _insert_records
    from services.dispatcher.statestore import ObservationWrite
    from shared.db.prepared import PreparedCache

    def upserts(users: list[str]) -> list[tuple[str, list[Any]]]:
        records = [
            record(f"toolu_{u}", state_writes=[ObservationWrite("t1", u, 7, "query")])
            for u in users
        ]
        records[0].state_writes.append(LoopStateWrite("t1", "c1", LoopState(1, "h", 1)))
        cursor = _Recording()
        _insert_records(cursor, PreparedCache(engine.dialect), records)
        # What identifies each row: its parameters but the time of the write.
        return [
            (sql, [_without_time(row) for row in rows])
            for sql, rows in cursor.executed
            if "ON CONFLICT" in sql
        ]

    one, other = upserts(["u2", "u0", "u1"]), upserts(["u1", "u2", "u0"])
    assert [sql for sql, _ in one] == [sql for sql, _ in other]
    assert one == other  # the same statements, the same rows, in the same order


async def test_a_commit_the_database_aborts_to_break_a_deadlock_is_run_again(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """A deadlock or serialization failure aborts the whole transaction, so it can run again;
    answering UNAVAILABLE lost the log of calls whose tools had run."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no deadlock detection: one writer at a time")
    with engine.begin() as conn:
        conn.execute(text("CREATE SEQUENCE IF NOT EXISTS deadlock_once"))
        conn.execute(
            text(
                "CREATE OR REPLACE FUNCTION deadlock_once() RETURNS int AS $$ BEGIN "
                "IF nextval('deadlock_once') = 1 THEN "
                "RAISE EXCEPTION 'deadlock (test)' USING ERRCODE = '40P01'; END IF; "
                "RETURN 1; END $$ LANGUAGE plpgsql"
            )
        )

    class DeadlockOnce:
        statement: ClassVar[TextClause] = text("SELECT deadlock_once()")

        def params(self) -> dict[str, Any]:
            return {}

        def row_key(self) -> tuple[Any, ...]:
            return ()

    call_log = SqlCallLog(sessions)
    try:
        await call_log.write(record("toolu_retried", state_writes=[DeadlockOnce()]))
    finally:
        call_log.close()
    assert len(log_rows(engine, tool_use_id="toolu_retried")) == 1  # once, not twice
