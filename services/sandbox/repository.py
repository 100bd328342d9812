"""Storage of the sandbox: custom tool definitions (rows of tool_definitions with tool_type
custom) and the tool_jobs queue. The only module of the sandbox that speaks SQLAlchemy.

Claiming a job is safe with several workers in several replicas: `SELECT … FOR UPDATE SKIP
LOCKED` on PostgreSQL; on SQLite (one writer at a time) a conditional UPDATE that only one
claimant can win (it names the attempt count it read, which every claim increments).

A claim is a lease: the worker renews `claimed_at` (`heartbeat`) while it works; a job left in
building/testing whose lease expired — its worker died, hung or lost the database — is claimed
again, at most `max_attempts` times in all, after which it is `failed` (reason JOB_ABANDONED).
Every write of a leased job names its lease, so a worker that lost its lease cannot overwrite
the job's new owner (LeaseLost)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import translate_db_errors
from shared.db.models import ToolDefinitionRow, ToolJobRow
from shared.errors import AlreadyExists, FailedPrecondition, NotFound

JOB_STATUSES = ("queued", "building", "testing", "approved", "rejected", "failed")
JOB_TYPES = ("build", "audit", "rebuild")
LEASED_STATUSES = ("building", "testing")
DEFAULT_LEASE_S = 60.0
DEFAULT_MAX_ATTEMPTS = 3


class LeaseLost(FailedPrecondition):
    """The job's lease expired and another worker claimed it: this worker must let it go."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job {job_id!r} was claimed by another worker after this worker's lease expired",
            reason="JOB_LEASE_LOST",
            metadata={"job_id": job_id},
        )


@dataclass(frozen=True)
class Lease:
    """One claim of a job: by `worker`, the job's `attempt`-th claim."""

    job_id: str
    worker: str
    attempt: int


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
    attempts: int = 0
    claimed_by: str | None = None
    claimed_at: datetime | None = None

    @property
    def lease(self) -> Lease:
        """The lease of this claim (meaningful on a job returned by claim_job)."""
        return Lease(self.id, self.claimed_by or "", self.attempts)


_TOOL_FIELDS = tuple(f for f in CustomTool.__dataclass_fields__)


def _tool(row: ToolDefinitionRow) -> CustomTool:
    return CustomTool(**{f: getattr(row, f) for f in _TOOL_FIELDS})


def keyed_job_id(tenant_id: str, request_id: str) -> str:
    """The id of the job a submission with idempotency key `request_id` queues: the same for
    the same tenant and key, distinct (96 bits of SHA-256) otherwise."""
    digest = hashlib.sha256(f"{tenant_id}\x00{request_id}".encode()).hexdigest()
    return "k" + digest[:24]


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
        attempts=row.attempts or 0,
        claimed_by=row.claimed_by,
        claimed_at=row.claimed_at,
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _abandoned(row: ToolJobRow) -> dict[str, Any]:
    was = f"in {row.status}" + (f" by {row.claimed_by}" if row.claimed_by else "")
    return {
        "error": f"abandoned after {row.attempts} attempts: each time the worker running the "
        f"job stopped renewing its lease (last {was}); not retried again",
        "reason": "JOB_ABANDONED",
        "attempts": row.attempts,
    }


