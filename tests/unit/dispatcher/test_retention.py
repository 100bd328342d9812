"""Call log retention (services/dispatcher/retention.py) on SQLite and PostgreSQL: what is older
than the cutoff goes, oldest first, with the events' blobs; what is younger stays; a sweep
works in batches, can be stopped between them, and a dry run deletes nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, Table, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.logstore import BLOB_THRESHOLD, CallRecord, EventRecord, SqlCallLog
from services.dispatcher.retention import (
    LogRetention,
    PruneReport,
    RetentionSweeper,
    cutoff_for,
)
from shared.db.engine import make_engine, session_factory, upgrade
from shared.db.inline import LoopConnection
from shared.db.models import (
    ConversationDatasetRow,
    ConversationEventBlobRow,
    ConversationEventRow,
    ConversationStateRow,
    ExportCatalogRow,
    FailedApproachRow,
    GeneratedFileRow,
    ToolExecutionLogRow,
    UsageLogRow,
    WorkingSetEntryRow,
)
from shared.errors import Unavailable
from shared.telemetry.usage import SqlUsageLog
from tests.support.call_records import call_record
from tests.support.waiting import wait_for

_LOG: Table = ToolExecutionLogRow.__table__  # type: ignore[assignment]
_EVENTS: Table = ConversationEventRow.__table__  # type: ignore[assignment]
_BLOBS: Table = ConversationEventBlobRow.__table__  # type: ignore[assignment]

NOW = datetime.now(UTC)
BIG = "x" * (BLOB_THRESHOLD + 10)  # an event payload stored as a blob


@pytest.fixture
def log(sessions: sessionmaker[Session]) -> Iterator[SqlCallLog]:
    call_log = SqlCallLog(sessions)
    yield call_log
    call_log.close()


def record(tool_use_id: str, *, big: bool = False) -> CallRecord:
    events = [EventRecord("tool_call", {"input": {"n": tool_use_id}}, tool_use_id)]
    events.append(EventRecord("tool_result", {"content": BIG if big else "ok"}, tool_use_id))
    return call_record(tool_use_id, input_data={"n": tool_use_id}, events=events)


def write(log: SqlCallLog, *records: CallRecord) -> None:
    async def go() -> None:
        for r in records:  # one after the other: ids in this order
            await log.write(r)

    asyncio.run(go())


def backdate(engine: Engine, tool_use_id: str, days: float) -> None:
    """Stamp a call's log row and events `days` days ago."""
    when = NOW - timedelta(days=days)
    with engine.begin() as conn:
        conn.execute(update(_LOG).where(_LOG.c.tool_use_id == tool_use_id).values(created_at=when))
        conn.execute(
            update(_EVENTS).where(_EVENTS.c.tool_use_id == tool_use_id).values(created_at=when)
        )


def ids_left(engine: Engine) -> tuple[list[str], list[str], int]:
    """(log rows' tool_use_ids, events' tool_use_ids, blob count), oldest first."""
    with engine.connect() as conn:
        log_ids = [r[0] for r in conn.execute(select(_LOG.c.tool_use_id).order_by(_LOG.c.id))]
        events = [r[0] for r in conn.execute(select(_EVENTS.c.tool_use_id).order_by(_EVENTS.c.id))]
        blobs = conn.execute(select(func.count()).select_from(_BLOBS)).scalar_one()
    return log_ids, events, int(blobs)


def test_rows_older_than_the_cutoff_go_with_their_blobs_and_younger_ones_stay(
    log: SqlCallLog, engine: Engine
) -> None:
    write(log, record("old1", big=True), record("old2"), record("new1", big=True), record("new2"))
    backdate(engine, "old1", 40)
    backdate(engine, "old2", 31)
    report = LogRetention(engine).prune(cutoff_for(30))
    assert (report.log_rows, report.events, report.blobs, report.complete) == (2, 4, 1, True)
    assert ids_left(engine) == (["new1", "new2"], ["new1", "new1", "new2", "new2"], 1)
    # The remaining event's blob is the young call's, and still readable through its event.
    with engine.connect() as conn:
        blob_id = conn.execute(
            select(_EVENTS.c.blob_id).where(_EVENTS.c.blob_id.is_not(None))
        ).scalar_one()
        assert conn.execute(select(_BLOBS.c.size_bytes).where(_BLOBS.c.id == blob_id)).scalar_one()
    # Nothing more is old: a second sweep deletes nothing.
    assert LogRetention(engine).prune(cutoff_for(30)).total == 0


