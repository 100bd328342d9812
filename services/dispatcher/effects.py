"""The effects of a dispatched call, on the dispatcher's side of the chokepoint.

* `CallEffects`: one call's effect log with the recording proxies the dispatch path writes to;
  its recorder backend (`CallEventBuffer`) buffers the call's conversation_events rows for the
  call log's group commit, and its display backend is the streaming RPC's queue, if any.
* `ResultEffects`: what a result does besides answering the model — cards finalised (singleton
  dedup, map merge), datasets promoted into the conversation, exports checked to lie under the
  data dir and registered (a generated_files row and an export_catalog entry written in the
  call's transaction, an `export` event and an `export.ready` notification).
* `SqlEffectsStore`: the tables behind them (conversation_datasets, generated_files,
  export_catalog).

Imports no grpc."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, cast

import pyarrow as pa
from google.protobuf import json_format
from sqlalchemy import Engine, Executable, Table, insert, select
from sqlalchemy.orm import Session

from services.dispatcher.logstore import EventRecord
from shared import convert
from shared.arrow_ipc import ipc_to_table
from shared.config import DEFAULT_DB_WAIT_S
from shared.contract.effects import (
    DisplayHandle,
    Effect,
    EffectContext,
    EffectLog,
    RecordingDisplay,
    RecordingRecorder,
    StreamChunk,
    StreamChunks,
    apply_effect,
)
from shared.contract.effects_cards import finalize_cards
from shared.db.engine import db_thread, translate_db_errors
from shared.db.models import (
    ConversationDatasetRow,
    ExportCatalogRow,
    GeneratedFileRow,
    utcnow,
)
from shared.errors import FailedPrecondition, NotFound, ToolmeshError
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)

MAX_DATASET_NAME = 128
MAX_EXPORT_NAME = 255


class CallEventBuffer:
    """The EventRecorder backend of a dispatched call: rows wait here for the call's group
    commit (one transaction with its tool_execution_log row)."""

    def __init__(self) -> None:
        self.events: list[EventRecord] = []

    def record(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        tool_use_id: str,
        at: datetime,
        blob: bytes | None,
    ) -> None:
        self.events.append(EventRecord(event_type, dict(data), tool_use_id, at, blob))


# A call's first progress reports are each recorded (a conversation_events row and an effect
# replay re-applies); past these, one call keeps only its latest report for the record.
RECORDED_PROGRESS = 256


class CallEffects:
    """The effects of one call: the log (in emission order) and the proxies that fill it.

    Progress is a state, and a tool may report it thousands of times a second: the call's first
    RECORDED_PROGRESS reports are recorded and streamed as effects like any other; after them
    each report is still shown at once (the display keeps only the latest one not yet sent)
    but held rather than recorded, replacing the one held before, and the last one is recorded
    (its data saying how many it stands for, `superseded`) just before the call's next event
    (its result). So the log, the call's conversation_events and the memory they take stay
    bounded however many reports come, and the record still ends with the latest state."""

    def __init__(self, display: DisplayHandle | None = None) -> None:
        self.buffer = CallEventBuffer()
        self.log = EffectLog(EffectContext(recorder=self.buffer, display=display))
        self.recording = RecordingRecorder(self.log)
        self.showing = RecordingDisplay(self.log)
        self.streaming = display is not None
        self._progress_recorded = 0
        # The latest progress report past RECORDED_PROGRESS not yet recorded, and how many
        # reports it replaced.
        self._held_progress: dict[str, Any] | None = None
        self._held_superseded = 0

    @property
    def events(self) -> list[EventRecord]:
        return self.buffer.events

    @property
    def effects(self) -> list[Effect]:
        return list(self.log.effects)

    def event(self, event_type: str, data: Mapping[str, Any], tool_use_id: str = "") -> None:
        """A conversation_events row, through the recording proxy and the chokepoint (a progress
        report held back by report_progress first)."""
        held = self._held_progress
        if held is not None:
            self._held_progress = None
            recorded = {**held, "superseded": self._held_superseded}
            self._held_superseded = 0
            self.recording.record("progress", recorded, tool_use_id=str(held["tool_use_id"]))
        self.recording.record(event_type, data, tool_use_id=tool_use_id)

    def stream(self, *chunks: tuple[str, Mapping[str, Any]]) -> None:
        """Display chunks, sent only when the call has a display (a streaming RPC)."""
        if self.streaming:
            self.showing.send(*chunks)

    def report_progress(self, tool_use_id: str, data: Mapping[str, Any]) -> None:
        payload = {"tool_use_id": tool_use_id, **data}
        if self._progress_recorded < RECORDED_PROGRESS:
            self._progress_recorded += 1
            self.event("progress", payload, tool_use_id)
            self.stream(("progress", payload))
            return
        if self._held_progress is not None:
            self._held_superseded += 1
        self._held_progress = payload
        if self.streaming:
            # Shown through the chokepoint, not kept in the log (replay shows the recorded ones).
            apply_effect(StreamChunks((StreamChunk("progress", payload),)), self.log.ctx)


# --- storage -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportEntry:
    """A registered export (generated_files row)."""

    file_id: str
    tenant_id: str
    conversation_id: str
    filename: str
    path: str
    mime_type: str
    size_bytes: int
    source_tool: str
    original_filename: str
    tool_use_id: str
    created_at: datetime | None


class EffectsStore(Protocol):
    def promote_datasets(
        self,
        tenant_id: str,
        conversation_id: str,
        namespace_id: str,
        datasets: Sequence[tuple[str, bytes, int, list[dict[str, Any]]]],
        source: str,
    ) -> None: ...

    def list_exports(
        self, tenant_id: str, conversation_id: str, limit: int
    ) -> list[ExportEntry]: ...

    def get_export(self, tenant_id: str, file_id: str) -> ExportEntry:
        """NotFound when the tenant has no export of that id."""
        ...


_FILES = cast(Table, GeneratedFileRow.__table__)
_CATALOG = cast(Table, ExportCatalogRow.__table__)
_INSERT_FILE = insert(_FILES)
_INSERT_CATALOG = insert(_CATALOG)


@dataclass(frozen=True)
class _InsertRow:
    """A StateWrite inserting one row, in the call's transaction."""

    statement: Executable
    row: dict[str, Any]

    def params(self) -> dict[str, Any]:
        return self.row

    def row_key(self) -> tuple[Any, ...]:
        return ()  # a new row: no other transaction waits for it


