"""Storage of the surface service behind a small interface; the only module of the service that
speaks SQLAlchemy. Reads tool_definitions (the registry's catalog; the surface writes only the
`embedding` column, which the registry clears when a description changes) and
tool_execution_log (read-only); owns working_set_entries, surface_misses and seed_log."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from services.surface.tier0 import AGE_BUCKETS, BucketCounts
from shared.db.engine import translate_db_errors
from shared.db.models import (
    SeedLogRow,
    SurfaceMissRow,
    ToolDefinitionRow,
    ToolExecutionLogRow,
    WorkingSetEntryRow,
)


@dataclass(frozen=True)
class ToolRecord:
    """One live tool_definitions row with its stored embedding."""

    id: int
    name: str
    description: str
    input_schema: dict[str, Any]
    tenant_id: str
    status: str
    enabled: bool
    category: str
    required_capabilities: tuple[str, ...]
    replaced_by_model_capability: str | None
    version: int
    embedding: bytes | None


class SurfaceStore(Protocol):
    def catalog_fingerprint(self) -> tuple[Any, ...]: ...
    def load_catalog(self) -> list[ToolRecord]: ...
    def embedded_ids(self) -> set[int]: ...
    def save_embeddings(self, items: Sequence[tuple[int, int, bytes]]) -> int: ...
    def working_set(self, conversation_id: str, namespace_id: str) -> list[str]: ...
    def add_to_working_set(
        self, conversation_id: str, namespace_id: str, names: Sequence[str]
    ) -> list[str]: ...
    def record_misses(self, names: Iterable[str], now: datetime) -> None: ...
    def page_in(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        floor: frozenset[str],
        now: datetime,
    ) -> list[str]: ...
    def usage_counts(self, now: datetime) -> dict[str, BucketCounts]: ...
    def miss_counts(self, now: datetime) -> dict[str, BucketCounts]: ...
    def read_seed(self, key: str) -> str | None: ...
    def write_seed(self, key: str, value: str) -> None: ...


class SqlSurfaceStore:
    """SurfaceStore over SQLAlchemy (SQLite or PostgreSQL)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # --- catalog ------------------------------------------------------------------------------

    def catalog_fingerprint(self) -> tuple[Any, ...]:
        """Changes whenever a tool is added, changed, deleted or (re-)embedded."""
        t = ToolDefinitionRow
        stmt = select(
            func.count(t.id),
            func.max(t.updated_at),
            func.coalesce(func.sum(t.version), 0),
            func.count(t.embedding),
            func.count(t.deleted_at),
        )
        with translate_db_errors(), self._sessions() as s:
            row = s.execute(stmt).one()
        return tuple(row)

    def load_catalog(self) -> list[ToolRecord]:
        t = ToolDefinitionRow
        stmt = select(
            t.id,
            t.name,
            t.description,
            t.input_schema,
            t.tenant_id,
            t.status,
            t.enabled,
            t.category,
            t.required_capabilities,
            t.replaced_by_model_capability,
            t.version,
            t.embedding,
        ).where(t.deleted_at.is_(None))
        with translate_db_errors(), self._sessions() as s:
            return [
                ToolRecord(
                    id=r.id,
                    name=r.name,
                    description=r.description or "",
                    input_schema=r.input_schema if isinstance(r.input_schema, dict) else {},
                    tenant_id=r.tenant_id,
                    status=r.status,
                    enabled=bool(r.enabled),
                    category=r.category,
                    required_capabilities=tuple(r.required_capabilities or ()),
                    replaced_by_model_capability=r.replaced_by_model_capability,
                    version=r.version or 1,
                    embedding=r.embedding,
                )
                for r in s.execute(stmt.order_by(t.id))
            ]

    def embedded_ids(self) -> set[int]:
        """Ids of the tools that have a stored embedding."""
        t = ToolDefinitionRow
        with translate_db_errors(), self._sessions() as s:
            return set(s.scalars(select(t.id).where(t.embedding.is_not(None))))

    def save_embeddings(self, items: Sequence[tuple[int, int, bytes]]) -> int:
        """Store (id, version, vector) triples; a row whose version moved on since it was read
        (its description may have changed) is left alone. `updated_at` is kept as it was."""
        t = ToolDefinitionRow
        stored = 0
        with translate_db_errors(), self._sessions.begin() as s:
            for tool_id, version, blob in items:
                result = s.execute(
                    update(t)
                    .where(t.id == tool_id, t.version == version, t.embedding.is_(None))
                    .values(embedding=blob, updated_at=t.updated_at)
                    .execution_options(synchronize_session=False)
                )
                stored += int(getattr(result, "rowcount", 0) or 0)
        return stored

    # --- working sets -------------------------------------------------------------------------

    def working_set(self, conversation_id: str, namespace_id: str) -> list[str]:
        w = WorkingSetEntryRow
        stmt = (
            select(w.tool_name)
            .where(w.conversation_id == conversation_id, w.namespace_id == namespace_id)
            .order_by(w.id)
        )
        with translate_db_errors(), self._sessions() as s:
            return list(s.scalars(stmt))

    def add_to_working_set(
        self, conversation_id: str, namespace_id: str, names: Sequence[str]
    ) -> list[str]:
        """Add names (idempotent under concurrent replicas); returns those newly added."""
        if not names:
            return []
        with translate_db_errors(), self._sessions.begin() as s:
            return self._add(s, conversation_id, namespace_id, names)

    def page_in(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        floor: frozenset[str],
        now: datetime,
    ) -> list[str]:
        """search_tools' write in one transaction: add names to the working set and count a
        surface miss for each newly added name outside `floor`. Returns the names added."""
        if not names:
            return []
        with translate_db_errors(), self._sessions.begin() as s:
            added = self._add(s, conversation_id, namespace_id, names)
            self._misses(s, [n for n in added if n not in floor], now)
        return added

    def _add(
        self, s: Session, conversation_id: str, namespace_id: str, names: Sequence[str]
    ) -> list[str]:
        rows: list[dict[str, Any]] = [
            {
                "conversation_id": conversation_id,
                "namespace_id": namespace_id,
                "tool_name": n,
                "created_at": datetime.now(UTC),
            }
            for n in dict.fromkeys(names)
        ]
        before = set(self._names(s, conversation_id, namespace_id))
        fresh = [r for r in rows if r["tool_name"] not in before]
        if fresh:
            insert = (
                postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
            )
            s.execute(insert(WorkingSetEntryRow).values(fresh).on_conflict_do_nothing())
        return [str(r["tool_name"]) for r in fresh]

    @staticmethod
    def _names(s: Session, conversation_id: str, namespace_id: str) -> list[str]:
        w = WorkingSetEntryRow
        return list(
            s.scalars(
                select(w.tool_name).where(
                    w.conversation_id == conversation_id, w.namespace_id == namespace_id
                )
            )
        )

    # --- tier 0 inputs ------------------------------------------------------------------------

    def record_misses(self, names: Iterable[str], now: datetime) -> None:
        with translate_db_errors(), self._sessions.begin() as s:
            self._misses(s, names, now)

    @staticmethod
    def _misses(s: Session, names: Iterable[str], now: datetime) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        m = SurfaceMissRow
        insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
        for name in names:
            stmt = insert(m).values(tool_name=name, day=day, count=1)
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=[m.tool_name, m.day], set_={"count": m.count + 1}
                )
            )

    def _bucketed(self, name_col: Any, time_col: Any, weight: Any, now: datetime) -> Any:
        recent = now - timedelta(days=AGE_BUCKETS[0][0])
        mid = now - timedelta(days=AGE_BUCKETS[1][0])
        return select(
            name_col,
            func.sum(case((time_col >= recent, weight), else_=0)),
            func.sum(case(((time_col < recent) & (time_col >= mid), weight), else_=0)),
            func.sum(case((time_col < mid, weight), else_=0)),
        ).group_by(name_col)

    def usage_counts(self, now: datetime) -> dict[str, BucketCounts]:
        log = ToolExecutionLogRow
        stmt = self._bucketed(log.tool_name, log.created_at, 1, now)
        with translate_db_errors(), self._sessions() as s:
            return {
                r[0]: BucketCounts(int(r[1] or 0), int(r[2] or 0), int(r[3] or 0))
                for r in s.execute(stmt)
            }

    def miss_counts(self, now: datetime) -> dict[str, BucketCounts]:
        m = SurfaceMissRow
        stmt = self._bucketed(m.tool_name, m.day, m.count, now)
        with translate_db_errors(), self._sessions() as s:
            return {
                r[0]: BucketCounts(int(r[1] or 0), int(r[2] or 0), int(r[3] or 0))
                for r in s.execute(stmt)
            }

    # --- seed log -----------------------------------------------------------------------------

    def read_seed(self, key: str) -> str | None:
        with translate_db_errors(), self._sessions() as s:
            row = s.get(SeedLogRow, key)
            return row.value if row is not None else None

    def write_seed(self, key: str, value: str) -> None:
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.get(SeedLogRow, key)
            if row is None:
                s.add(SeedLogRow(key=key, value=value, pinned=True))
            else:
                row.value = value
                row.pinned = True