def test_a_dry_run_counts_and_deletes_nothing(log: SqlCallLog, engine: Engine) -> None:
    write(log, record("old", big=True), record("new"))
    backdate(engine, "old", 10)
    report = LogRetention(engine).prune(cutoff_for(5), dry_run=True)
    assert (report.log_rows, report.events, report.blobs) == (1, 2, 1)
    assert "would delete 1 tool_execution_log row(s), 2 conversation_events" in report.describe(
        dry_run=True
    )
    assert ids_left(engine) == (["old", "new"], ["old", "old", "new", "new"], 1)


def test_a_sweep_works_in_batches_and_can_be_stopped_between_them(
    log: SqlCallLog, engine: Engine
) -> None:
    names = [f"old{i}" for i in range(7)]
    write(log, *(record(n) for n in names), record("new"))
    for n in names:
        backdate(engine, n, 3)
    batches: list[int] = []

    def stop_after_two() -> bool:
        batches.append(1)
        return len(batches) > 2

    small = LogRetention(engine, batch_rows=3)
    first = small.prune(cutoff_for(1), stop=stop_after_two)
    assert not first.complete and first.log_rows == 6 and first.events == 0
    assert "stopped before the end" in first.describe()
    rest = small.prune(cutoff_for(1))
    assert rest.complete and (rest.log_rows, rest.events) == (1, 14)
    assert ids_left(engine) == (["new"], ["new", "new"], 0)


def test_a_row_stamped_out_of_order_goes_once_the_rows_before_it_are_old_too(
    log: SqlCallLog, engine: Engine
) -> None:
    """A sweep stops after the batch holding the first younger row (ids grow with time;
    conversation_events has no index on created_at): an older row in a later batch waits for a
    later sweep."""
    write(log, record("a"), record("b"), record("c"))
    backdate(engine, "a", 10)
    backdate(engine, "b", 2)  # younger than the cutoff, before an older row
    backdate(engine, "c", 10)
    one_at_a_time = LogRetention(engine, batch_rows=1)
    first = one_at_a_time.prune(cutoff_for(5))
    assert (first.log_rows, first.events) == (1, 2)
    assert ids_left(engine)[0] == ["b", "c"]
    later = one_at_a_time.prune(cutoff_for(1))
    assert (later.log_rows, later.events) == (2, 4)
    assert ids_left(engine) == ([], [], 0)


def test_an_empty_log_prunes_to_nothing(engine: Engine) -> None:
    report = LogRetention(engine).prune(cutoff_for(1))
    assert report == PruneReport(report.cutoff)


@pytest.mark.parametrize("days", [0, -1, float("nan")])
def test_a_retention_that_keeps_nothing_is_refused(engine: Engine, days: float) -> None:
    with pytest.raises(ValueError, match="keeps nothing"):
        cutoff_for(days)
    with pytest.raises(ValueError, match="keeps nothing"):
        RetentionSweeper(LogRetention(engine), days, 60)


@pytest.mark.parametrize("interval", [0, -5, float("nan")])
def test_a_sweep_interval_must_be_positive(engine: Engine, interval: float) -> None:
    with pytest.raises(ValueError, match="not positive"):
        RetentionSweeper(LogRetention(engine), 1, interval)


def test_the_sweeper_sweeps_at_start_then_every_interval_and_stops_on_close(
    log: SqlCallLog, engine: Engine
) -> None:
    write(log, record("old"), record("new"))
    backdate(engine, "old", 3)
    sweeper = RetentionSweeper(LogRetention(engine), 1, 0.05)
    sweeper.start()
    try:
        wait_for(lambda: ids_left(engine)[0] == ["new"], timeout=10)
        write(log, record("later"))
        backdate(engine, "later", 2)
        wait_for(lambda: ids_left(engine)[:2] == (["new"], ["new", "new"]), timeout=10)
        wait_for(lambda: sweeper.sweeps >= 2, timeout=10)
    finally:
        sweeper.close()
    assert not any(t.name == "log-retention" for t in threading.enumerate())