def _entry(r: GeneratedFileRow) -> ExportEntry:
    return ExportEntry(
        file_id=r.file_id,
        tenant_id=r.tenant_id,
        conversation_id=r.conversation_id,
        filename=r.filename,
        path=r.path,
        mime_type=r.mime_type,
        size_bytes=r.size_bytes,
        source_tool=r.source_tool,
        original_filename=r.original_filename,
        tool_use_id=r.tool_use_id,
        created_at=r.created_at,
    )


class SqlEffectsStore:
    """EffectsStore over SQLAlchemy. Blocking; call from worker threads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def promote_datasets(
        self,
        tenant_id: str,
        conversation_id: str,
        namespace_id: str,
        datasets: Sequence[tuple[str, bytes, int, list[dict[str, Any]]]],
        source: str,
    ) -> None:
        """Insert or replace each dataset (name, arrow_ipc, rows, columns) of the conversation,
        in one transaction."""
        t = cast(Table, ConversationDatasetRow.__table__)
        with translate_db_errors(), self._engine.begin() as conn:
            for name, payload, rows, columns in datasets:
                key = (
                    t.c.tenant_id == tenant_id,
                    t.c.conversation_id == conversation_id,
                    t.c.namespace_id == namespace_id,
                    t.c.name == name,
                )
                values = {
                    "arrow_ipc": payload,
                    "rows": rows,
                    "columns": columns,
                    "source": source,
                    "updated_at": utcnow(),
                }
                existing = conn.execute(select(t.c.id).where(*key)).scalar_one_or_none()
                if existing is None:
                    conn.execute(
                        insert(t).values(
                            tenant_id=tenant_id,
                            conversation_id=conversation_id,
                            namespace_id=namespace_id,
                            name=name,
                            created_at=utcnow(),
                            **values,
                        )
                    )
                else:
                    conn.execute(t.update().where(t.c.id == existing).values(**values))

    def list_exports(self, tenant_id: str, conversation_id: str, limit: int) -> list[ExportEntry]:
        stmt = select(GeneratedFileRow)
        if tenant_id:
            stmt = stmt.where(GeneratedFileRow.tenant_id == tenant_id)
        if conversation_id:
            stmt = stmt.where(GeneratedFileRow.conversation_id == conversation_id)
        stmt = stmt.order_by(GeneratedFileRow.id.desc()).limit(limit)
        with translate_db_errors(), Session(self._engine) as s:
            return [_entry(r) for r in s.scalars(stmt)]

    def get_export(self, tenant_id: str, file_id: str) -> ExportEntry:
        stmt = select(GeneratedFileRow).where(GeneratedFileRow.file_id == file_id)
        if tenant_id:
            stmt = stmt.where(GeneratedFileRow.tenant_id == tenant_id)
        with translate_db_errors(), Session(self._engine) as s:
            row = s.scalars(stmt).one_or_none()
            if row is None:
                raise NotFound(
                    f"no export {file_id!r}",
                    reason="EXPORT_NOT_FOUND",
                    metadata={"file_id": file_id},
                )
            return _entry(row)


# --- a result's effects --------------------------------------------------------------------


class EffectProblem(Exception):
    """A result whose effects cannot be applied: becomes an Err of `err_kind`."""

    def __init__(self, err_kind: str, message: str) -> None:
        super().__init__(message)
        self.err_kind = err_kind
        self.message = message


# Where tools write the files they export, under the data dir: only files in it can become
# downloads. The rest of the data dir (the SQLite database, uploaded data files, other state)
# must never be published by a result that names it.
EXPORTS_DIR = "exports"


def resolve_export_path(data_dir: Path, raw: str) -> Path:
    """The export's file, which must be an existing regular file under the data dir's
    `exports/` (after resolving `..` and symlinks); a relative path is relative to the data
    dir."""
    if not raw:
        raise EffectProblem("export_invalid", "export has no path")
    root = data_dir.resolve()
    candidate = Path(raw)
    path = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not path.is_relative_to(root):
        raise EffectProblem(
            "export_path_outside_data_dir",
            f"export path {raw!r} resolves outside the data directory; exports must be written "
            f"under its {EXPORTS_DIR}/",
        )
    if not path.is_relative_to(root / EXPORTS_DIR):
        raise EffectProblem(
            "export_path_outside_exports",
            f"export path {raw!r} is not under the data directory's {EXPORTS_DIR}/: only files "
            "written there can be exported",
        )
    if not path.is_file():
        raise EffectProblem("export_missing", f"export file {raw!r} does not exist")
    return path


def _dataset_columns(d: pb.Dataset, table: pa.Table) -> list[dict[str, Any]]:
    if d.columns:
        return [
            {
                "name": c.name,
                "dtype": c.dtype,
                "null_count": c.null_count if c.HasField("null_count") else None,
                "distinct_count": c.distinct_count if c.HasField("distinct_count") else None,
            }
            for c in d.columns
        ]
    return [
        {"name": f.name, "dtype": str(f.type), "null_count": None, "distinct_count": None}
        for f in table.schema
    ]


@dataclass
class ResultEffects:
    """Applies a result's effects for one call (see the module docstring)."""

    data_dir: Path
    store: EffectsStore | None

    async def apply(
        self,
        result: pb.ToolResult,
        ctx: pb.CallContext,
        tool_name: str,
        fx: CallEffects,
        writes: list[Any],
    ) -> pb.ToolResult:
        """The result with its effects applied; an Err result (kind naming the problem) when
        one cannot be."""
        try:
            datasets = self._check_datasets(result)
            exports = [self._check_export(e, tool_name) for e in result.exports]
        except EffectProblem as problem:
            logger.warning("%s: %s (%s)", tool_name, problem.message, problem.err_kind)
            return convert.error_result_pb(f"{tool_name}: {problem.message}", problem.err_kind)
        if datasets and ctx.conversation_id and self.store is not None:
            try:
                await asyncio.to_thread(
                    self.store.promote_datasets,
                    ctx.tenant_id,
                    ctx.conversation_id,
                    ctx.namespace_id,
                    datasets,
                    f"tool:{tool_name}",
                )
            except ToolmeshError as exc:
                logger.warning("%s: promoting datasets failed: %s", tool_name, exc.message)
                return convert.error_result_pb(
                    f"{tool_name}: its datasets could not be saved to the conversation: "
                    f"{exc.message}",
                    "dataset_promotion_failed",
                )
        if result.cards:
            cards = finalize_cards([json_format.MessageToDict(c) for c in result.cards])
            del result.cards[:]
            for card in cards:
                result.cards.add().update(card)
                fx.event("card", {"tool_use_id": ctx.tool_use_id, "card": card}, ctx.tool_use_id)
            fx.stream(*(("card", card) for card in cards))
            if result.envelope.WhichOneof("kind") == "ok":
                del result.envelope.ok.effects.cards[:]
                for card in cards:
                    result.envelope.ok.effects.cards.add().update(card)
        for export, (relative, size) in zip(result.exports, exports, strict=True):
            self._register(export, relative, size, ctx, tool_name, fx, writes)
        if result.exports and result.envelope.WhichOneof("kind") == "ok":
            registered = {e.filename: e for e in result.exports}
            for e in result.envelope.ok.effects.exports:
                if e.filename in registered:
                    e.CopyFrom(registered[e.filename])
        return result

    def _check_datasets(
        self, result: pb.ToolResult
    ) -> list[tuple[str, bytes, int, list[dict[str, Any]]]]:
        out = []
        for d in result.datasets:
            if not d.name or len(d.name) > MAX_DATASET_NAME:
                raise EffectProblem(
                    "invalid_dataset", f"dataset name must be 1..{MAX_DATASET_NAME} characters"
                )
            try:
                table = ipc_to_table(d.arrow_ipc)
            except (pa.ArrowException, ValueError, OSError) as exc:
                raise EffectProblem(
                    "invalid_dataset", f"dataset {d.name!r} is not an Arrow IPC table: {exc}"
                ) from None
            out.append((d.name, d.arrow_ipc, table.num_rows, _dataset_columns(d, table)))
        return out

    def _check_export(self, export: pb.Export, tool_name: str) -> tuple[str, int]:
        name = export.filename
        if not name or len(name) > MAX_EXPORT_NAME or "/" in name or "\\" in name:
            raise EffectProblem(
                "export_invalid",
                f"export filename {name!r} must be 1..{MAX_EXPORT_NAME} characters without "
                "path separators",
            )
        path = resolve_export_path(self.data_dir, export.path)
        return path.relative_to(self.data_dir.resolve()).as_posix(), path.stat().st_size

    def _register(
        self,
        export: pb.Export,
        relative: str,
        size: int,
        ctx: pb.CallContext,
        tool_name: str,
        fx: CallEffects,
        writes: list[Any],
    ) -> None:
        file_id = uuid.uuid4().hex
        export.file_id = file_id
        export.path = relative
        export.size_bytes = size
        export.source_tool = export.source_tool or tool_name
        now = utcnow()
        writes.append(
            _InsertRow(
                _INSERT_FILE,
                {
                    "file_id": file_id,
                    "tenant_id": ctx.tenant_id,
                    "conversation_id": ctx.conversation_id,
                    "user_id": ctx.user_id,
                    "tool_use_id": ctx.tool_use_id,
                    "filename": export.filename,
                    "path": relative,
                    "mime_type": export.mime_type,
                    "size_bytes": size,
                    "source_tool": export.source_tool,
                    "original_filename": export.original_filename,
                    "created_at": now,
                },
            )
        )
        writes.append(
            _InsertRow(
                _INSERT_CATALOG,
                {
                    "tenant_id": ctx.tenant_id,
                    "conversation_id": ctx.conversation_id,
                    "namespace_id": ctx.namespace_id,
                    "name": export.filename,
                    "file_id": file_id,
                    "kind": "export",
                    "created_at": now,
                },
            )
        )
        info = {
            "file_id": file_id,
            "filename": export.filename,
            "path": relative,
            "mime_type": export.mime_type,
            "size_bytes": size,
            "source_tool": export.source_tool,
            "original_filename": export.original_filename,
            "tool_use_id": ctx.tool_use_id,
        }
        fx.event("export", info, ctx.tool_use_id)
        notice = {
            "title": f"{export.filename} is ready",
            "file_id": file_id,
            "filename": export.filename,
            "size_bytes": size,
            "mime_type": export.mime_type,
        }
        fx.event("export.ready", notice, ctx.tool_use_id)
        fx.stream(("export.ready", notice))


