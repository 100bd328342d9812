"""Durable execution logging: tool_execution_log rows, full conversation_events and the
guardrail state updates of each call, written with group commit — every call awaits the commit
of the transaction that holds its rows, and one transaction holds all of a call's rows, so a
failure leaves no partial rows."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar, cast

from sqlalchemy import Engine, Executable, Insert, Table, insert, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from shared.config import DEFAULT_DB_WAIT_S
from shared.convert import dumps
from shared.db.engine import (
    BUSY_TIMEOUT_MS,
    database_error,
    db_thread,
    db_wait_exceeded,
    first_line,
    translate_db_errors,
)
from shared.db.inline import LoopConnection
from shared.db.models import (
    ConversationEventBlobRow,
    ConversationEventRow,
    ToolExecutionLogRow,
    utcnow,
)
from shared.db.prepared import PreparedCache
from shared.errors import ToolmeshError, Unavailable

logger = logging.getLogger(__name__)
R = TypeVar("R")


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


E = TypeVar("E", bound=_Identified)

BLOB_THRESHOLD = 32 * 1024
SUMMARY_CHARS = 500
MAX_BATCH = 256
# Listing: an entry's input is shown up to this many characters (the tool_call event keeps it
# whole); rows are read from the database this many at a time; an entry's size beyond its
# payloads, for a page's byte budget.
LISTED_INPUT_CHARS = 64 * 1024
_READ_BATCH = 16
_ENTRY_OVERHEAD = 256
# Commits on the event loop leave checkpointing to the writer thread, every this many commits.
CHECKPOINT_EVERY = 200
# Group commit (SqlCallLog.group_commits): a commit waits for the writes of calls that started
# within this many delays, only while the event loop is saturated — the mean delay of a
# callback scheduled when a call's record arrives is at least SATURATED_LAG_S (measured in the
# mesh: ~10 µs at one or two calls in flight, ~40 µs at four, ~240 µs at 64) — and never for
# more than GROUP_MAX records.
GROUP_HORIZON_DELAYS = 10
SATURATED_LAG_S = 50e-6
GROUP_MAX = 64
_LAG_WEIGHT = 0.1  # of each new sample in the loop's mean lag
# How long a checkpoint that resets the WAL waits for readers and writers (then it gives up
# until the next round).
RESTART_WAIT_MS = 50


@dataclass
class EventRecord:
    """One conversation_events row to write (built only by the effects chokepoint's recorder,
    services.dispatcher.effects.CallEventBuffer). `at` becomes created_at (the commit time when
    unset); `blob`, when given, is stored in conversation_event_blobs in place of `data`."""

    event_type: str
    data: dict[str, Any]
    tool_use_id: str = ""
    at: datetime | None = None
    blob: bytes | None = None


class StateWrite(Protocol):
    """A guardrail state update (loop guard, failed approach, observation) applied in the same
    transaction as the call's log rows: one statement and its parameters, so the writes of a
    group commit run as one executemany per statement. `row_key` names the row it updates:
    a group commit updates rows in the order of their statements' text and their keys, the
    same order in every transaction, so two replicas' commits never wait for each other's rows
    in opposite orders (a deadlock PostgreSQL would break by failing one of them)."""

    @property
    def statement(self) -> Executable: ...

    def params(self) -> dict[str, Any]: ...

    def row_key(self) -> tuple[Any, ...]: ...


@dataclass
class CallRecord:
    """Everything one dispatched call logs: its tool_execution_log row, its events and the
    guardrail state it updates."""

    tool_name: str
    tenant_id: str
    user_id: str
    conversation_id: str
    tool_use_id: str
    args_hash: str
    input_data: Any
    output_summary: str
    success: bool
    error: str | None
    execution_ms: float
    trace_id: str
    events: list[EventRecord] = field(default_factory=list)
    state_writes: list[StateWrite] = field(default_factory=list)
    model: str = ""  # the conversation's model, as the call's context named it
    # The serialized DispatchToolCallResponse a retry of the call is answered with (a call the
    # client named by tool_use id, in a conversation); None otherwise.
    response: bytes | None = None
    # False for a record of events alone (a retry answered from the log: no tool ran, so no
    # tool_execution_log row).
    log_row: bool = True


@dataclass(frozen=True)
class StoredAnswer:
    """A logged call's response, as a retry of it is answered."""

    response: bytes
    created_at: datetime | None