class _Failing:
    """A retention whose database is away for its first sweeps."""

    def __init__(self, inner: LogRetention, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def prune(self, cutoff: datetime, **kw: Any) -> PruneReport:
        if self.failures:
            self.failures -= 1
            raise Unavailable("database unavailable")
        return self.inner.prune(cutoff, **kw)


def test_a_failed_sweep_is_logged_and_the_next_interval_tries_again(
    log: SqlCallLog, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    write(log, record("old"))
    backdate(engine, "old", 3)
    sweeper = RetentionSweeper(_Failing(LogRetention(engine), 2), 1, 0.05)  # type: ignore[arg-type]
    assert sweeper.sweep_once() is None
    assert "retention sweep failed: database unavailable" in caplog.text
    sweeper.start()
    try:
        wait_for(lambda: ids_left(engine)[0] == [], timeout=10)
    finally:
        sweeper.close()


def test_sweeping_beside_the_loops_commits_loses_no_call(tmp_path: Path) -> None:
    """On a SQLite file, the dispatcher commits each call on its event loop without waiting
    for the lock (falling back to its writer thread when the lock is held): a sweeper deleting
    in a thread at the same time costs no write."""
    url = f"sqlite:///{tmp_path}/swept.db"
    upgrade(url)
    engine = make_engine(url)
    loop_db = LoopConnection.for_engine(engine)
    log = SqlCallLog(session_factory(engine), loop_db=loop_db)
    write(log, *(record(f"old{i}") for i in range(300)))
    with engine.begin() as conn:
        conn.execute(update(_LOG).values(created_at=NOW - timedelta(days=9)))
        conn.execute(update(_EVENTS).values(created_at=NOW - timedelta(days=9)))
    sweeper = RetentionSweeper(LogRetention(engine, batch_rows=7), 1, 0.001)
    sweeper.start()
    try:

        async def calls() -> None:
            await asyncio.gather(*(log.write(record(f"new{i}")) for i in range(300)))

        asyncio.run(calls())
        wait_for(lambda: [len(ids) for ids in ids_left(engine)[:2]] == [300, 600], timeout=20)
    finally:
        sweeper.close()
        log.close()
        assert loop_db is not None
        loop_db.close()
    log_ids, events, _ = ids_left(engine)
    assert sorted(log_ids) == sorted(f"new{i}" for i in range(300))
    assert len(events) == 600
    engine.dispose()


# --- idle conversations ---------------------------------------------------------------------

_STATE: Table = ConversationStateRow.__table__  # type: ignore[assignment]
_DATASETS: Table = ConversationDatasetRow.__table__  # type: ignore[assignment]
_WORKING: Table = WorkingSetEntryRow.__table__  # type: ignore[assignment]
_FAILED: Table = FailedApproachRow.__table__  # type: ignore[assignment]


def conversation(engine: Engine, tenant: str, name: str, idle_days: float, datasets: int) -> None:
    """A conversation whose last call was `idle_days` ago, with `datasets` datasets, a working
    set entry and a failed approach."""
    when = NOW - timedelta(days=idle_days)
    key = {"tenant_id": tenant, "conversation_id": name}
    with engine.begin() as conn:
        conn.execute(
            insert(_STATE),
            {**key, "call_seq": 3, "loop_hash": "", "loop_count": 0, "cancel_epoch": 0,
             "updated_at": when},
        )  # fmt: skip
        for i in range(datasets):
            conn.execute(
                insert(_DATASETS),
                {**key, "namespace_id": "", "name": f"d{i}", "arrow_ipc": b"x" * 1000, "rows": 1,
                 "columns": [], "source": "", "created_at": when, "updated_at": when},
            )  # fmt: skip
        conn.execute(
            insert(_WORKING), {**key, "namespace_id": "", "tool_name": "ping", "created_at": when}
        )
        conn.execute(
            insert(_FAILED),
            {**key, "tool_name": "ping", "identity_hash": "0" * 16, "reason": "r", "attempts": 1,
             "first_failed_at": when, "last_failed_at": when},
        )  # fmt: skip


def conversations_left(engine: Engine) -> dict[str, list[tuple[str, str]]]:
    with engine.connect() as conn:
        return {
            table.name: sorted(
                (r[0], r[1])
                for r in conn.execute(select(table.c.tenant_id, table.c.conversation_id))
            )
            for table in (_STATE, _DATASETS, _WORKING, _FAILED)
        }


def test_conversations_idle_since_the_cutoff_lose_their_state_and_datasets(engine: Engine) -> None:
    conversation(engine, "t1", "idle", 10, datasets=2)
    conversation(engine, "t2", "idle", 1, datasets=1)  # same name, another tenant, active
    conversation(engine, "t1", "active", 0, datasets=1)
    conversation(engine, "t1", "idle-too", 6, datasets=0)
    dry = LogRetention(engine).prune(cutoff_for(5), dry_run=True)
    assert (dry.conversations, dry.datasets) == (2, 2)
    assert "the state of 2 conversation(s) idle since then with their 2 dataset(s)" in (
        dry.describe(dry_run=True)
    )
    assert len(conversations_left(engine)["conversation_state"]) == 4
    report = LogRetention(engine, batch_rows=1).prune(cutoff_for(5))
    assert (report.conversations, report.datasets, report.complete) == (2, 2, True)
    left = conversations_left(engine)
    assert left["conversation_state"] == [("t1", "active"), ("t2", "idle")]
    assert left["conversation_datasets"] == [("t1", "active"), ("t2", "idle")]
    assert left["working_set_entries"] == [("t1", "active"), ("t2", "idle")]
    assert left["failed_approaches"] == [("t1", "active"), ("t2", "idle")]
    assert LogRetention(engine).prune(cutoff_for(5)).conversations == 0


def test_a_conversation_called_again_keeps_its_datasets(engine: Engine) -> None:
    """The dispatcher's next call of a conversation moves its last-call time: the sweep after it
    leaves the conversation alone."""
    conversation(engine, "t1", "c1", 10, datasets=1)  # record() logs to (t1, c1)
    with engine.begin() as conn:  # the state the dispatcher writes on the next call
        conn.execute(update(_STATE).values(updated_at=datetime.now(UTC)))
    assert LogRetention(engine).prune(cutoff_for(5)).conversations == 0
    assert conversations_left(engine)["conversation_datasets"] == [("t1", "c1")]


_USAGE: Table = UsageLogRow.__table__  # type: ignore[assignment]


def usage(engine: Engine, tenant: str, name: str, days: float, cost: float) -> None:
    """A usage_log row of conversation (tenant, name) (of none when `name` is ""), `days` old."""
    with engine.begin() as conn:
        conn.execute(
            insert(_USAGE),
            {"tenant_id": tenant, "conversation_id": name, "tool_name": "ask", "kind": "llm",
             "cost_usd": cost, "created_at": NOW - timedelta(days=days)},
        )  # fmt: skip


def test_old_usage_goes_except_a_live_conversations_which_its_budget_adds_up(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    conversation(engine, "t1", "live", 0, datasets=0)
    conversation(engine, "t1", "idle", 45, datasets=0)
    names = ("live", "idle", "", "no-state")
    for name in names:  # ids follow time, as they do when the rows are written
        usage(engine, "t1", name, 40, 1.0)
    usage(engine, "t2", "live", 40, 1.0)  # another tenant's conversation of that name: not live
    for name in names:
        usage(engine, "t1", name, 1, 0.25)
    spent = SqlUsageLog(sessions).conversation_spent
    assert spent("t1", "live") == 1.25

    dry = LogRetention(engine).prune(cutoff_for(30), dry_run=True)
    assert dry.usage_rows == 4
    assert "and 4 usage_log row(s) of conversations not called since" in dry.describe(dry_run=True)
    report = LogRetention(engine, batch_rows=2).prune(cutoff_for(30))
    assert (report.usage_rows, report.complete) == (4, True)
    with engine.connect() as conn:
        left = sorted(
            (r[0], r[1], r[2])
            for r in conn.execute(
                select(_USAGE.c.tenant_id, _USAGE.c.conversation_id, _USAGE.c.cost_usd)
            )
        )
    assert left == [
        ("t1", "", 0.25), ("t1", "idle", 0.25), ("t1", "live", 0.25), ("t1", "live", 1.0),
        ("t1", "no-state", 0.25),
    ]  # fmt: skip
    assert spent("t1", "live") == 1.25  # the live conversation's budget still counts it all
    assert LogRetention(engine).prune(cutoff_for(30)).usage_rows == 0


_FILES: Table = GeneratedFileRow.__table__  # type: ignore[assignment]
_CATALOG: Table = ExportCatalogRow.__table__  # type: ignore[assignment]


def export(engine: Engine, data_dir: Path, tenant: str, name: str, path: str) -> Path:
    """An export of conversation (tenant, name): its file (unless outside the data dir) and its
    generated_files and export_catalog rows."""
    file = data_dir / path
    if file.resolve().is_relative_to(data_dir):
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("data")
    file_id = f"{tenant}-{name}-{path}"
    with engine.begin() as conn:
        conn.execute(
            insert(_FILES),
            {"file_id": file_id, "tenant_id": tenant, "conversation_id": name,
             "filename": Path(path).name, "path": path, "created_at": NOW},
        )  # fmt: skip
        conn.execute(
            insert(_CATALOG),
            {"tenant_id": tenant, "conversation_id": name, "namespace_id": "",
             "name": Path(path).name, "file_id": file_id, "kind": "export", "created_at": NOW},
        )  # fmt: skip
    return file


def test_an_idle_conversations_exports_go_with_their_files_unless_shared(
    engine: Engine, tmp_path: Path
) -> None:
    data_dir = tmp_path.resolve()
    conversation(engine, "t1", "idle", 10, datasets=0)
    conversation(engine, "t1", "active", 0, datasets=0)
    own = export(engine, data_dir, "t1", "idle", "exports/a/report.csv")
    shared = export(engine, data_dir, "t1", "idle", "exports/shared/chart.png")
    export(engine, data_dir, "t1", "active", "exports/shared/chart.png")
    outside = data_dir / "toolmesh.db.keep"
    outside.write_text("not an export")
    export(engine, data_dir, "t1", "idle", "toolmesh.db.keep")  # a row naming a non-export

    kept = LogRetention(engine).prune(cutoff_for(5))  # no data dir: exports are kept
    assert (kept.conversations, kept.exports) == (1, 0)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(_FILES)).scalar_one() == 4
    assert own.exists() and shared.exists()

    conversation(engine, "t1", "idle", 10, datasets=0)  # idle again, now swept with its exports
    # A dry run counts what the sweep deletes: not the file the active conversation names.
    dry = LogRetention(engine, data_dir=data_dir).prune(cutoff_for(5), dry_run=True)
    assert (dry.conversations, dry.exports) == (1, 1)
    assert own.exists() and shared.exists()
    report = LogRetention(engine, data_dir=data_dir).prune(cutoff_for(5))
    assert (report.conversations, report.exports) == (1, 1)
    assert "and 1 export file(s)" in report.describe()
    assert not own.exists()
    assert shared.exists()  # the active conversation's export of the same file
    assert outside.exists()  # never anything outside the exports directory
    with engine.connect() as conn:
        left = sorted(
            (r[0], r[1]) for r in conn.execute(select(_FILES.c.conversation_id, _FILES.c.path))
        )
        catalog = [r[0] for r in conn.execute(select(_CATALOG.c.conversation_id))]
    assert left == [("active", "exports/shared/chart.png")]
    assert catalog == ["active"]


def test_two_replicas_sweeping_at_once_delete_each_row_once(
    log: SqlCallLog, engine: Engine
) -> None:
    """Replicas share the database: sweeping it together deletes everything old, nothing twice,
    and no sweep fails on the other's deletions."""
    names = [f"old{i}" for i in range(40)]
    write(log, *(record(n, big=i % 5 == 0) for i, n in enumerate(names)), record("new"))
    with engine.begin() as conn:
        old = NOW - timedelta(days=9)
        conn.execute(update(_LOG).where(_LOG.c.tool_use_id != "new").values(created_at=old))
        conn.execute(update(_EVENTS).where(_EVENTS.c.tool_use_id != "new").values(created_at=old))
    for i in range(20):
        conversation(engine, "t9", f"idle{i}", 10, datasets=1)
    reports: list[PruneReport] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            reports.append(LogRetention(engine, batch_rows=3).prune(cutoff_for(5)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sum(r.log_rows for r in reports) == 40
    assert sum(r.events for r in reports) == 80
    assert sum(r.blobs for r in reports) == 8
    assert sum(r.conversations for r in reports) == 20
    assert sum(r.datasets for r in reports) == 20
    assert ids_left(engine) == (["new"], ["new", "new"], 0)
    assert conversations_left(engine)["conversation_datasets"] == []