EXPORT_CHUNK_BYTES = 64 * 1024


class ExportFiles:
    """Registered exports for download: listing and reading them back from the data dir."""

    def __init__(
        self, store: EffectsStore, data_dir: Path, *, db_wait_s: float = DEFAULT_DB_WAIT_S
    ) -> None:
        self._store = store
        self._data_dir = data_dir.resolve()
        self._db_wait_s = db_wait_s

    async def list(self, tenant_id: str, conversation_id: str, limit: int) -> list[ExportEntry]:
        return await db_thread(
            self._db_wait_s,
            "a query of the exports",
            self._store.list_exports,
            tenant_id,
            conversation_id,
            limit,
        )

    async def open(self, tenant_id: str, file_id: str) -> tuple[ExportEntry, Path]:
        """The export and its file; NotFound for an unknown id, FailedPrecondition when the
        file is no longer under the data dir."""
        entry = await db_thread(
            self._db_wait_s, "a query of an export", self._store.get_export, tenant_id, file_id
        )
        try:
            path = resolve_export_path(self._data_dir, entry.path)
        except EffectProblem as problem:
            raise FailedPrecondition(
                f"export {file_id!r} ({entry.filename}) cannot be read: {problem.message}",
                reason="EXPORT_FILE_GONE",
                metadata={"file_id": file_id, "problem": problem.err_kind},
            ) from None
        return entry, path

    async def chunks(self, path: Path) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            while True:
                chunk = await asyncio.to_thread(handle.read, EXPORT_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        finally:
            handle.close()
