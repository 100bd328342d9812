"""Storage of the sandbox: custom tool definitions (rows of tool_definitions with tool_type
custom) and the tool_jobs queue. The only module of the sandbox that speaks SQLAlchemy.

Claiming a job is safe with several workers in several replicas: `SELECT … FOR UPDATE SKIP
LOCKED` on PostgreSQL; on SQLite (one writer at a time) a conditional UPDATE of the queued row
that only one claimant can win."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import translate_db_errors
from shared.db.models import ToolDefinitionRow, ToolJobRow
from shared.errors import AlreadyExists, NotFound

JOB_STATUSES = ("queued", "building", "testing", "approved", "rejected", "failed")
JOB_TYPES = ("build", "audit", "rebuild")


@dataclass
class CustomTool:
    """A custom tool definition as the sandbox stores it."""

    name: str
    implementation: str
    tenant_id: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    status: str = "draft"
    enabled: bool = True
    category: str = "general"
    version: int = 1
    created_by: str = "user"
    required_capabilities: list[str] = field(default_factory=list)
    timeout_seconds: float | None = None
    dependencies: list[str] = field(default_factory=list)
    rejection_reason: str | None = None
    test_results: dict[str, Any] | None = None
    id: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass
class Job:
    """One tool_jobs row."""

    id: str
    tool_name: str
    job_type: str
    status: str
    spec: dict[str, Any]
    result: dict[str, Any] | None
    progress_pct: int
    tenant_id: str
    conversation_id: str | None
    created_at: datetime | None = None
    updated_at: datetime | None = None


_TOOL_FIELDS = tuple(f for f in CustomTool.__dataclass_fields__)


def _tool(row: ToolDefinitionRow) -> CustomTool:
    return CustomTool(**{f: getattr(row, f) for f in _TOOL_FIELDS})


def _job(row: ToolJobRow) -> Job:
    return Job(
        id=row.id,
        tool_name=row.tool_name,
        job_type=row.job_type,
        status=row.status,
        spec=dict(row.spec or {}),
        result=row.result,
        progress_pct=row.progress_pct,
        tenant_id=row.tenant_id,
        conversation_id=row.conversation_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _now() -> datetime:
    return datetime.now(UTC)


class SqlSandboxRepository:
    """Custom tools and build jobs over SQLAlchemy (SQLite or PostgreSQL). Blocking."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # --- custom tools -----------------------------------------------------------------------

    def register(self, tool: CustomTool) -> CustomTool:
        """Create the tool as a draft, or update the caller's own custom tool: version + 1,
        back to draft (changed code needs a new approval). A name held by a system or MCP tool
        or by another tenant is ALREADY_EXISTS."""
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(
                select(ToolDefinitionRow)
                .where(ToolDefinitionRow.name == tool.name)
                .with_for_update()
            )
            values = {
                "description": tool.description,
                "input_schema": tool.input_schema,
                "implementation": tool.implementation,
                "category": tool.category,
                "enabled": tool.enabled,
                "required_capabilities": list(tool.required_capabilities),
                "timeout_seconds": tool.timeout_seconds,
                "dependencies": list(tool.dependencies),
                "status": "draft",
                "rejection_reason": None,
                "test_results": None,
                "deleted_at": None,
            }
            if row is None:
                row = ToolDefinitionRow(
                    name=tool.name,
                    tool_type="custom",
                    tenant_id=tool.tenant_id,
                    created_by=tool.created_by,
                    version=1,
                    **values,
                )
                s.add(row)
            else:
                if row.tool_type != "custom":
                    raise AlreadyExists(
                        f"{tool.name!r} is a {row.tool_type} tool; choose another name",
                        reason="TOOL_NAME_TAKEN",
                        metadata={"tool": tool.name},
                    )
                if row.tenant_id != tool.tenant_id and row.deleted_at is None:
                    raise AlreadyExists(
                        f"the custom tool name {tool.name!r} is taken",
                        reason="TOOL_NAME_TAKEN",
                        metadata={"tool": tool.name},
                    )
                for key, value in values.items():
                    setattr(row, key, value)
                row.tenant_id = tool.tenant_id
                row.version = (row.version or 0) + 1
                row.updated_at = _now()
            s.flush()
            return _tool(row)

    def get(self, name: str) -> CustomTool | None:
        with translate_db_errors(), self._sessions() as s:
            row = s.scalar(
                select(ToolDefinitionRow).where(
                    ToolDefinitionRow.name == name, ToolDefinitionRow.tool_type == "custom"
                )
            )
            return _tool(row) if row is not None else None

    def record_audit(
        self,
        name: str,
        *,
        status: str,
        test_results: dict[str, Any] | None,
        rejection_reason: str | None,
    ) -> CustomTool:
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(
                select(ToolDefinitionRow).where(
                    ToolDefinitionRow.name == name, ToolDefinitionRow.tool_type == "custom"
                )
            )
            if row is None:
                raise NotFound(f"no custom tool {name!r}", reason="TOOL_NOT_FOUND")
            row.status = status
            row.test_results = test_results
            row.rejection_reason = rejection_reason
            row.updated_at = _now()
            s.flush()
            return _tool(row)

    # --- jobs -------------------------------------------------------------------------------

    def create_job(
        self,
        *,
        tenant_id: str,
        tool_name: str,
        spec: dict[str, Any],
        job_type: str = "build",
        conversation_id: str | None = None,
    ) -> Job:
        with translate_db_errors(), self._sessions.begin() as s:
            row = ToolJobRow(
                id=uuid.uuid4().hex[:12],
                tool_name=tool_name,
                job_type=job_type,
                status="queued",
                spec=spec,
                progress_pct=0,
                tenant_id=tenant_id,
                conversation_id=conversation_id or None,
            )
            s.add(row)
            s.flush()
            return _job(row)

    def get_job(self, job_id: str, tenant_id: str) -> Job:
        with translate_db_errors(), self._sessions() as s:
            row = s.get(ToolJobRow, job_id)
            if row is None or (tenant_id and row.tenant_id != tenant_id):
                raise NotFound(f"no job {job_id!r}", reason="JOB_NOT_FOUND")
            return _job(row)

    def list_jobs(self, tenant_id: str, limit: int = 50) -> list[Job]:
        stmt = select(ToolJobRow).order_by(ToolJobRow.created_at.desc(), ToolJobRow.id)
        if tenant_id:
            stmt = stmt.where(ToolJobRow.tenant_id == tenant_id)
        with translate_db_errors(), self._sessions() as s:
            return [_job(r) for r in s.scalars(stmt.limit(max(1, min(limit, 500))))]

    def claim_job(self) -> Job | None:
        """Move the oldest queued job to building and return it; None when the queue is empty.
        Two claimants never get the same job."""
        with translate_db_errors(), self._sessions.begin() as s:
            dialect = s.get_bind().dialect.name
            stmt = (
                select(ToolJobRow)
                .where(ToolJobRow.status == "queued")
                .order_by(ToolJobRow.created_at, ToolJobRow.id)
                .limit(1)
            )
            if dialect == "postgresql":
                row = s.scalar(stmt.with_for_update(skip_locked=True))
                if row is None:
                    return None
                row.status, row.progress_pct, row.updated_at = "building", 10, _now()
                s.flush()
                return _job(row)
            candidate = s.scalar(stmt)
            if candidate is None:
                return None
            claimed = s.execute(
                update(ToolJobRow)
                .where(ToolJobRow.id == candidate.id, ToolJobRow.status == "queued")
                .values(status="building", progress_pct=10, updated_at=_now())
            )
            won = getattr(claimed, "rowcount", 0)
            if won != 1:
                return None
            s.refresh(candidate)
            return _job(candidate)

    def update_job(self, job_id: str, **values: Any) -> Job:
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.get(ToolJobRow, job_id)
            if row is None:
                raise NotFound(f"no job {job_id!r}", reason="JOB_NOT_FOUND")
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = _now()
            s.flush()
            return _job(row)
