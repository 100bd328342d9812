"""Storage of tool definitions behind a small interface; the only module of the registry that
speaks SQLAlchemy. Seeding runs in one transaction."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.registry.model import SeedReport, ToolDef
from shared.db.engine import translate_db_errors
from shared.db.models import ToolDefinitionRow
from shared.errors import AlreadyExists, NotFound, Unavailable

logger = logging.getLogger(__name__)

# Fields seeding refreshes on existing rows; tool_type and status are never overwritten.
SEED_REFRESHED = (
    "description",
    "input_schema",
    "category",
    "handler_path",
    "status_message",
    "large_output",
)
_ROW_FIELDS = tuple(c.key for c in ToolDefinitionRow.__table__.columns if c.key != "embedding")


class ToolRepository(Protocol):
    def get(self, name: str) -> ToolDef | None: ...
    def names(self) -> list[str]: ...
    def find(
        self,
        *,
        tenant_id: str = "",
        tool_type: str = "",
        category: str = "",
        created_by: str = "",
        include_deleted: bool = False,
    ) -> list[ToolDef]: ...
    def for_llm(self, tenant_id: str) -> list[ToolDef]: ...
    def seed(self, tools: Sequence[dict[str, Any]], retired: Iterable[str]) -> SeedReport: ...
    def upsert(self, tools: Sequence[ToolDef]) -> list[ToolDef]: ...
    def soft_delete(self, names: Sequence[str], created_by: str) -> list[str]: ...
    def set_status(
        self, name: str, status: str | None, reason: str, enabled: bool | None
    ) -> ToolDef: ...


_SEED_ATTEMPTS = 3


def _to_def(row: ToolDefinitionRow) -> ToolDef:
    return ToolDef(**{f: getattr(row, f) for f in _ROW_FIELDS})


def _now() -> datetime:
    return datetime.now(UTC)


class SqlToolRepository:
    """ToolRepository over SQLAlchemy (SQLite or PostgreSQL)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def get(self, name: str) -> ToolDef | None:
        with translate_db_errors(), self._sessions() as s:
            row = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == name))
            return _to_def(row) if row is not None else None

    def names(self) -> list[str]:
        with translate_db_errors(), self._sessions() as s:
            stmt = select(ToolDefinitionRow.name).where(ToolDefinitionRow.deleted_at.is_(None))
            return list(s.scalars(stmt))

    def find(
        self,
        *,
        tenant_id: str = "",
        tool_type: str = "",
        category: str = "",
        created_by: str = "",
        include_deleted: bool = False,
    ) -> list[ToolDef]:
        stmt = select(ToolDefinitionRow)
        if tenant_id:
            stmt = stmt.where(ToolDefinitionRow.tenant_id.in_(("*", tenant_id)))
        if tool_type:
            stmt = stmt.where(ToolDefinitionRow.tool_type == tool_type)
        if category:
            stmt = stmt.where(ToolDefinitionRow.category == category)
        if created_by:
            stmt = stmt.where(ToolDefinitionRow.created_by == created_by)
        if not include_deleted:
            stmt = stmt.where(ToolDefinitionRow.deleted_at.is_(None))
        with translate_db_errors(), self._sessions() as s:
            return [_to_def(r) for r in s.scalars(stmt.order_by(ToolDefinitionRow.name))]

    def for_llm(self, tenant_id: str) -> list[ToolDef]:
        stmt = select(ToolDefinitionRow).where(
            ToolDefinitionRow.status == "approved",
            ToolDefinitionRow.enabled.is_(True),
            ToolDefinitionRow.category != "internal",
            ToolDefinitionRow.deleted_at.is_(None),
            or_(ToolDefinitionRow.tenant_id == "*", ToolDefinitionRow.tenant_id == tenant_id),
        )
        with translate_db_errors(), self._sessions() as s:
            return [_to_def(r) for r in s.scalars(stmt)]

    def seed(self, tools: Sequence[dict[str, Any]], retired: Iterable[str]) -> SeedReport:
        """Upsert the code's system tools. Existing rows get SEED_REFRESHED fields refreshed
        (never tool_type or status); a changed description clears the embedding; retired names
        are soft-deleted; live system rows the code does not know are reported, never deleted.

        Replicas starting together seed at once: the loser's transaction fails (a duplicate
        name, or on SQLite a write from a stale snapshot) and is run again, now seeing the
        winner's rows."""
        retired = set(retired)
        for attempt in range(1, _SEED_ATTEMPTS + 1):
            try:
                return self._seed_once(tools, retired)
            except (IntegrityError, Unavailable) as exc:
                if attempt == _SEED_ATTEMPTS:
                    raise
                logger.info("seeding raced another replica (%s); seeding again", type(exc).__name__)
        raise AssertionError("unreachable")

    def _seed_once(self, tools: Sequence[dict[str, Any]], retired: set[str]) -> SeedReport:
        report = SeedReport()
        known = {t["name"] for t in tools}
        with translate_db_errors(), self._sessions.begin() as s:
            rows = {r.name: r for r in s.scalars(select(ToolDefinitionRow))}
            for schema in tools:
                name = schema["name"]
                if name in retired:
                    continue
                row = rows.get(name)
                values = {
                    "description": schema["description"],
                    "input_schema": schema["input_schema"],
                    "category": schema["category"],
                    "handler_path": schema["handler_path"],
                    "status_message": schema.get("status_message"),
                    "large_output": bool(schema.get("large_output", False)),
                }
                if row is None:
                    s.add(
                        ToolDefinitionRow(
                            name=name,
                            implementation=f"system:{name}",
                            tool_type="system",
                            status="approved",
                            enabled=True,
                            tenant_id="*",
                            created_by="system",
                            **values,
                        )
                    )
                    report.created.append(name)
                    continue
                changed = {k: v for k, v in values.items() if getattr(row, k) != v}
                if row.deleted_at is not None and row.tool_type == "system":
                    row.deleted_at = None  # un-retired in code: revive
                    changed["deleted_at"] = None
                if not changed:
                    report.unchanged.append(name)
                    continue
                if "description" in changed:
                    row.embedding = None
                for k, v in changed.items():
                    setattr(row, k, v)
                row.version = (row.version or 1) + 1
                report.updated.append(name)
            for name in sorted(retired):
                row = rows.get(name)
                if row is not None and row.deleted_at is None:
                    row.deleted_at = _now()
                    report.retired.append(name)
            for name, row in sorted(rows.items()):
                if (
                    row.tool_type == "system"
                    and row.deleted_at is None
                    and name not in known
                    and name not in retired
                ):
                    report.unknown.append(name)
        if report.unknown:
            logger.warning(
                "seeding: %d live system tool(s) unknown to this code, left alone: %s",
                len(report.unknown),
                report.unknown,
            )
        return report

    def upsert(self, tools: Sequence[ToolDef]) -> list[ToolDef]:
        out: list[ToolDef] = []
        with translate_db_errors(), self._sessions.begin() as s:
            for tool in tools:
                row = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == tool.name))
                values = {
                    f: getattr(tool, f)
                    for f in _ROW_FIELDS
                    if f not in ("id", "created_at", "updated_at", "version", "deleted_at")
                }
                if row is None:
                    row = ToolDefinitionRow(**values)
                    s.add(row)
                else:
                    taken = row.tool_type != tool.tool_type or row.tenant_id != tool.tenant_id
                    if taken and row.deleted_at is None:
                        raise AlreadyExists(
                            f"tool {tool.name!r} already exists as a {row.tool_type} tool "
                            f"of tenant {row.tenant_id!r}",
                            reason="TOOL_NAME_TAKEN",
                        )
                    if row.description != tool.description:
                        row.embedding = None
                    for k, v in values.items():
                        setattr(row, k, v)
                    row.deleted_at = None
                    row.version = (row.version or 1) + 1
                try:
                    s.flush()
                except IntegrityError as exc:
                    raise AlreadyExists(
                        f"tool {tool.name!r} was created concurrently", reason="TOOL_NAME_TAKEN"
                    ) from exc
                out.append(_to_def(row))
        return out

    def soft_delete(self, names: Sequence[str], created_by: str) -> list[str]:
        stmt = select(ToolDefinitionRow).where(ToolDefinitionRow.deleted_at.is_(None))
        if names:
            stmt = stmt.where(ToolDefinitionRow.name.in_(list(names)))
        if created_by:
            stmt = stmt.where(ToolDefinitionRow.created_by == created_by)
        with translate_db_errors(), self._sessions.begin() as s:
            rows = list(s.scalars(stmt))
            now = _now()
            for row in rows:
                row.deleted_at = now
            return sorted(r.name for r in rows)

    def set_status(
        self, name: str, status: str | None, reason: str, enabled: bool | None
    ) -> ToolDef:
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == name))
            if row is None or row.deleted_at is not None:
                raise NotFound(f"no tool named {name!r}", reason="TOOL_NOT_FOUND")
            if status:
                row.status = status
                row.rejection_reason = reason if status == "rejected" else None
            if enabled is not None:
                row.enabled = enabled
            s.flush()
            return _to_def(row)
