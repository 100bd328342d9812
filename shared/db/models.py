"""SQLAlchemy models of every toolmesh table. Schema changes go through Alembic migrations in
shared/db/migrations; a test checks the models and the migrations agree."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so migrations are identical on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ToolDefinitionRow(Base):
    """tool_definitions: the central record of every tool (system, custom, mcp)."""

    __tablename__ = "tool_definitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    description: Mapped[str] = mapped_column(Text, nullable=False, default="")
    input_schema: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    implementation: Mapped[str] = mapped_column(Text, nullable=False, default="")
    handler_path: Mapped[str | None] = mapped_column(String(255))
    tool_type: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="draft")
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    category: Mapped[str] = mapped_column(String(64), nullable=False, default="general")
    domain: Mapped[str | None] = mapped_column(String(64))
    replaced_by_model_capability: Mapped[str | None] = mapped_column(String(64))
    status_message: Mapped[str | None] = mapped_column(String(255))
    large_output: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    parent_tool: Mapped[str | None] = mapped_column(String(64))
    dependencies: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False, default="*")
    created_by: Mapped[str] = mapped_column(String(128), nullable=False, default="system")
    rejection_reason: Mapped[str | None] = mapped_column(Text)
    test_results: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    # Beyond the spec's columns: RBAC, per-tool timeout, MCP definition pinning, search index.
    required_capabilities: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    timeout_seconds: Mapped[float | None] = mapped_column(Float)
    definition_hash: Mapped[str | None] = mapped_column(String(64))
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_tool_definitions_tenant_type", "tenant_id", "tool_type"),)


class ToolJobRow(Base):
    """tool_jobs: the async build/audit lifecycle of custom tools."""

    __tablename__ = "tool_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tool_name: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    job_type: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    progress_pct: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )

    __table_args__ = (Index("ix_tool_jobs_status_created", "status", "created_at"),)


class ToolExecutionLogRow(Base):
    """tool_execution_log: the immutable operational record of every tool call."""

    __tablename__ = "tool_execution_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    tool_use_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    args_hash: Mapped[str] = mapped_column(String(16), nullable=False, default="")
    input_data: Mapped[Any] = mapped_column(JSON)
    output_summary: Mapped[str] = mapped_column(Text, nullable=False, default="")
    success: Mapped[bool] = mapped_column(Boolean, nullable=False)
    error: Mapped[str | None] = mapped_column(Text)
    execution_ms: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    trace_id: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        Index("ix_tool_execution_log_tool_tenant_created", "tool_name", "tenant_id", "created_at"),
        Index("ix_tool_execution_log_created", "created_at"),
        Index("ix_tool_execution_log_conversation", "conversation_id"),
    )


class ConversationEventRow(Base):
    """conversation_events: full, untruncated I/O and guardrail events of a conversation.
    A payload over 32 KB is stored in conversation_event_blobs and `data` is left null."""

    __tablename__ = "conversation_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False)
    event_type: Mapped[str] = mapped_column(String(64), nullable=False)
    tool_use_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    data: Mapped[str | None] = mapped_column(Text)
    blob_id: Mapped[int | None] = mapped_column(ForeignKey("conversation_event_blobs.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("ix_conversation_events_conv", "tenant_id", "conversation_id", "id"),)


class ConversationEventBlobRow(Base):
    """conversation_event_blobs: event payloads over 32 KB, as UTF-8 JSON bytes."""

    __tablename__ = "conversation_event_blobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    size_bytes: Mapped[int] = mapped_column(Integer, nullable=False)


class ConversationDatasetRow(Base):
    """conversation_datasets: named tables of a conversation (Arrow IPC, zstd), so any replica
    can serve the next call."""

    __tablename__ = "conversation_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False)
    namespace_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    arrow_ipc: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    rows: Mapped[int] = mapped_column(Integer, nullable=False)
    columns: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False, default=list)
    source: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )

    __table_args__ = (
        UniqueConstraint(
            "tenant_id",
            "conversation_id",
            "namespace_id",
            "name",
            name="uq_conversation_datasets_key",
        ),
    )


# --- dispatcher guardrails (migration 0002) ---------------------------------------------------


class PolicyRuleRow(Base):
    """policy_rules: dispatcher rules checked before a call runs (deny a tool, require a prior
    tool, constrain an argument, rate-limit a tool). Disabled, never deleted."""

    __tablename__ = "policy_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    message: Mapped[str] = mapped_column(Text, nullable=False, default="")
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    created_by: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )

    __table_args__ = (Index("ix_policy_rules_tenant_enabled", "tenant_id", "enabled"),)


class ObservationRow(Base):
    """observations: how often a user's calls violated a policy rule; the count escalates the
    wording the model is shown."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False)
    rule_id: Mapped[int] = mapped_column(ForeignKey("policy_rules.id"), nullable=False)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    first_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant_id", "user_id", "rule_id", name="uq_observations_key"),
    )


class FailedApproachRow(Base):
    """failed_approaches: per conversation, a tool + arguments (narration keys excluded) that
    failed, with the last reason and the number of attempts."""

    __tablename__ = "failed_approaches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    identity_hash: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    first_failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint(
            "tenant_id",
            "conversation_id",
            "tool_name",
            "identity_hash",
            name="uq_failed_approaches_key",
        ),
    )


class ConversationStateRow(Base):
    """conversation_state: the dispatcher's per-conversation state shared by every replica —
    the loop guard (identity hash of the last call and its consecutive count, ordered by
    call_seq) and the cancellation epoch (a call started before an epoch bump is cancelled)."""

    __tablename__ = "conversation_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False)
    call_seq: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    loop_hash: Mapped[str] = mapped_column(String(16), nullable=False, default="")
    loop_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cancel_epoch: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant_id", "conversation_id", name="uq_conversation_state_key"),
    )


class RateLimitCounterRow(Base):
    """rate_limit_counters: calls per (rate-limit rule, tenant, tool, fixed window), incremented
    atomically before a call runs so every replica counts against the same limit."""

    __tablename__ = "rate_limit_counters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rule_id: Mapped[int] = mapped_column(Integer, nullable=False)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    window_start: Mapped[int] = mapped_column(BigInteger, nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)

    __table_args__ = (
        UniqueConstraint(
            "rule_id", "tenant_id", "tool_name", "window_start", name="uq_rate_limit_counters_key"
        ),
        Index("ix_rate_limit_counters_window", "window_start"),
    )
