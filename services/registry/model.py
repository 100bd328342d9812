"""Domain types of the registry: a stored tool definition and the seeding report."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TOOL_TYPES = ("system", "custom", "mcp")
STATUSES = ("draft", "testing", "approved", "rejected")
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


@dataclass
class ToolDef:
    """One tool_definitions row, as the core sees it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    tool_type: str
    status: str = "approved"
    enabled: bool = True
    category: str = "general"
    implementation: str = ""
    handler_path: str | None = None
    domain: str | None = None
    replaced_by_model_capability: str | None = None
    status_message: str | None = None
    large_output: bool = False
    parent_tool: str | None = None
    dependencies: list[str] = field(default_factory=list)
    version: int = 1
    tenant_id: str = "*"
    created_by: str = "system"
    rejection_reason: str | None = None
    test_results: dict[str, Any] | None = None
    deleted_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    required_capabilities: list[str] = field(default_factory=list)
    timeout_seconds: float | None = None
    definition_hash: str | None = None
    # An MCP tool's title and hints ({"title": str, "read_only" | "destructive" | "idempotent"
    # | "open_world": bool}, what the server declared; shared.convert.annotations_to_pb).
    annotations: dict[str, Any] | None = None
    id: int = 0

    def visible_to(self, tenant_id: str) -> bool:
        return self.tenant_id in ("*", tenant_id) or not tenant_id

    @property
    def live(self) -> bool:
        return self.deleted_at is None


@dataclass
class SeedReport:
    """What seed_system_tools did: every name lands in exactly one list."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
