"""Domain types of the MCP bridge: a server's connection config, the tools it lists, what
Connect / Reconnect report and how a connection looks from outside."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

TransportName = Literal["stdio", "streamable_http"]
ConnectionStateName = Literal["connecting", "connected", "failed", "disconnected"]
REDACTED = "***"


def redact_url(url: str) -> str:
    """`url` as it may be shown: a password in it and the values of its query parameters
    (where servers take tokens: ?api_key=…) replaced by ***."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:{REDACTED}@{host}" if ":" in userinfo else f"{REDACTED}@{host}"
        query = "&".join(
            f"{key}={REDACTED}" if value else key
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return REDACTED


def url_host(url: str) -> str:
    """The host of `url` (for server.address), '' when it has none."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


@dataclass(frozen=True)
class ServerConfig:
    """How to reach one MCP server. `env` and `headers` may hold secrets: they are stored (the
    bridge needs them to reconnect) but redacted whenever a config is shown."""

    name: str
    transport: TransportName
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    tenant_id: str = "*"

    @property
    def created_by(self) -> str:
        """The registry's created_by of this connection's tools."""
        return f"mcp:{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "args": list(self.args),
            "env": dict(self.env),
            "url": self.url,
            "headers": dict(self.headers),
        }

    @classmethod
    def from_json(
        cls, name: str, transport: str, data: Mapping[str, Any], tenant_id: str
    ) -> ServerConfig:
        return cls(
            name=name,
            transport="stdio" if transport == "stdio" else "streamable_http",
            command=str(data.get("command") or ""),
            args=tuple(str(a) for a in data.get("args") or ()),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            url=str(data.get("url") or ""),
            headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
            tenant_id=tenant_id or "*",
        )

    def redacted(self) -> ServerConfig:
        return ServerConfig(
            name=self.name,
            transport=self.transport,
            command=self.command,
            args=self.args,
            env={k: REDACTED for k in self.env},
            url=redact_url(self.url),
            headers={k: REDACTED for k in self.headers},
            tenant_id=self.tenant_id,
        )


@dataclass(frozen=True)
class McpTool:
    """One tool as the MCP server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    title: str | None = None
    # The server's `execution.taskSupport`: "forbidden", "optional", "required", or None.
    task_support: str | None = None


@dataclass(frozen=True)
class ToolAnnotations:
    """A tool's title and behaviour hints as the bridge accepted them from its server
    (services/mcp_bridge/annotations.py): None is "not declared", which is not False. Hints,
    not facts: the server says so and nothing checks it."""

    title: str | None = None
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None

    def to_json(self) -> dict[str, Any] | None:
        """What the registry stores (tool_definitions.annotations): the declared fields only,
        None when there are none."""
        value: dict[str, Any] = {}
        if self.title:
            value["title"] = self.title
        for key in ("read_only", "destructive", "idempotent", "open_world"):
            flag = getattr(self, key)
            if flag is not None:
                value[key] = flag
        return value or None


@dataclass(frozen=True)
class StoredTool:
    """A tool row as the registry holds it (what the bridge needs for naming and pinning)."""

    name: str
    created_by: str
    status: str
    implementation: str = ""
    definition_hash: str | None = None
    deleted: bool = False
    enabled: bool = True


@dataclass(frozen=True)
class ToolRegistration:
    """A tool row the bridge asks the registry to store. For a row already stored, what the
    server declares replaces what it held and the rest is merged (ToolSink.upsert):
    `required_capabilities` are the bridge's own (its destructive gate), `status` counts only
    when `definition_hash` changed, and `enabled` only for a new row."""

    name: str
    description: str
    input_schema: dict[str, Any]
    implementation: str
    created_by: str
    tenant_id: str
    status: str
    definition_hash: str
    enabled: bool = True
    annotations: ToolAnnotations | None = None
    required_capabilities: tuple[str, ...] = ()


@dataclass
class InventoryReport:
    """What registering a connection's tool listing did."""

    tool_names: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ConnectionInfo:
    """A connection as ListConnections shows it (secrets redacted)."""

    server: ServerConfig
    state: ConnectionStateName
    server_name: str = ""
    server_version: str = ""
    protocol_version: str = ""
    tool_names: tuple[str, ...] = ()
    last_error: str = ""
    session_id: str = ""
    restarts: int = 0
    tool_list_changes: int = 0
    last_tool_change: InventoryReport | None = None


@dataclass(frozen=True)
class ProgressUpdate:
    """A progress notification of an in-flight call."""

    progress: float
    total: float | None = None
    message: str | None = None