class ComingWrites:
    """Calls that will write the call log soon: the dispatcher marks each call from the start
    of its run until it hands its record to the log (see SqlCallLog.group_commits)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started: dict[int, float] = {}
        self._tokens = itertools.count(1)

    def begin(self) -> int:
        token = next(self._tokens)
        self._started[token] = self._clock()
        return token

    def end(self, token: int) -> None:
        self._started.pop(token, None)

    def any_recent(self, horizon_s: float) -> bool:
        """Whether a call still to write started less than `horizon_s` ago (an older one is a
        slow tool, not worth waiting for). Newest first, so this is usually one look even with
        a whole batch in flight."""
        if not self._started:
            return False
        since = self._clock() - horizon_s
        return any(started > since for started in reversed(self._started.values()))


@dataclass(frozen=True)
class LogEntry:
    id: int
    tool_name: str
    tenant_id: str
    input_json: str  # the input as JSON text, whole (a listing cuts it)
    output_summary: str
    success: bool
    error: str | None
    execution_ms: float
    created_at: datetime | None
    conversation_id: str
    user_id: str
    tool_use_id: str
    args_hash: str
    trace_id: str
    model: str = ""


@dataclass(frozen=True)
class EventEntry:
    id: int
    event_type: str
    data_json: str
    created_at: datetime | None
    tool_use_id: str
    data_bytes: int = 0  # of the whole payload, in UTF-8
    truncated: bool = False  # data_json is only the payload's start (see page_events)


@dataclass(frozen=True)
class Page(Generic[E]):
    """One page of a listing; `next_id` is the cursor of the next page, 0 when none follows."""

    entries: list[E]
    next_id: int


class CallLog(Protocol):
    async def ensure_available(self) -> None:
        """Raise Unavailable when the log cannot be written (checked before a tool runs, so a
        tool is not executed when its call could not be logged)."""
        ...

    async def write(self, record: CallRecord) -> None: ...
    def page_log(
        self,
        *,
        tool_name: str,
        tenant_id: str,
        conversation_id: str,
        limit: int,
        before_id: int = 0,
        max_bytes: int | None = None,
        model: str = "",
    ) -> Page[LogEntry]: ...
    def page_events(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        event_type: str,
        limit: int,
        after_id: int = 0,
        max_bytes: int | None = None,
    ) -> Page[EventEntry]: ...
    def event_data(self, *, tenant_id: str, conversation_id: str, event_id: int) -> str | None: ...
    def stored_answer(
        self, *, tenant_id: str, conversation_id: str, row_id: int
    ) -> StoredAnswer | None:
        """The response logged with row `row_id` of this tenant's conversation, if any."""
        ...


def summarize(content: str) -> str:
    return content[:SUMMARY_CHARS]


