"""Retention of the call log: the tool_execution_log rows and conversation_events (with their
blobs) older than a cutoff are deleted, oldest first; and the state of conversations idle since
before it (no call since: conversation_state.updated_at is its last call) with their datasets,
working sets, failed approaches and exports.

Both tables grow with every call (about 1.5 KB a call of `ping`, far more for calls with big
inputs or results) and nothing else ever deletes from them. With TOOLMESH_RETENTION_DAYS set,
each dispatcher sweeps them every TOOLMESH_RETENTION_INTERVAL_S (RetentionSweeper);
`toolmesh db prune --older-than DAYS` runs the same sweep once.

A sweep walks each table in primary-key order (ids grow with time; conversation_events has no
index on created_at, and adding one would cost every call's commit a page) in small
transactions, so a SQLite writer (the dispatcher's own call log) waits at most one batch for
the lock. It stops at the first row younger than the cutoff: a row stamped out of order (the
clocks of two replicas writing one PostgreSQL database differ) goes in a later sweep, once the
rows before it are old enough too. Idle conversations are found by a walk of conversation_state
(its ids follow creation, not activity, so the walk goes to the end), and each one's rows go in
the transaction that deletes its state row, only if that row is still idle then: a conversation
that takes a call during the sweep keeps everything. Every replica may sweep: deleting rows
another replica already deleted deletes nothing. Given the data dir, an idle conversation's
exports go too: their rows in that transaction, then their files under `exports/` that no
other conversation's export names.

usage_log (what each call and LLM call cost) goes by the same cutoff, except the rows of a
conversation still live (a state row updated since the cutoff): its whole history is what its
budget (TOOLMESH_CONVERSATION_BUDGET_USD) adds up, and a sweep must not give a long-running
conversation its money back. Rows of no conversation (a sandbox job's LLM calls) go by age."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import ColumnElement, Engine, Table, and_, delete, exists, func, or_, select

from services.dispatcher.effects import EXPORTS_DIR
from shared.db.engine import translate_db_errors
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
from shared.errors import ToolmeshError

logger = logging.getLogger(__name__)

# Rows per transaction: a SQLite writer waits for at most one batch's delete.
BATCH_ROWS = 500
_LOG = cast(Table, ToolExecutionLogRow.__table__)
_EVENTS = cast(Table, ConversationEventRow.__table__)
_BLOBS = cast(Table, ConversationEventBlobRow.__table__)
_STATE = cast(Table, ConversationStateRow.__table__)
_USAGE = cast(Table, UsageLogRow.__table__)
_DATASETS = cast(Table, ConversationDatasetRow.__table__)
# What a conversation keeps besides its state row, deleted with it (its datasets counted).
_FILES = cast(Table, GeneratedFileRow.__table__)
_CONVERSATION_TABLES = (
    _DATASETS,
    cast(Table, WorkingSetEntryRow.__table__),
    cast(Table, FailedApproachRow.__table__),
)
# A conversation's exports: their rows go with it when the sweep may delete their files too.
_EXPORT_TABLES = (cast(Table, ExportCatalogRow.__table__), _FILES)


@dataclass(frozen=True)
class PruneReport:
    """What one sweep deleted (or, in a dry run, would delete)."""

    cutoff: datetime
    log_rows: int = 0
    events: int = 0
    blobs: int = 0
    conversations: int = 0  # idle conversations whose state went
    datasets: int = 0  # of those conversations
    exports: int = 0  # export files of those conversations deleted
    usage_rows: int = 0  # usage_log rows of no conversation or of one not live
    complete: bool = True  # False when it was stopped before it was done

    @property
    def total(self) -> int:
        return self.log_rows + self.events + self.blobs + self.conversations + self.usage_rows

    def describe(self, *, dry_run: bool = False) -> str:
        verb = "would delete" if dry_run else "deleted"
        text = (
            f"{verb} {self.log_rows} tool_execution_log row(s), {self.events} "
            f"conversation_events and {self.blobs} event blob(s) from before "
            f"{self.cutoff.isoformat(timespec='seconds')}, and the state of "
            f"{self.conversations} conversation(s) idle since then with their "
            f"{self.datasets} dataset(s) and {self.exports} export file(s), and "
            f"{self.usage_rows} usage_log row(s) of conversations not called since"
        )
        return text if self.complete else text + " (stopped before the end)"


def cutoff_for(days: float, now: datetime | None = None) -> datetime:
    """The instant `days` days before `now` (UTC)."""
    if not days > 0:
        raise ValueError(f"a retention of {days!r} days keeps nothing: give more than 0")
    return (now or datetime.now(UTC)) - timedelta(days=days)


def _naive_utc(value: datetime) -> datetime:
    """A stored timestamp comparable with any other: SQLite gives back the naive UTC value it
    stored, PostgreSQL an aware one."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _aware_utc(value: datetime) -> datetime:
    """An instant for SQL: aware, whatever the session's time zone (naive is taken as UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class LogRetention:
    """Deletes the call log's rows older than a cutoff (see the module's docstring)."""

    def __init__(
        self, engine: Engine, *, data_dir: Path | None = None, batch_rows: int = BATCH_ROWS
    ) -> None:
        """With `data_dir` (where the export files are), an idle conversation's exports go too,
        their files with their rows; without it they are kept."""
        if batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        self._engine = engine
        self._data_dir = data_dir.resolve() if data_dir is not None else None
        self._batch = batch_rows

    def prune(
        self,
        cutoff: datetime,
        *,
        dry_run: bool = False,
        stop: Callable[[], bool] = lambda: False,
    ) -> PruneReport:
        """Delete (or count, with `dry_run`) what is older than `cutoff`; `stop` is asked
        between batches (a stopped sweep reports what it did so far)."""
        limit = _naive_utc(cutoff)
        log_rows, _, complete = self._sweep(_LOG, limit, dry_run, stop)
        if not complete:
            return PruneReport(cutoff, log_rows=log_rows, complete=False)
        events, blobs, complete = self._sweep(_EVENTS, limit, dry_run, stop)
        if not complete:
            return PruneReport(cutoff, log_rows, events, blobs, complete=False)
        conversations, datasets, exports, complete = self._sweep_idle(cutoff, dry_run, stop)
        done = PruneReport(cutoff, log_rows, events, blobs, conversations, datasets, exports)
        if not complete:
            return replace(done, complete=False)
        usage_rows, _, complete = self._sweep(
            _USAGE, limit, dry_run, stop, keep=_live_conversation(_USAGE, cutoff)
        )
        return replace(done, usage_rows=usage_rows, complete=complete)

    def _sweep_idle(
        self, cutoff: datetime, dry_run: bool, stop: Callable[[], bool]
    ) -> tuple[int, int, int, bool]:
        """Delete the conversations whose last call was before `cutoff`: their state rows and,
        in the same transaction, their datasets, working sets, failed approaches and (with a
        data dir) exports (only for the state rows still idle when deleted), then the export
        files no row refers to any more; (conversations, datasets, export files, complete)."""
        tables = _CONVERSATION_TABLES + (_EXPORT_TABLES if self._data_dir is not None else ())
        limit = _naive_utc(cutoff)
        before = _aware_utc(cutoff)
        state = _STATE
        columns = (state.c.id, state.c.tenant_id, state.c.conversation_id, state.c.updated_at)
        after = 0
        conversations = datasets = exports = 0
        while True:
            if stop():
                return conversations, datasets, exports, False
            paths: list[str] = []
            with translate_db_errors(), self._engine.begin() as conn:
                rows = self._batch_after(conn, columns, after)
                idle = [row for row in rows if _naive_utc(row.updated_at) < limit]
                if idle:
                    keys = [(row.tenant_id, row.conversation_id) for row in idle]
                    # Counted by what the deletes removed: another replica sweeping at the same
                    # time may have taken some first. A conversation called since it was read
                    # keeps its state row, and so (by _has_state) everything else.
                    still_idle = and_(
                        state.c.id.in_([row.id for row in idle]), state.c.updated_at < before
                    )
                    conversations += (
                        len(keys)
                        if dry_run
                        else _count(conn.execute(delete(state).where(still_idle)))
                    )
                    for table in tables:
                        match = _of_conversations(table, keys)
                        if not dry_run:  # only where the state row is gone
                            match = and_(match, ~_has_state(table))
                        if table is _FILES:
                            paths += [r[0] for r in conn.execute(select(table.c.path).where(match))]
                        if dry_run:
                            removed = (
                                conn.execute(
                                    select(func.count()).select_from(table).where(match)
                                ).scalar_one()
                                if table is _DATASETS
                                else 0
                            )
                        else:
                            removed = _count(conn.execute(delete(table).where(match)))
                        if table is _DATASETS:
                            datasets += removed
            exports += self._delete_files(paths, before, dry_run)
            if len(rows) < self._batch:
                return conversations, datasets, exports, True
            after = rows[-1].id

    def _batch_after(self, conn: Any, columns: Sequence[Any], after: int) -> Sequence[Any]:
        """The next batch of rows (`columns`, the first of them the table's id) past id
        `after`, in id order."""
        table_id = columns[0]
        return conn.execute(
            select(*columns).where(table_id > after).order_by(table_id).limit(self._batch)
        ).all()

    def _delete_files(self, paths: list[str], before: datetime, dry_run: bool) -> int:
        """Delete the export files at `paths` (relative to the data dir) that no remaining row
        refers to (another conversation may have registered the same file) and that are where
        exports live; the number deleted (or, in a dry run, that would be: the files no
        conversation the sweep keeps refers to)."""
        root = self._data_dir
        if root is None or not paths:
            return 0
        unique = sorted(set(paths))
        named: ColumnElement[bool] = _FILES.c.path.in_(unique)
        if dry_run:  # the rows are all still there: those of conversations not idle stay
            named = and_(named, ~_idle_conversation(_FILES, before))
        with translate_db_errors(), self._engine.connect() as conn:
            kept = {r[0] for r in conn.execute(select(_FILES.c.path).where(named))}
        deleted = 0
        for relative in unique:
            if relative in kept:
                continue
            path = (root / relative).resolve()
            if not path.is_relative_to(root / EXPORTS_DIR) or not path.is_file():
                continue  # never outside the exports, nor what is already gone
            if not dry_run:
                try:
                    path.unlink()
                except OSError as exc:
                    logger.warning("could not delete the export file %s: %s", path, exc)
                    continue
            deleted += 1
        return deleted

    def _sweep(
        self,
        table: Table,
        limit: datetime,
        dry_run: bool,
        stop: Callable[[], bool],
        *,
        keep: Any = None,
    ) -> tuple[int, int, bool]:
        """Walk `table` oldest first, deleting its rows from before `limit` a batch per
        transaction (an event's blob with it), except those matching `keep` (a SQL condition);
        (rows deleted, blobs deleted, whether it reached the first younger row or the end of
        the table)."""
        has_blob = "blob_id" in table.c
        columns = [table.c.id, table.c.created_at] + ([table.c.blob_id] if has_blob else [])
        after = 0
        deleted = blobs = 0
        while True:
            if stop():
                return deleted, blobs, False
            with translate_db_errors(), self._engine.begin() as conn:
                rows = self._batch_after(conn, columns, after)
                old = [row for row in rows if _naive_utc(row.created_at) < limit]
                if old:
                    ids = [row.id for row in old]
                    blob_ids = [row.blob_id for row in old if has_blob and row.blob_id is not None]
                    match = (
                        table.c.id.in_(ids) if keep is None else and_(table.c.id.in_(ids), ~keep)
                    )
                    if dry_run and keep is not None:
                        deleted += conn.execute(
                            select(func.count()).select_from(table).where(match)
                        ).scalar_one()
                    elif dry_run:
                        deleted += len(ids)
                        blobs += len(blob_ids)
                    else:  # counted by what went: another replica may have taken some first
                        deleted += _count(conn.execute(delete(table).where(match)))
                        if blob_ids:  # after the events that reference them
                            blobs += _count(
                                conn.execute(delete(_BLOBS).where(_BLOBS.c.id.in_(blob_ids)))
                            )
            if len(old) < len(rows) or len(rows) < self._batch:
                return deleted, blobs, True  # a younger row, or the end of the table
            after = rows[-1].id


def _count(result: Any) -> int:
    """The rows a DELETE removed."""
    return max(int(result.rowcount), 0)


def _of_conversations(table: Table, keys: list[tuple[str, str]]) -> Any:
    """Rows of `table` belonging to any of the (tenant, conversation) `keys`."""
    return or_(
        *(
            and_(table.c.tenant_id == tenant, table.c.conversation_id == conversation)
            for tenant, conversation in keys
        )
    )


def _live_conversation(table: Table, cutoff: datetime) -> Any:
    """Whether a row of `table` belongs to a conversation called since `cutoff`."""
    return _has_state(table, _STATE.c.updated_at >= _aware_utc(cutoff))


def _idle_conversation(table: Table, before: datetime) -> Any:
    """Whether a row of `table` belongs to a conversation idle since `before` (its state row
    last updated before it): one a sweep deletes."""
    return _has_state(table, _STATE.c.updated_at < before)


def _has_state(table: Table, *also: Any) -> Any:
    """Whether a row of `table` belongs to a conversation that has a state row (one meeting
    the conditions `also`, when given)."""
    return exists().where(
        _STATE.c.tenant_id == table.c.tenant_id,
        _STATE.c.conversation_id == table.c.conversation_id,
        *also,
    )


class RetentionSweeper:
    """Sweeps the call log every `interval_s` on a thread of its own (the first sweep at
    once), deleting what is older than `days` days."""

    def __init__(self, retention: LogRetention, days: float, interval_s: float) -> None:
        cutoff_for(days)  # a retention that keeps nothing is refused here, not at each sweep
        if not interval_s > 0:
            raise ValueError(f"a retention sweep interval of {interval_s!r}s is not positive")
        self._retention = retention
        self._days = days
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sweeps = 0
        self.last_report: PruneReport | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="log-retention", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the batch in progress, if any."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def sweep_once(self) -> PruneReport | None:
        try:
            report = self._retention.prune(cutoff_for(self._days), stop=self._stop.is_set)
        except ToolmeshError as exc:  # the database is away: the next interval tries again
            logger.warning("call log retention sweep failed: %s", exc.message)
            return None
        except Exception:  # the sweeper outlives any one sweep
            logger.exception("call log retention sweep failed")
            return None
        self.sweeps += 1
        self.last_report = report
        if report.total:
            logger.info("call log retention: %s", report.describe())
        return report

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sweep_once()
            self._stop.wait(self._interval_s)