class SqlSandboxRepository:
    """Custom tools and build jobs over SQLAlchemy (SQLite or PostgreSQL). Blocking.
    `clock` (UTC now) is a seam for lease tests."""

    def __init__(
        self, sessions: sessionmaker[Session], *, clock: Callable[[], datetime] = _now
    ) -> None:
        self._sessions = sessions
        self._clock = clock

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

    def set_status(self, name: str, tenant_id: str | None, status: str, reason: str) -> CustomTool:
        """Review the custom tool `name` of `tenant_id` (None: of whichever tenant owns it).
        TOOL_NOT_FOUND when that tenant has no such tool (another tenant's is not revealed);
        NOT_A_CUSTOM_TOOL for a system or MCP tool it can see (the registry reviews those)."""
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(
                select(ToolDefinitionRow)
                .where(ToolDefinitionRow.name == name, ToolDefinitionRow.deleted_at.is_(None))
                .with_for_update()
            )
            visible = row is not None and (
                tenant_id is None
                or row.tenant_id == tenant_id
                or (row.tool_type != "custom" and row.tenant_id == "*")
            )
            if row is None or not visible:
                owner = f" of tenant {tenant_id!r}" if tenant_id is not None else ""
                raise NotFound(
                    f"no custom tool {name!r}{owner}",
                    reason="TOOL_NOT_FOUND",
                    metadata={"tool": name},
                )
            if row.tool_type != "custom":
                raise NotFound(
                    f"{name!r} is a {row.tool_type} tool, not a custom tool; review it with the "
                    "registry's SetToolStatus",
                    reason="NOT_A_CUSTOM_TOOL",
                    metadata={"tool": name, "tool_type": row.tool_type},
                )
            row.status = status
            row.rejection_reason = (reason or "rejected") if status == "rejected" else None
            row.updated_at = self._clock()
            s.flush()
            return _tool(row)

    def record_audit(
        self,
        name: str,
        *,
        tenant_id: str,
        status: str,
        test_results: dict[str, Any] | None,
        rejection_reason: str | None,
    ) -> CustomTool:
        """Record a build job's audit on `tenant_id`'s custom tool `name` (never another
        tenant's tool of that name: NotFound)."""
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(
                select(ToolDefinitionRow).where(
                    ToolDefinitionRow.name == name,
                    ToolDefinitionRow.tool_type == "custom",
                    ToolDefinitionRow.tenant_id == tenant_id,
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
        job_id: str = "",
    ) -> Job:
        with translate_db_errors(), self._sessions.begin() as s:
            row = ToolJobRow(
                id=job_id or uuid.uuid4().hex[:12],
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

    def create_keyed_job(
        self,
        *,
        request_id: str,
        tenant_id: str,
        tool_name: str,
        spec: dict[str, Any],
        conversation_id: str | None = None,
    ) -> tuple[Job, bool]:
        """A build job submitted with an idempotency key: the job the tenant's first submission
        with `request_id` queued, and whether it was that earlier one (True) rather than queued
        now. Its id is derived from tenant and key, so two submissions racing on any replica
        insert the same primary key and one of them reads the other's job. The same key with
        another request or tool name is AlreadyExists."""
        job_id = keyed_job_id(tenant_id, request_id)
        spec = {**spec, "request_id": request_id}
        try:
            job = self.create_job(
                tenant_id=tenant_id,
                tool_name=tool_name,
                spec=spec,
                conversation_id=conversation_id,
                job_id=job_id,
            )
            return job, False
        except IntegrityError as exc:
            try:
                earlier = self.get_job(job_id, tenant_id)
            except NotFound:
                raise exc from None  # not the key's job: some other constraint failed
        same = all(earlier.spec.get(k) == spec.get(k) for k in ("request", "tool_name"))
        if not same:
            raise AlreadyExists(
                f"request_id {request_id!r} was already used for another build request "
                f"(job {job_id}); a new request needs a new request_id",
                reason="REQUEST_ID_REUSED",
                metadata={"job_id": job_id},
            )
        return earlier, True

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

    def claim_job(
        self,
        worker: str = "",
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> Job | None:
        """Move the oldest claimable job to building under a lease held by `worker` and return
        it (its `lease` names the claim); None when there is none. Claimable: queued, or in
        building/testing with a lease older than `lease_s` (or none). A stale job that already
        had `max_attempts` claims is failed instead and the next one is looked at. Two
        claimants never get the same job."""
        while True:
            done, job = self._claim_one(worker, lease_s, max_attempts)
            if done:
                return job

    def _claim_one(self, worker: str, lease_s: float, max_attempts: int) -> tuple[bool, Job | None]:
        """(True, the claimed job or None when nothing is claimable), or (False, None) to look
        again: after failing an abandoned job, or after losing a race for the candidate."""
        with translate_db_errors(), self._sessions.begin() as s:
            now = self._clock()
            stale = and_(
                ToolJobRow.status.in_(LEASED_STATUSES),
                or_(
                    ToolJobRow.claimed_at.is_(None),
                    ToolJobRow.claimed_at < now - timedelta(seconds=lease_s),
                ),
            )
            claimable = or_(ToolJobRow.status == "queued", stale)
            stmt = (
                select(ToolJobRow)
                .where(claimable)
                .order_by(ToolJobRow.created_at, ToolJobRow.id)
                .limit(1)
            )
            if s.get_bind().dialect.name == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True)
            candidate = s.scalar(stmt)
            if candidate is None:
                return True, None
            give_up = candidate.status != "queued" and candidate.attempts >= max_attempts
            values: dict[str, Any] = (
                {"status": "failed", "progress_pct": 100, "result": _abandoned(candidate)}
                if give_up
                else {
                    "status": "building",
                    "progress_pct": 10,
                    "claimed_by": worker,
                    "claimed_at": now,
                    "attempts": candidate.attempts + 1,
                }
            )
            # The row as read (same status and attempt count, still claimable) or nothing: on
            # SQLite a concurrent claimant that won first leaves this UPDATE matching no row.
            won = s.execute(
                update(ToolJobRow)
                .where(
                    ToolJobRow.id == candidate.id,
                    ToolJobRow.status == candidate.status,
                    ToolJobRow.attempts == candidate.attempts,
                    claimable,
                )
                .values(**values, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if getattr(won, "rowcount", 0) != 1:
                return False, None
            s.refresh(candidate)
            return not give_up, None if give_up else _job(candidate)

    def heartbeat(self, lease: Lease) -> bool:
        """Renew the lease; False when it is lost (the job was claimed again, or finished)."""
        with translate_db_errors(), self._sessions.begin() as s:
            now = self._clock()
            renewed = s.execute(self._fenced(lease).values(claimed_at=now, updated_at=now))
            return getattr(renewed, "rowcount", 0) == 1

    @staticmethod
    def _fenced(lease: Lease) -> Any:
        return (
            update(ToolJobRow)
            .where(
                ToolJobRow.id == lease.job_id,
                ToolJobRow.claimed_by == lease.worker,
                ToolJobRow.attempts == lease.attempt,
                ToolJobRow.status.in_(LEASED_STATUSES),
            )
            .execution_options(synchronize_session=False)
        )

    def update_job(self, job_id: str, *, lease: Lease | None = None, **values: Any) -> Job:
        """Change a job. With `lease`, only while that lease holds (renewing it): LeaseLost
        when another worker has claimed the job since."""
        with translate_db_errors(), self._sessions.begin() as s:
            now = self._clock()
            if lease is not None:
                if lease.job_id != job_id:
                    raise ValueError("the lease is of another job")
                changed = s.execute(
                    self._fenced(lease).values(**values, claimed_at=now, updated_at=now)
                )
                if getattr(changed, "rowcount", 0) != 1:
                    raise LeaseLost(job_id)
                row = s.get(ToolJobRow, job_id, populate_existing=True)
                assert row is not None
                return _job(row)
            row = s.get(ToolJobRow, job_id)
            if row is None:
                raise NotFound(f"no job {job_id!r}", reason="JOB_NOT_FOUND")
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = now
            s.flush()
            return _job(row)
