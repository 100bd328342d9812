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
    text,
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
    # Beyond the spec's columns: RBAC, per-tool timeout, MCP definition pinning, search index,
    # MCP tool annotations.
    required_capabilities: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    timeout_seconds: Mapped[float | None] = mapped_column(Float)
    definition_hash: Mapped[str | None] = mapped_column(String(64))
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)
    # An MCP tool's title and behaviour hints as the bridge accepted them ({"title": str,
    # "read_only" | "destructive" | "idempotent" | "open_world": bool}, only what the server
    # declared); NULL when it declared none.
    annotations: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Of required_capabilities, those the MCP bridge's last listing of the tool added (its
    # destructive gate), which its next listing may take off again; every other capability is
    # an administrator's and is kept. NULL: no listing recorded any (services/registry/
    # repository.py, upsert with mcp_listing). Registry bookkeeping: never part of a ToolDef.
    listing_capabilities: Mapped[list[str] | None] = mapped_column(JSON)

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
    # The lease of a building/testing job: who claimed it, when its worker last renewed the
    # claim (a job whose lease expired is claimed again), and how many claims it has had.
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")

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
    # The conversation's model as the call's context named it; "" when it named none.
    model: Mapped[str] = mapped_column(String(128), nullable=False, default="", server_default="")
    # The DispatchToolCallResponse the call was answered with (serialized), kept for a call
    # the client named (a tool_use id, in a conversation) so a retry is answered, not run
    # again; null otherwise, and for a call that ended in an RPC error. Deferred: a listing of
    # the log does not load it.
    response: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)

    __table_args__ = (
        Index("ix_tool_execution_log_tool_tenant_created", "tool_name", "tenant_id", "created_at"),
        Index("ix_tool_execution_log_created", "created_at"),
        Index("ix_tool_execution_log_conversation", "conversation_id"),
        # Partial: only the calls whose response is kept (a retry's lookup), so the calls
        # without one pay no index write.
        Index(
            "ix_tool_execution_log_tool_use",
            "conversation_id",
            "tool_use_id",
            sqlite_where=text("response IS NOT NULL"),
            postgresql_where=text("response IS NOT NULL"),
        ),
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


# --- LLM model configs and usage (issue 7) -------------------------------------------------


class ModelConfigRow(Base):
    """model_configs: one row per model the platform may call — provider, native capabilities,
    output-token ceiling, the roles it serves and its prices (USD per million tokens)."""

    __tablename__ = "model_configs"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    capabilities: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    max_output_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    roles: Mapped[list[str]] = mapped_column(JSON, nullable=False, default=list)
    input_price_per_mtok: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    output_price_per_mtok: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    cache_read_price_per_mtok: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    cache_write_price_per_mtok: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


class UsageLogRow(Base):
    """usage_log: one row per cost-bearing leaf (an LLM call, a paid tool) with who it was for,
    so cost is answerable per tenant / user / conversation / tool from the database alone."""

    __tablename__ = "usage_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    tool_use_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    trace_id: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # "llm" | "tool"
    provider: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    model: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    input_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cache_write_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)

    __table_args__ = (
        Index("ix_usage_log_tenant_created", "tenant_id", "created_at"),
        Index("ix_usage_log_conversation", "tenant_id", "conversation_id"),
    )


# --- sandbox (issue 4) ---------------------------------------------------------------------


# --- mcp_bridge (issue 5) ------------------------------------------------------------------


class McpConnectionRow(Base):
    """mcp_connections: MCP server connections the bridge re-establishes when it restarts. A
    disconnected connection's row is deleted; a bridge shutting down keeps its rows."""

    __tablename__ = "mcp_connections"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    transport: Mapped[str] = mapped_column(String(32), nullable=False)
    # command, args, env, url, headers (secrets included: the table is the bridge's own state).
    config: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False, default="*")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


# --- surface (issue 6) ---------------------------------------------------------------------


class WorkingSetEntryRow(Base):
    """working_set_entries: tools search_tools paged into a tenant's conversation namespace;
    sticky for the rest of the conversation, read by every surface replica."""

    __tablename__ = "working_set_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # The tenant that paged the tool in; '' for rows written before working sets were per
    # tenant (shown to every tenant of the conversation).
    tenant_id: Mapped[str] = mapped_column(
        String(128), nullable=False, default="", server_default=""
    )
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False)
    namespace_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint(
            "tenant_id",
            "conversation_id",
            "namespace_id",
            "tool_name",
            name="uq_working_set_entries_key",
        ),
    )


class SurfaceMissRow(Base):
    """surface_misses: per tool and UTC day, how often search_tools paged the tool in while it
    was outside the resident floor (a signal for the Tier-0 derivation)."""

    __tablename__ = "surface_misses"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tool_name: Mapped[str] = mapped_column(String(128), nullable=False)
    day: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)

    __table_args__ = (UniqueConstraint("tool_name", "day", name="uq_surface_misses_key"),)


class SeedLogRow(Base):
    """seed_log: pinned configuration rows written by derivations (e.g. the Tier-0 floor under
    `tool_surface_tier0_v1`), as JSON text."""

    __tablename__ = "seed_log"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)
    pinned: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


# --- effects (issue 3) ---------------------------------------------------------------------


class GeneratedFileRow(Base):
    """generated_files: every file a tool produced for download, kept under the data dir
    (`path` is relative to it). Immutable; a later export of the same filename is a new row."""

    __tablename__ = "generated_files"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    file_id: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    user_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    tool_use_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    mime_type: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    source_tool: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    original_filename: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("ix_generated_files_conv", "tenant_id", "conversation_id", "id"),)


class ExportCatalogRow(Base):
    """export_catalog: the conversation's catalog of exports by filename, so later calls and
    the frontend find an export by name; the newest entry of a filename is the current one."""

    __tablename__ = "export_catalog"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False)
    conversation_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    namespace_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    file_id: Mapped[str] = mapped_column(String(64), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False, default="export")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        Index("ix_export_catalog_name", "tenant_id", "conversation_id", "namespace_id", "name"),
    )
