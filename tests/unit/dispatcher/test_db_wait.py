"""A database that stops answering (a frozen server or host: its connections stay open, nothing
comes back) ends a dispatched call with UNAVAILABLE after TOOLMESH_DB_WAIT_S, never holds it
until its deadline; and once the database answers again, the next call succeeds and what was
waiting is committed (shared.db.engine.bounded_db_wait)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.core import Dispatcher
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared.config import Settings
from shared.db.engine import bounded_db_wait
from shared.db.models import ToolExecutionLogRow
from shared.errors import Unavailable
from tests.support.call_records import call_record
from tests.support.waiting import wait_for
from tests.unit.dispatcher.test_core import CTX, InProcessRegistry, kind, use

# Long enough for the call that follows a wait to answer in time on a loaded machine (as in
# tests/unit/db/test_db_wait_services.py, where 0.3 s was once missed under the parallel suite).
WAIT_S = 1.0


class Gate:
    """Closed, it holds every thread that reaches it until opened (a database that does not
    answer); `held` counts the threads it ever held."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.held = 0

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def pass_(self) -> None:
        if not self._open.is_set():
            self.held += 1
            self._open.wait(30)


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.open()  # never leave a thread held


class FrozenStore(SqlGuardrailStore):
    """The guardrail store whose snapshot reads wait at the gate (read in a thread, as on
    PostgreSQL, not on the event loop as a SQLite file allows)."""

    def __init__(self, engine: Engine, gate: Gate) -> None:
        super().__init__(engine)
        self._gate = gate

    def snapshot_now(self, *args: Any) -> Any:
        return None

    def snapshot(self, *args: Any) -> Any:
        self._gate.pass_()
        return super().snapshot(*args)


def log_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ToolExecutionLogRow)).scalar_one())


async def test_a_snapshot_the_database_never_answers_is_unavailable_after_the_wait(
    engine: Engine, sessions: sessionmaker[Session], gate: Gate
) -> None:
    log = SqlCallLog(sessions, wait_s=WAIT_S)
    core = Dispatcher(InProcessRegistry(), log, FrozenStore(engine, gate), db_wait_s=WAIT_S)
    try:
        assert kind((await core.dispatch(use("before", echo=1), CTX)).result) == "ok"
        gate.close()
        started = time.monotonic()
        with pytest.raises(Unavailable) as refused:
            await core.dispatch(use("frozen", echo=2), CTX)
        assert time.monotonic() - started < 10
        assert refused.value.reason == "DATABASE_UNAVAILABLE"
        assert f"did not answer a snapshot query within {WAIT_S:g}s" in refused.value.message
        assert "TOOLMESH_DB_WAIT_S" in refused.value.message
        assert gate.held >= 1
        gate.open()  # the database answers again: the next call runs
        assert kind((await core.dispatch(use("after", echo=3), CTX)).result) == "ok"
    finally:
        gate.open()
        await core.close()
        # The held read ends before the engine goes (with its connection back in the pool).
        await asyncio.to_thread(core._store_pool.shutdown, True)
        await asyncio.to_thread(log.close)


async def test_a_commit_the_database_never_answers_is_unavailable_then_lands(
    engine: Engine, sessions: sessionmaker[Session], gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread's commit waits at the gate: the write answers UNAVAILABLE after the
    wait, the log probes the database before the next tool runs, and the record held back is
    committed once the database answers (nothing lost, nothing twice)."""
    log = SqlCallLog(sessions, wait_s=WAIT_S)
    commit, commit_inline = log._commit, log._commit_inline

    def frozen_commit(records: Any) -> Any:
        gate.pass_()
        return commit(records)

    def busy_inline(records: Any) -> None:  # a SQLite file commits on the loop: hand it over
        if gate.closed:
            raise sqlite3.OperationalError("database is locked")
        commit_inline(records)

    monkeypatch.setattr(log, "_commit", frozen_commit)
    monkeypatch.setattr(log, "_commit_inline", busy_inline)
    try:
        await log.write(call_record("first"))
        assert log_rows(engine) == 1
        gate.close()
        started = time.monotonic()
        with pytest.raises(Unavailable, match="did not answer the call log's commit"):
            await log.write(call_record("held"))
        assert time.monotonic() - started < 10
        assert not log._healthy  # the next call's tool waits for a probe
        gate.open()
        await log.ensure_available()
        wait_for(lambda: log_rows(engine) == 2, 10, "the held record to be committed")
        await log.write(call_record("next"))
        assert log_rows(engine) == 3
    finally:
        gate.open()
        await asyncio.to_thread(log.close)


async def test_an_operation_still_queued_when_the_wait_ends_never_runs(gate: Gate) -> None:
    ran: list[str] = []
    pool = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    try:
        gate.close()
        stuck = loop.run_in_executor(pool, gate.pass_)  # holds the only thread
        queued = loop.run_in_executor(pool, ran.append, "queued")
        with pytest.raises(Unavailable, match=rf"did not answer a test query within {WAIT_S:g}s"):
            await bounded_db_wait(queued, WAIT_S, "a test query")
        gate.open()
        await stuck
        await asyncio.to_thread(pool.shutdown, wait=True)
        assert ran == []
    finally:
        gate.open()
        pool.shutdown(wait=False)


def test_the_wait_is_a_setting_between_a_tenth_of_a_second_and_an_hour() -> None:
    assert Settings.from_env({}).db_wait_s == 15.0
    assert Settings.from_env({"TOOLMESH_DB_WAIT_S": "2.5"}).db_wait_s == 2.5
    for bad in ("0", "0.05", "3601", "nan", "-1", "soon"):
        with pytest.raises(ValueError, match="TOOLMESH_DB_WAIT_S"):
            Settings.from_env({"TOOLMESH_DB_WAIT_S": bad})
