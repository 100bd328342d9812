"""Storage of the surface service behind a small interface; the only module of the service that
speaks SQLAlchemy. Reads tool_definitions (the registry's catalog; the surface writes only the
`embedding` column, which the registry clears when a description changes) and
tool_execution_log (read-only); owns working_set_entries, surface_misses and seed_log."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Engine, Table, bindparam, case, func, select, text, update
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

_WORKING_SET = cast(Table, WorkingSetEntryRow.__table__)
_MISSES = cast(Table, SurfaceMissRow.__table__)


def _once(names: Iterable[str]) -> list[str]:
    """`names` in order, each once (a tool paged in by a tenant and, before working sets were
    per tenant, with no tenant recorded, is one entry)."""
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class PageIn:
    """What a page-in did: the names it added, and those it refused for want of room."""

    added: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


# Given the working set as it is inside the page-in's transaction, how many more tools fit.
RoomCheck = Callable[[list[str]], int]


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
    def working_set(
        self, conversation_id: str, namespace_id: str, tenant_id: str | None = None
    ) -> list[str]: ...
    def add_to_working_set(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        tenant_id: str | None = None,
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
    def page_in_checked(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        floor: frozenset[str],
        now: datetime,
        *,
        tenant_id: str | None = None,
        room: RoomCheck | None = None,
    ) -> PageIn: ...
    def usage_counts(self, now: datetime) -> dict[str, BucketCounts]: ...
    def miss_counts(self, now: datetime) -> dict[str, BucketCounts]: ...
    def read_seed(self, key: str) -> str | None: ...
    def write_seed(self, key: str, value: str) -> None: ...


class SqlSurfaceStore:
    """SurfaceStore over SQLAlchemy (SQLite or PostgreSQL)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        engine = sessions.kw.get("bind")
        if not isinstance(engine, Engine):
            raise TypeError("SqlSurfaceStore needs a sessionmaker bound to an Engine")
        self._engine = engine
        insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        w = _WORKING_SET
        # Every tenant's entries (an admin's view), and one tenant's (with the rows written
        # before working sets were per tenant, tenant_id '').
        self._read_working_set = (
            select(w.c.tool_name)
            .where(
                w.c.conversation_id == bindparam("conversation_id"),
                w.c.namespace_id == bindparam("namespace_id"),
            )
            .order_by(w.c.id)
        )
        self._read_tenant_working_set = self._read_working_set.where(
            w.c.tenant_id.in_([bindparam("tenant_id"), ""])
        )
        self._insert_working_set = insert(w).on_conflict_do_nothing().returning(w.c.tool_name)
        m = _MISSES
        self._count_miss = insert(m).on_conflict_do_update(
            index_elements=[m.c.tool_name, m.c.day], set_={"count": m.c.count + 1}
        )
        # One statement, so two writers at once (a derivation at start and one a call asked
        # for, or two replicas) both succeed, the later value kept; a read-then-insert made
        # the second fail on the key.
        seed = cast(Table, SeedLogRow.__table__)
        fresh = insert(seed)
        self._write_seed = fresh.on_conflict_do_update(
            index_elements=[seed.c.key],
            set_={
                "value": fresh.excluded.value,
                "pinned": True,
                "updated_at": fresh.excluded.updated_at,
            },
        )

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
    # On the request path (every AssembleTools reads the working set, every search_tools pages
    # in), so these are SQLAlchemy Core statements built once and run on a plain connection:
    # the ORM session's unit of work and per-call statement compilation cost more than the
    # database itself.

    def working_set(
        self, conversation_id: str, namespace_id: str, tenant_id: str | None = None
    ) -> list[str]:
        """The tool names of a conversation namespace's working set, in page-in order: those
        `tenant_id` paged in (and those written with no tenant recorded, before working sets
        were per tenant); every tenant's when it is None."""
        with translate_db_errors(), self._engine.connect() as conn:
            return self._read(conn, conversation_id, namespace_id, tenant_id)

    def _read(
        self, conn: Connection, conversation_id: str, namespace_id: str, tenant_id: str | None
    ) -> list[str]:
        key = {"conversation_id": conversation_id, "namespace_id": namespace_id}
        if tenant_id is None:
            return _once(conn.execute(self._read_working_set, key).scalars())
        key["tenant_id"] = tenant_id
        return _once(conn.execute(self._read_tenant_working_set, key).scalars())

    def add_to_working_set(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        tenant_id: str | None = None,
    ) -> list[str]:
        """Add names (idempotent under concurrent replicas); returns those newly added."""
        if not names:
            return []
        with translate_db_errors(), self._engine.begin() as conn:
            return self._add(conn, conversation_id, namespace_id, names, tenant_id)

    def page_in(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        floor: frozenset[str],
        now: datetime,
    ) -> list[str]:
        """search_tools' write in one transaction of two statements: add names to the working
        set and count a surface miss for each newly added name outside `floor`. Returns the
        names added."""
        return self.page_in_checked(conversation_id, namespace_id, names, floor, now).added

    def page_in_checked(
        self,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        floor: frozenset[str],
        now: datetime,
        *,
        tenant_id: str | None = None,
        room: RoomCheck | None = None,
    ) -> PageIn:
        """page_in for `tenant_id`, within the budget: with `room`, the page-in holds the
        namespace's lock (concurrent page-ins into one namespace, on any replica, run one after
        the other), reads the working set, asks `room` how many more tools fit, and adds at
        most that many of the names not in it yet; the others are refused."""
        if not names:
            return PageIn()
        with translate_db_errors(), self._engine.begin() as conn:
            unique = list(dict.fromkeys(names))
            refused: list[str] = []
            if room is not None:
                self._lock_namespace(conn, conversation_id, namespace_id)
                current = self._read(conn, conversation_id, namespace_id, tenant_id)
                present = set(current)
                new = [n for n in unique if n not in present]
                fits = max(0, room(current))
                unique, refused = new[:fits], new[fits:]
            added = self._add(conn, conversation_id, namespace_id, unique, tenant_id)
            self._misses(conn, [n for n in added if n not in floor], now)
        return PageIn(added, refused)

    def _lock_namespace(self, conn: Connection, conversation_id: str, namespace_id: str) -> None:
        """Serialise page-ins into one conversation namespace until the transaction ends:
        PostgreSQL's transaction-scoped advisory lock on a hash of the key; on SQLite a first
        write takes the database's write lock (WAL: one writer at a time)."""
        if self._engine.dialect.name == "postgresql":
            digest = hashlib.sha256(
                f"working_set\0{conversation_id}\0{namespace_id}".encode("utf-8", "replace")
            ).digest()
            key = int.from_bytes(digest[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        else:
            conn.execute(_WORKING_SET.delete().where(_WORKING_SET.c.id < 0))

    def _add(
        self,
        conn: Connection,
        conversation_id: str,
        namespace_id: str,
        names: Sequence[str],
        tenant_id: str | None = None,
    ) -> list[str]:
        """One INSERT .. ON CONFLICT DO NOTHING RETURNING: the names it returns are the ones
        this call added (a name another replica added first is not returned)."""
        unique = list(dict.fromkeys(names))
        if not unique:
            return []
        created = datetime.now(UTC)
        rows = [
            {
                "tenant_id": tenant_id or "",
                "conversation_id": conversation_id,
                "namespace_id": namespace_id,
                "tool_name": n,
                "created_at": created,
            }
            for n in unique
        ]
        inserted = set(conn.execute(self._insert_working_set, rows).scalars())
        return [n for n in unique if n in inserted]

    # --- tier 0 inputs ------------------------------------------------------------------------

    def record_misses(self, names: Iterable[str], now: datetime) -> None:
        with translate_db_errors(), self._engine.begin() as conn:
            self._misses(conn, names, now)

    def _misses(self, conn: Connection, names: Iterable[str], now: datetime) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        conn.execute(
            self._count_miss, [{"tool_name": name, "day": day, "count": 1} for name in names]
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
        params = {"key": key, "value": value, "pinned": True, "updated_at": datetime.now(UTC)}
        with translate_db_errors(), self._engine.begin() as conn:
            conn.execute(self._write_seed, params)