class SqlCallLog:
    """CallLog over SQLAlchemy with group commit.

    On a SQLite file database the rows are committed on the event loop's own thread: every
    write of one loop iteration goes into one transaction, flushed at the next iteration,
    with no thread hand-off (WAL with synchronous=NORMAL makes a commit a write to the OS,
    tens of microseconds). That connection never waits for a lock: when another writer holds
    the database, the batch goes to the writer thread, which waits (busy timeout) and reports
    any failure. The writer thread also checkpoints the WAL, so the loop never runs a
    checkpoint's fsync. PostgreSQL, and SQLite in memory, always use the writer thread."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        loop_db: LoopConnection | None = None,
        checkpoint_every: int = CHECKPOINT_EVERY,
        wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        """`loop_db`: the event loop's SQLite connection, shared with the loop's readers (see
        shared.db.inline.LoopConnection); by default the log opens its own. `wait_s`: how
        long a write (or a probe) waits for the database before it answers UNAVAILABLE; a
        record not committed by then is still committed once the database answers."""
        self._sessions = sessions
        self._wait_s = wait_s
        self._checkpoint_every = checkpoint_every
        engine = sessions.kw.get("bind")
        if not isinstance(engine, Engine):
            raise TypeError("SqlCallLog needs a sessionmaker bound to an Engine")
        self._engine = engine
        self._prepared = PreparedCache(engine.dialect)
        # False until a write or probe succeeds, and after any failed write: the next call
        # probes the database before its tool runs.
        self._healthy = False
        self._closed = False
        self._queue: queue.SimpleQueue[
            tuple[CallRecord, asyncio.Future[None], asyncio.AbstractEventLoop] | str | None
        ] = queue.SimpleQueue()
        self._owns_loop_db = loop_db is None
        self._loop_db = LoopConnection.for_engine(engine) if loop_db is None else loop_db
        self._inline_loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[CallRecord, asyncio.Future[None]]] = []
        self._flush: asyncio.Handle | None = None  # the scheduled flush of _pending
        self._flush_soon = False  # ...at the next loop iteration, not after a delay
        self._coming: ComingWrites | None = None
        self._group_delay_s = 0.0
        self._loop_lag_s = 0.0  # mean delay of a callback scheduled when a record arrives
        self._inline_commits = 0
        self._thread = threading.Thread(target=self._run, name="call-log-writer", daemon=True)
        self._thread.start()

    async def ensure_available(self) -> None:
        if not self._healthy:
            await db_thread(self._wait_s, "a probe of the call log", self._probe)

    def _probe(self) -> None:
        """Whether the log can be written: a read on PostgreSQL (a server that answers one
        takes writes); on SQLite a write, since a full disk or a read-only file still answer
        reads — and every call would run its tool only to fail to log it. The write rewrites
        the database header's user_version (which toolmesh does not use) with its own value."""
        with translate_db_errors(), self._engine.connect() as conn:
            if self._engine.dialect.name != "sqlite":
                conn.execute(text("SELECT 1"))
            else:  # a PRAGMA outside a transaction commits by itself
                version = int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
                conn.exec_driver_sql(f"PRAGMA user_version = {version}")
        self._healthy = True

    async def write(self, record: CallRecord) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._loop_db is not None and self._inline_loop in (None, loop):
            self._inline_loop = loop
            self._pending.append((record, future))
            if self._coming is not None:
                loop.call_soon(self._measure_lag, time.perf_counter())
            self._schedule_flush(loop)
        else:
            self._to_writer(record, future, loop)
        await asyncio.shield(future)

    def _to_writer(
        self, record: CallRecord, future: asyncio.Future[None], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Queue a record for the writer thread. Its writer waits `wait_s` at most: then it
        is answered UNAVAILABLE (a database that stopped answering), and the record is still
        committed when the database answers. (A commit on the loop never waits: it needs no
        such bound, and spares every call its timer.)"""
        timer = loop.call_later(self._wait_s, self._expire, future)
        future.add_done_callback(lambda _: timer.cancel())
        self._queue.put((record, future, loop))

    def _expire(self, future: asyncio.Future[None]) -> None:
        if future.done():
            return
        self._healthy = False  # the next call probes the database before its tool runs
        future.set_exception(db_wait_exceeded("the call log's commit", self._wait_s))
        future.exception()  # seen: whoever waits gets it through its shield, if anyone still does

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=10)
        if self._loop_db is not None and self._owns_loop_db:
            self._loop_db.close()

    # --- commits on the event loop (SQLite file databases) ------------------------------------

    def group_commits(self, coming: ComingWrites, delay_s: float) -> None:
        """Group commit while the event loop is saturated.

        A commit's fixed cost (the transaction, and the WAL frames of every table and index it
        touches) was most of a call's write at 64 calls in flight, with one call's rows to a
        commit. Once the loop is saturated (SATURATED_LAG_S), a commit waits up to `delay_s`
        for the writes of calls that started within GROUP_HORIZON_DELAYS × `delay_s` (from
        `coming`), and commits as soon as the last of them has written or GROUP_MAX records
        wait. Otherwise it commits at the next loop iteration, as without grouping: a caller on
        an idle loop never waits (waiting for a sibling call's write at two calls in flight
        cost 17% of throughput). `delay_s` 0 turns it off."""
        self._coming = coming if delay_s > 0 else None
        self._group_delay_s = delay_s

    def _measure_lag(self, scheduled: float) -> None:
        self._loop_lag_s += _LAG_WEIGHT * (time.perf_counter() - scheduled - self._loop_lag_s)

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        coming = self._coming
        wait = (
            coming is not None
            and self._loop_lag_s >= SATURATED_LAG_S
            and len(self._pending) < GROUP_MAX
            and coming.any_recent(self._group_delay_s * GROUP_HORIZON_DELAYS)
        )
        flush = self._flush
        if flush is not None:
            if wait or self._flush_soon:
                return  # already due
            flush.cancel()  # nothing left worth waiting for
        if wait:
            self._flush = loop.call_later(self._group_delay_s, self._flush_inline)
            self._flush_soon = False
        else:
            self._flush = loop.call_soon(self._flush_inline)
            self._flush_soon = True

    def _flush_inline(self) -> None:
        self._flush = None  # this run is the scheduled flush (only one is ever scheduled)
        batch, self._pending = self._pending, []
        if not batch:
            return
        if self._closed:
            _settle([f for _, f in batch], Unavailable("the call log is closed"))
            return
        records = [record for record, _ in batch]
        try:
            self._commit_inline(records)
        except Exception as exc:  # noqa: BLE001 - the writer thread retries it and reports it
            # Busy (another writer holds the lock) or failing: the writer thread retries with
            # the busy timeout and reports what fails. Nothing of this attempt was committed.
            logger.debug("inline call-log commit deferred to the writer thread: %s", exc)
            loop = asyncio.get_running_loop()
            for record, future in batch:
                self._to_writer(record, future, loop)
            return
        self._healthy = True
        _settle([f for _, f in batch], None)
        self._inline_commits += 1
        if self._inline_commits % self._checkpoint_every == 0:
            self._queue.put(_CHECKPOINT)

    def _commit_inline(self, records: Sequence[CallRecord]) -> None:
        assert self._loop_db is not None
        with self._loop_db.transaction() as cursor:
            _insert_records(cursor, self._prepared, records)

    # --- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, str):
                self._checkpoint()
                continue
            batch = [item]
            stop = checkpoint = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if isinstance(nxt, str):
                    checkpoint = True  # after this batch's commit
                    continue
                batch.append(nxt)
            error = self._commit([record for record, _, _ in batch])
            # One wake-up per event loop per batch, not one per call.
            by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            for _, future, loop in batch:
                by_loop.setdefault(loop, []).append(future)
            for loop, futures in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, futures, error)
                except RuntimeError:  # that loop is closed: nobody waits any more
                    pass
            if checkpoint:
                self._checkpoint()
            if stop:
                return

    def _commit(self, records: Sequence[CallRecord]) -> BaseException | None:
        reconnected = False
        for attempt in itertools.count(1):
            failed = self._commit_once(
                records, retry=attempt < COMMIT_ATTEMPTS, reconnect=not reconnected
            )
            if failed is _RECONNECT:
                reconnected = True
                continue  # at once, on another connection
            if failed is not _RETRY:
                return failed
            time.sleep(random.uniform(0.001, 0.01) * attempt)  # the writer thread: not the loop
        raise AssertionError("unreachable")

    def _commit_once(self, records: Sequence[CallRecord], *, retry: bool, reconnect: bool) -> Any:
        """One transaction of `records`: None when committed, the error to answer with, or
        _RETRY when the database aborted it to break a deadlock or a serialization conflict
        with another replica's (rolled back whole, so it can run again) and `retry` allows, or
        _RECONNECT when the server dropped the connection before the commit was sent (the
        server rolls back what it had: nothing can have been committed, so it runs again on a
        new connection: a backend terminated, or restarted since the connection was checked
        out) and `reconnect` allows. A connection lost during the commit itself is not run
        again: it may have committed."""
        try:
            with translate_db_errors(), self._engine.connect() as conn:
                dbapi = self._engine.dialect.loaded_dbapi
                dbapi_conn = conn.connection.driver_connection
                assert dbapi_conn is not None
                committing = False
                try:
                    cursor = dbapi_conn.cursor()
                    try:
                        _insert_records(cursor, self._prepared, records)
                    finally:
                        with contextlib.suppress(dbapi.Error):
                            cursor.close()
                    committing = True
                    dbapi_conn.commit()
                except dbapi.Error as exc:
                    with contextlib.suppress(dbapi.Error):
                        dbapi_conn.rollback()
                    if retry and getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES:
                        logger.info("call log commit retried: %s", first_line(exc, "conflict"))
                        return _RETRY
                    error = database_error(exc)
                    if error is None:
                        raise
                    lost = bool(getattr(dbapi_conn, "broken", False))  # psycopg's flag
                    conn.invalidate()
                    if lost and reconnect and not committing:
                        logger.info(
                            "call log commit runs again on a new connection: %s",
                            first_line(exc, "connection lost"),
                        )
                        return _RECONNECT
                    raise error from exc
            self._healthy = True
        except ToolmeshError as exc:
            self._healthy = False
            return exc
        except Exception as exc:
            logger.exception("writing the call log failed")
            self._healthy = False
            return Unavailable(f"call log write failed: {type(exc).__name__}: {exc}")
        return None

    def _checkpoint(self) -> None:
        """Checkpoint the WAL of the commits made on the event loop, and keep it from growing.

        A passive checkpoint copies committed pages into the database file without blocking
        anyone. But SQLite starts the WAL again from its beginning only when a write begins
        after every frame was copied and while no reader is using the WAL, and under steady
        load in the mesh that moment never came: the passive checkpoints copied every frame,
        yet the WAL grew for as long as the load lasted (measured: 150 MB in 15 s at 800
        calls/s, every commit appending to a file the kernel must extend and zero, 8% of the
        dispatcher's CPU in pwrite). So a RESTART checkpoint follows: it copies what came
        since, waits briefly (at most RESTART_WAIT_MS) for readers to leave the WAL, and the
        next commit then reuses the WAL from its start. It holds writers off while it runs:
        the loop's commits meanwhile come to this thread and wait their turn."""
        try:
            with self._engine.connect() as conn:
                frames = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()[1]
                if frames > 0:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
                    try:
                        conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)").one()
                    finally:
                        conn.exec_driver_sql(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except SQLAlchemyError as exc:  # the next checkpoint tries again
            logger.warning("WAL checkpoint failed: %s", exc)

    def page_log(
        self,
        *,
        tool_name: str,
        tenant_id: str,
        conversation_id: str,
        limit: int,
        before_id: int = 0,
        max_bytes: int | None = None,
        model: str = "",
    ) -> Page[LogEntry]:
        """Rows newest first, older than `before_id` when given: at most `limit`, and with
        `max_bytes` only as many as fit in it (their inputs counted up to
        LISTED_INPUT_CHARS), at least one. Rows are read a few at a time, never all at once."""
        stmt = select(ToolExecutionLogRow)
        if tool_name:
            stmt = stmt.where(ToolExecutionLogRow.tool_name == tool_name)
        if tenant_id:
            stmt = stmt.where(ToolExecutionLogRow.tenant_id == tenant_id)
        if conversation_id:
            stmt = stmt.where(ToolExecutionLogRow.conversation_id == conversation_id)
        if model:
            stmt = stmt.where(ToolExecutionLogRow.model == model)
        if before_id > 0:
            stmt = stmt.where(ToolExecutionLogRow.id < before_id)
        stmt = stmt.order_by(ToolExecutionLogRow.id.desc()).limit(limit + 1)

        def entry(r: ToolExecutionLogRow) -> tuple[LogEntry, int]:
            text = dumps(r.input_data)
            size = _ENTRY_OVERHEAD + len(r.output_summary) + len(r.error or "")
            size += min(len(text), LISTED_INPUT_CHARS)
            return (
                LogEntry(
                    id=r.id,
                    tool_name=r.tool_name,
                    tenant_id=r.tenant_id,
                    input_json=text,
                    output_summary=r.output_summary,
                    success=r.success,
                    error=r.error,
                    execution_ms=r.execution_ms,
                    created_at=r.created_at,
                    conversation_id=r.conversation_id,
                    user_id=r.user_id,
                    tool_use_id=r.tool_use_id,
                    args_hash=r.args_hash,
                    trace_id=r.trace_id,
                    model=r.model,
                ),
                size,
            )

        with translate_db_errors(), self._sessions() as s:
            rows = s.scalars(stmt.execution_options(yield_per=_READ_BATCH))
            return _page(rows, entry, limit, max_bytes)

    def stored_answer(
        self, *, tenant_id: str, conversation_id: str, row_id: int
    ) -> StoredAnswer | None:
        stmt = select(_LOG.c.response, _LOG.c.created_at).where(
            _LOG.c.id == row_id,
            _LOG.c.tenant_id == tenant_id,
            _LOG.c.conversation_id == conversation_id,
        )
        with translate_db_errors(), self._engine.connect() as conn:
            row = conn.execute(stmt).first()
        if row is None or row.response is None:
            return None
        return StoredAnswer(bytes(row.response), row.created_at)

    def page_events(
        self,
        *,
        tenant_id: str,
        conversation_id: str,
        event_type: str,
        limit: int,
        after_id: int = 0,
        max_bytes: int | None = None,
    ) -> Page[EventEntry]:
        """Events oldest first, after `after_id` when given: at most `limit`, and with
        `max_bytes` only as many as fit in it, at least one (payloads are never cut). Rows
        are read a few at a time, never all at once."""
        stmt = select(ConversationEventRow, ConversationEventBlobRow.data).outerjoin(
            ConversationEventBlobRow, ConversationEventRow.blob_id == ConversationEventBlobRow.id
        )
        stmt = stmt.where(ConversationEventRow.conversation_id == conversation_id)
        if tenant_id:
            stmt = stmt.where(ConversationEventRow.tenant_id == tenant_id)
        if event_type:
            stmt = stmt.where(ConversationEventRow.event_type == event_type)
        if after_id > 0:
            stmt = stmt.where(ConversationEventRow.id > after_id)
        stmt = stmt.order_by(ConversationEventRow.id).limit(limit + 1)

        def entry(found: Any) -> tuple[EventEntry, int]:
            row, blob = found
            data = row.data if row.data is not None else (blob or b"").decode("utf-8")
            size = len(data.encode("utf-8"))
            event = EventEntry(
                row.id, row.event_type, data, row.created_at, row.tool_use_id, data_bytes=size
            )
            return event, _ENTRY_OVERHEAD + size

        with translate_db_errors(), self._sessions() as s:
            rows = s.execute(stmt.execution_options(yield_per=_READ_BATCH))
            page = _page(rows, entry, limit, max_bytes)
        if max_bytes is not None and len(page.entries) == 1:
            only = page.entries[0]
            budget = max_bytes - _ENTRY_OVERHEAD
            if only.data_bytes > budget:  # it came alone: only its start fits a page
                # Its first `budget` characters hold at least `budget` bytes: the cut encodes
                # those, not the whole payload (it was measured already).
                head = only.data_json[:budget].encode("utf-8")[:budget]
                start = head.decode("utf-8", "ignore")
                page = Page([replace(only, data_json=start, truncated=True)], page.next_id)
        return page

    def event_data(self, *, tenant_id: str, conversation_id: str, event_id: int) -> str | None:
        """One event's whole payload, None when there is no such event in that conversation
        (of that tenant, when given)."""
        stmt = (
            select(ConversationEventRow.data, ConversationEventBlobRow.data)
            .outerjoin(
                ConversationEventBlobRow,
                ConversationEventRow.blob_id == ConversationEventBlobRow.id,
            )
            .where(
                ConversationEventRow.id == event_id,
                ConversationEventRow.conversation_id == conversation_id,
            )
        )
        if tenant_id:
            stmt = stmt.where(ConversationEventRow.tenant_id == tenant_id)
        with translate_db_errors(), self._sessions() as s:
            found = s.execute(stmt).first()
        if found is None:
            return None
        text, blob = found
        return text if text is not None else (blob or b"").decode("utf-8")


def _page(
    rows: Iterable[R],
    entry: Callable[[R], tuple[E, int]],
    limit: int,
    max_bytes: int | None,
) -> Page[E]:
    """A listing's page from its query's rows (the query asks for limit + 1): entries built one
    row at a time (`entry`: the entry and its size in bytes), `limit` of them, or fewer once
    `max_bytes` would be passed but at least one; next_id is the last entry's id when more
    follow."""
    out: list[E] = []
    total = 0
    for row in rows:
        if len(out) == limit:
            return Page(out, out[-1].id)
        built, size = entry(row)
        if max_bytes is not None and out and total + size > max_bytes:
            return Page(out, out[-1].id)
        total += size
        out.append(built)
    return Page(out, 0)


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


_LOG = cast(Table, ToolExecutionLogRow.__table__)
_EVENTS = cast(Table, ConversationEventRow.__table__)
_BLOBS = cast(Table, ConversationEventBlobRow.__table__)


def _event_row(
    insert_blob: Callable[[bytes], int],
    tenant_id: str,
    conversation_id: str,
    event: EventRecord,
    now: datetime,
) -> dict[str, Any]:
    """The conversation_events row of an event (its blob inserted first, by `insert_blob`,
    when it needs one): the one encoding of an event, shared by the call log and replay."""
    encoded = event.blob
    payload: str | None = None
    if encoded is None:
        payload = dumps(event.data)
        if len(payload) * 4 > BLOB_THRESHOLD:  # else surely under it: no encoding needed
            raw = payload.encode("utf-8")
            if len(raw) > BLOB_THRESHOLD:
                encoded = raw
    blob_id = insert_blob(encoded) if encoded is not None else None
    return {
        "tenant_id": tenant_id,
        "conversation_id": conversation_id,
        "event_type": event.event_type,
        "tool_use_id": event.tool_use_id,
        "data": None if blob_id is not None else payload,
        "blob_id": blob_id,
        "created_at": event.at or now,
    }


class SqlEventRecorder:
    """An EventRecorder that writes each event of one conversation at once, in its own
    transaction, with the call log's encoding: what replay applies recorded effects to."""

    def __init__(self, engine: Engine, tenant_id: str, conversation_id: str) -> None:
        self._engine = engine
        self._tenant_id = tenant_id
        self._conversation_id = conversation_id

    def record(
        self,
        event_type: str,
        data: Any,
        *,
        tool_use_id: str,
        at: datetime,
        blob: bytes | None,
    ) -> None:
        event = EventRecord(event_type, dict(data), tool_use_id, at, blob)

        with translate_db_errors(), self._engine.begin() as conn:

            def insert_blob(encoded: bytes) -> int:
                return int(
                    conn.execute(
                        insert(_BLOBS).returning(_BLOBS.c.id),
                        {"data": encoded, "size_bytes": len(encoded)},
                    ).scalar_one()
                )

            row = _event_row(insert_blob, self._tenant_id, self._conversation_id, event, utcnow())
            conn.execute(insert(_EVENTS), [row])


_LOG_KEYS = (
    "tool_name",
    "tenant_id",
    "user_id",
    "conversation_id",
    "tool_use_id",
    "args_hash",
    "input_data",
    "output_summary",
    "success",
    "error",
    "execution_ms",
    "trace_id",
    "created_at",
    "model",
    "response",
)
_EVENT_KEYS = (
    "tenant_id",
    "conversation_id",
    "event_type",
    "tool_use_id",
    "data",
    "blob_id",
    "created_at",
)
# A commit the database aborted to break a deadlock (40P01) or a serialization conflict
# (40001) with another transaction is run again, up to this many attempts in all.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
COMMIT_ATTEMPTS = 5
_RETRY = object()
_RECONNECT = object()

_INSERT_LOG = insert(_LOG)
_INSERT_EVENTS = insert(_EVENTS)
_INSERT_BLOB = insert(_BLOBS).returning(_BLOBS.c.id)


def _insert_records(cursor: Any, prepared: PreparedCache, records: Sequence[CallRecord]) -> None:
    """Insert a batch on the driver's cursor (one executemany per statement), with statements
    compiled once (shared.db.prepared): SQLAlchemy's per-statement execution machinery was
    most of the cost of a call's write."""
    now = utcnow()
    blob_insert = prepared.get(_INSERT_BLOB, ("data", "size_bytes"), many=False)

    def insert_blob(encoded: bytes) -> int:
        row = blob_insert.execute(cursor, {"data": encoded, "size_bytes": len(encoded)}).fetchone()
        return int(row[0])

    log_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    for record in records:
        if record.log_row:
            log_rows.append(
                {
                    "tool_name": record.tool_name,
                    "tenant_id": record.tenant_id,
                    "user_id": record.user_id,
                    "conversation_id": record.conversation_id,
                    "tool_use_id": record.tool_use_id,
                    "args_hash": record.args_hash,
                    "input_data": record.input_data,
                    "output_summary": record.output_summary,
                    "success": record.success,
                    "error": record.error,
                    "execution_ms": record.execution_ms,
                    "trace_id": record.trace_id,
                    "created_at": now,
                    "model": record.model,
                    "response": record.response,
                }
            )
        for event in record.events:
            event_rows.append(
                _event_row(insert_blob, record.tenant_id, record.conversation_id, event, now)
            )
    if log_rows:
        prepared.get(_INSERT_LOG, _LOG_KEYS).execute_many(cursor, log_rows)
    if event_rows:
        prepared.get(_INSERT_EVENTS, _EVENT_KEYS).execute_many(cursor, event_rows)
    # One executemany per statement (and, for an insert, per set of columns), the rows in one
    # order for every transaction (StateWrite.row_key); a row written twice keeps its order.
    grouped: dict[tuple[int, tuple[str, ...] | None], list[tuple[Any, dict[str, Any]]]] = {}
    statements: dict[tuple[int, tuple[str, ...] | None], Executable] = {}
    for record in records:
        for write in record.state_writes:
            params = write.params()
            keys = tuple(sorted(params)) if isinstance(write.statement, Insert) else None
            key = (id(write.statement), keys)
            statements[key] = write.statement
            grouped.setdefault(key, []).append((write.row_key(), params))
    for key in sorted(grouped, key=lambda k: (_statement_text(statements[k]), k[1] or ())):
        rows = grouped[key]
        if len(rows) > 1:
            rows.sort(key=lambda row: row[0])
        prepared.get(statements[key], key[1]).execute_many(cursor, [p for _, p in rows])


# A state write's statement text, by the statement's id (statements are module constants; a
# SQLAlchemy clause's == builds an expression, so it cannot be a cache key itself).
_STATEMENT_TEXT: dict[int, str] = {}


def _statement_text(statement: Executable) -> str:
    text = _STATEMENT_TEXT.get(id(statement))
    if text is None:
        text = _STATEMENT_TEXT[id(statement)] = str(statement)
    return text


_CHECKPOINT = "checkpoint"
