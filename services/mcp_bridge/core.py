"""The MCP bridge's domain core: connect / disconnect / reconnect / list / stop, restoring stored
connections, registering each connection's tools in the registry (naming, description prefix,
definition pinning) and proxying calls with MCP client spans. Imports no grpc: the registry and
the connection store are parameters (ToolSink, ConnectionStore)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.mcp_bridge import sdk
from services.mcp_bridge.annotations import annotations_of, required_capabilities
from services.mcp_bridge.connection import LiveConnection, list_tools
from services.mcp_bridge.content import DEFAULT_EXPORT_MAX_BYTES, result_to_envelope
from services.mcp_bridge.model import (
    ConnectionInfo,
    InventoryReport,
    McpTool,
    ProgressUpdate,
    ServerConfig,
    StoredTool,
    ToolRegistration,
    redact_url,
    url_host,
)
from services.mcp_bridge.naming import (
    assign_names,
    check_connection_name,
    definition_hash,
    implementation_of,
    parse_implementation,
)
from shared import convert
from shared.config import DEFAULT_DB_WAIT_S
from shared.contract import Envelope, Err
from shared.db.engine import db_thread
from shared.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from shared.telemetry.metrics import record_mcp_operation
from shared.telemetry.tracing import span_attributes, tracer

logger = logging.getLogger(__name__)

ProgressSink = Callable[[ProgressUpdate], Awaitable[None]]

# A server announcing a tool-list change is re-listed this long after the announcement, so a
# burst of announcements (a server adding tools one by one) costs one listing; and never sooner
# than the minimum interval after its previous re-listing, so a server announcing without end
# costs the registry one listing a second at most.
TOOLS_CHANGED_DELAY_S = 0.1
TOOLS_CHANGED_MIN_INTERVAL_S = 1.0
# A re-listing that failed is tried again after twice the interval of the last try, up to this.
RELIST_BACKOFF_MAX_S = 30.0
# What the bridge does about a server that went away, by transport.
_RECOVERING = {
    "stdio": "it is being restarted",
    "streamable_http": "the bridge is reconnecting to it",
}


@dataclass
class _NamedLock:
    """A connection name's lock and how many hold or await it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ToolSink(Protocol):
    """Where the bridge registers tools (the registry)."""

    async def connection_tools(self, created_by: str) -> list[StoredTool]:
        """Every row created by this connection, soft-deleted ones included."""
        ...

    async def live_tools(self) -> list[StoredTool]:
        """Every live tool row (any owner)."""
        ...

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        """Register a listing. A tool already stored for the connection is merged, not
        replaced: the bridge owns what the server declares (description, schema, annotations,
        definition hash) and, of its required capabilities, only its destructive gate, which
        replaces the one the previous listing added; what an administrator set (every other
        required capability, enabled, category, timeout_seconds, ...) is kept, and so is the
        review status while the definition hash is unchanged. The registry does the merge, in
        the transaction that writes the row (UpsertTools with mcp_listing), so an
        administrator's change made since connection_tools was read is not lost."""
        ...

    async def delete(self, names: Sequence[str], created_by: str) -> list[str]: ...


class ConnectionStore(Protocol):
    """Stored connections, re-established when the bridge restarts."""

    def load(self) -> list[ServerConfig]: ...

    def save(self, config: ServerConfig) -> None: ...

    def delete(self, name: str) -> None: ...


class _SessionLost(Exception):
    """A call the server refused because it no longer knows the session it was sent on."""


@dataclass
class CallOutcome:
    """A proxied call: its envelope and the raw structuredContent, if any."""

    envelope: Envelope
    structured: dict[str, Any] | None = None


def _distinct_named(tools: list[McpTool]) -> tuple[list[McpTool], list[str]]:
    """The listing without nameless tools (no call could name them) and with each name once
    (a server listing a name twice had it registered twice, under two names), and what was
    left out, as "name: why"."""
    kept: list[McpTool] = []
    seen: set[str] = set()
    skipped: list[str] = []
    for tool in tools:
        if not tool.name:
            skipped.append(": it has no name")
        elif tool.name in seen:
            skipped.append(f"{convert.clip(tool.name, 100)}: listed more than once (first kept)")
        else:
            seen.add(tool.name)
            kept.append(tool)
    return kept, skipped


def _unregistrable(tool: Any) -> str | None:
    """Why a server's tool cannot be registered, or None: one such tool failed the whole
    connection's registration."""
    if "\x00" in tool.name:
        return "its name holds a NUL character"
    if tool.task_support == "required":
        # MCP's task-augmented execution (tools/call with `task`, then tasks/get and
        # tasks/result): the SDK's client has none, and a plain call is refused (-32601).
        return (
            'it runs only as a task (execution.taskSupport "required"); the bridge makes plain '
            "tool calls, which the server refuses for it"
        )
    size = len(convert.dumps(tool.input_schema or {}).encode("utf-8"))
    if size > convert.MAX_SCHEMA_BYTES:
        return f"its input schema is {size} bytes, over the {convert.MAX_SCHEMA_BYTES}-byte limit"
    return None


def _definition_of(listing: Sequence[McpTool], tool: str) -> str | None:
    """The definition hash of the server's tool `tool` in a session's listing, or None when
    it was not listed."""
    found = next((t for t in listing if t.name == tool), None)
    return definition_hash(found) if found is not None else None


def _description(connection: str, description: str) -> str:
    """The registered description: `[MCP: conn]` first, clipped to what the registry takes (a
    server's description goes into every prompt that offers its tool)."""
    text = f"[MCP: {connection}] {description}".replace("\x00", "").rstrip()
    limit = convert.MAX_TOOL_DESCRIPTION_CHARS
    if len(text) <= limit:
        return text
    note = f"… (clipped from {len(text)} characters)"
    return text[: limit - len(note)] + note


def validate_config(config: ServerConfig) -> None:
    check_connection_name(config.name)
    if config.transport == "stdio" and not config.command:
        raise InvalidArgument(
            "a stdio connection needs a command",
            reason="MCP_CONFIG_INVALID",
            field_violations=[("server.command", "empty")],
        )
    if config.transport == "streamable_http" and not config.url.startswith(("http://", "https://")):
        raise InvalidArgument(
            f"a streamable HTTP connection needs an http(s) URL, got {redact_url(config.url)!r}",
            reason="MCP_CONFIG_INVALID",
            field_violations=[("server.url", "must start with http:// or https://")],
        )


class McpBridge:
    """All connections of one bridge process."""

    def __init__(
        self,
        store: ConnectionStore,
        sink: ToolSink,
        *,
        connect_timeout_s: float = 30.0,
        call_timeout_s: float = 120.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        hold_changed: bool = True,
        export_dir: Path | None = None,
        export_max_bytes: int = DEFAULT_EXPORT_MAX_BYTES,
        tools_changed_delay_s: float = TOOLS_CHANGED_DELAY_S,
        tools_changed_min_interval_s: float = TOOLS_CHANGED_MIN_INTERVAL_S,
        destructive_capability: str = "",
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        """`db_wait_s`: how long a stored connection's read or write may take before the
        call answers UNAVAILABLE (shared.db.engine.bounded_db_wait; TOOLMESH_DB_WAIT_S)."""
        self._store = store
        self._db_wait_s = db_wait_s
        # Registered as a required capability of every tool its server declares destructive
        # (annotations.required_capabilities); empty: no gating.
        self._destructive_capability = destructive_capability
        self._sink = sink
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._hold_changed = hold_changed
        self._export_dir = export_dir
        self._export_max_bytes = export_max_bytes
        self._tools_changed_delay_s = tools_changed_delay_s
        self._tools_changed_min_interval_s = tools_changed_min_interval_s
        self._connections: dict[str, LiveConnection] = {}
        # Per connection name, while anyone holds or awaits it (see _lock).
        self._locks: dict[str, _NamedLock] = {}
        self._naming = asyncio.Lock()  # see _register
        # Per connection: the task re-listing its tools after an announced change, and whether
        # another announcement came while it ran.
        self._relists: dict[LiveConnection, asyncio.Task[None]] = {}
        self._relist_again: set[LiveConnection] = set()

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """Hold the lock of the connection `name`. A lock is kept only while someone holds or
        awaits it: one per name ever used (each Connect, Disconnect or Reconnect, of names that
        never existed too) stayed for good."""
        entry = self._locks.get(name)
        if entry is None:
            entry = self._locks[name] = _NamedLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users and self._locks.get(name) is entry:
                del self._locks[name]

    def _new(self, config: ServerConfig) -> LiveConnection:
        return LiveConnection(
            config,
            on_open=self._register,
            on_tools_changed=self._tools_changed,
            connect_timeout_s=self._connect_timeout_s,
            backoff_s=self._backoff_s,
            backoff_max_s=self._backoff_max_s,
        )

    # --- connections ----------------------------------------------------------------------

    async def connect(self, config: ServerConfig) -> InventoryReport:
        """Open a session, list the tools, register them; the connection is stored."""
        validate_config(config)
        sdk.require_sdk()
        async with self._lock(config.name):
            if config.name in self._connections:
                raise AlreadyExists(
                    f"connection {config.name!r} exists; disconnect or reconnect it",
                    reason="MCP_CONNECTION_EXISTS",
                    metadata={"connection": config.name},
                )
            live = self._new(config)
            report = await live.start()
            assert report is not None
            try:
                await db_thread(self._db_wait_s, "the connection's write", self._store.save, config)
            except BaseException:
                # Not stored, so not connected: a running server and registered tools the
                # caller was told failed (and a retry refused as existing) were left behind.
                await self._abandon(live)
                raise
            self._connections[config.name] = live
            return report

    async def _abandon(self, live: LiveConnection) -> None:
        """Undo a connection that could not be stored: its tools deleted (best effort: the
        registry may be what failed), its server stopped."""
        async with live.registration:
            live.retire()
            try:
                await self._sink.delete([], live.config.created_by)
            except Exception as exc:  # noqa: BLE001 - the save's error is the one to report
                logger.warning(
                    "MCP connection %s was not stored, and its tools could not be removed: %s",
                    live.config.name,
                    exc,
                )
        await live.close()

    async def disconnect(self, name: str) -> list[str]:
        """Close the connection (reaping its process), soft-delete its tools, forget it."""
        async with self._lock(name):
            live = self._connections.pop(name, None)
            if live is None:
                raise NotFound(
                    f"no MCP connection named {name!r}",
                    reason="MCP_CONNECTION_NOT_FOUND",
                    metadata={"connection": name},
                )
            try:
                # Tools first: if the registry is down nothing changes and the caller retries.
                # Under the connection's registration lock, and retired before it is let go:
                # a server restarting meanwhile must not register its tools after the delete.
                async with live.registration:
                    removed = await self._sink.delete([], live.config.created_by)
                    live.retire()
            except BaseException:
                self._connections[name] = live
                raise
            await live.close()
            await db_thread(self._db_wait_s, "the connection's deletion", self._store.delete, name)
            return removed

    async def reconnect(self, name: str, config: ServerConfig | None = None) -> InventoryReport:
        """Re-open with the stored (or a new) config; reports added, removed, changed tools.
        When the new session cannot be opened, the connection is not lost with it: its previous
        config is opened again in the background (retrying with backoff, its tools answering
        UNAVAILABLE meanwhile, as after a crash) and the error is raised; so too when the new
        config was opened but could not be stored (what runs is always what a restart would
        bring back)."""
        if config is not None:
            validate_config(config)
            if config.name != name:
                raise InvalidArgument(
                    f"server.name {config.name!r} differs from name {name!r}",
                    field_violations=[("server.name", "must equal name")],
                )
        new_config_given = config is not None
        async with self._lock(name):
            old = self._connections.get(name)
            if old is None and config is None:
                loaded = await db_thread(self._db_wait_s, "the connections' read", self._store.load)
                stored = {c.name: c for c in loaded}
                config = stored.get(name)
            if old is None and config is None:
                raise NotFound(
                    f"no MCP connection named {name!r}",
                    reason="MCP_CONNECTION_NOT_FOUND",
                    metadata={"connection": name},
                )
            new_config = config or (old.config if old else None)
            assert new_config is not None
            if old is not None:
                await old.close()
                self._connections.pop(name, None)
            live = self._new(new_config)
            opened = False
            try:
                report = await live.start()
                assert report is not None
                opened = True
                if new_config_given and (old is None or new_config != old.config):
                    await db_thread(
                        self._db_wait_s, "the connection's write", self._store.save, new_config
                    )
            except BaseException:
                if opened:
                    # Opened but not stored: a bridge restart would bring back the stored
                    # config, so what runs must not differ from it.
                    if old is None:
                        await self._abandon(live)
                    else:  # the old config's session, re-opened below, registers its tools
                        async with live.registration:
                            live.retire()
                        await live.close()
                if old is not None:
                    # The old session is closed (a server may not run twice): its config,
                    # still the stored one, is re-opened rather than the connection dropped
                    # while its tools stay offered.
                    fallback = self._new(old.config)
                    self._connections[name] = fallback
                    await fallback.start(retry_first=True)
                raise
            self._connections[name] = live
            return report

    def list_connections(self) -> list[ConnectionInfo]:
        return [self._connections[n].info() for n in sorted(self._connections)]

    async def restore(self) -> list[str]:
        """Re-establish every stored connection in the background (each retries with backoff
        until its server answers); returns their names."""
        configs = await asyncio.to_thread(self._store.load)
        for config in configs:
            if config.name in self._connections:
                continue
            live = self._new(config)
            self._connections[config.name] = live
            await live.start(retry_first=True)
        return [c.name for c in configs]

    async def stop(self) -> None:
        """Close every connection (shutdown): stored rows stay, tools stay registered."""
        lives = list(self._connections.values())
        self._connections.clear()
        for live in lives:
            live.retire()  # no announcement starts another re-listing
        relists = list(self._relists.values())
        for task in relists:
            task.cancel()
        # The re-listings awaited too: one left running (or pending) outlives the bridge.
        await asyncio.gather(*relists, *(live.close() for live in lives), return_exceptions=True)

    # --- announced tool changes ------------------------------------------------------------

    def _tools_changed(self, live: LiveConnection) -> None:
        """The server says its tools changed: list and register them again, soon (see
        TOOLS_CHANGED_DELAY_S and TOOLS_CHANGED_MIN_INTERVAL_S), once however many
        announcements arrive meanwhile."""
        task = self._relists.get(live)
        if task is not None and not task.done():
            self._relist_again.add(live)
            return
        task = asyncio.get_running_loop().create_task(
            self._relist(live), name=f"mcp-relist-{live.config.name}"
        )
        self._relists[live] = task
        task.add_done_callback(lambda _: self._relists.pop(live, None))

    async def _relist(self, live: LiveConnection) -> None:
        """Re-list and register a connection's tools as a Reconnect does (changed definitions
        held in testing, vanished tools soft-deleted), under the connection's lock. A listing
        or a registration that fails (the registry down, the server's tools/list failing) is
        tried again with backoff, up to RELIST_BACKOFF_MAX_S apart, until it succeeds or the
        connection goes; a server down meanwhile is left to its supervisor, which lists the
        tools when it reopens."""
        failures = 0
        try:
            while True:
                interval = self._tools_changed_min_interval_s * 2**failures
                due = max(
                    time.monotonic() + self._tools_changed_delay_s,
                    live.last_relist_at + min(interval, RELIST_BACKOFF_MAX_S),
                )
                await asyncio.sleep(due - time.monotonic())
                self._relist_again.discard(live)
                outcome = await self._relist_once(live)
                if outcome == "gone":
                    return
                failures = failures + 1 if outcome == "failed" else 0
                if not failures and live not in self._relist_again:
                    return
        finally:
            self._relist_again.discard(live)

    async def _relist_once(self, live: LiveConnection) -> str:
        """One re-listing: "done", "failed" (worth another try) or "gone" (the connection was
        closed or replaced, or its server is down)."""
        name = live.config.name
        started = live.last_relist_at = time.monotonic()
        error_type = ""
        outcome = "done"
        # A trace of its own: the task was made in whatever context the SDK's reader had.
        with tracer().start_as_current_span(
            "tools/list",
            context=otel_context.Context(),
            kind=SpanKind.CLIENT,
            attributes=span_attributes(
                mcp__method__name="tools/list",
                mcp__session__id=live.session_id,
                toolmesh__mcp__connection=name,
                toolmesh__mcp__trigger="notifications/tools/list_changed",
            ),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                # One not yet the bridge's (Connect still storing it) is found under the lock
                # below, which Connect holds until then.
                if self._gone(live):
                    return "gone"
                client = live.client()
                # Listed outside the lock: a server slow to list must not hold up a Disconnect
                # or a Reconnect of its connection.
                async with asyncio.timeout(self._connect_timeout_s):
                    tools = await list_tools(client, fresh=True)
                async with self._lock(name), live.registration:
                    # A session since restarted was listed (and registered) by its supervisor:
                    # this listing is older than that one.
                    if self._connections.get(name) is not live or not live.is_current(client):
                        return "gone"
                    report = await self._register(live, tools)
                    live.tools = tools
                    live.tool_names = list(report.tool_names)
                    live.tool_list_changes += 1
                    live.last_tool_change = report
            except Exception as exc:  # noqa: BLE001 - a failed re-listing keeps the old tools
                if self._gone(live):  # its session closed under it: nothing to retry
                    return "gone"
                outcome = "failed"
                error_type = getattr(exc, "reason", "") or type(exc).__name__
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
                logger.warning(
                    "MCP connection %s announced new tools; listing them failed (will retry): %s",
                    name,
                    getattr(exc, "message", None) or sdk.leaf_exception(exc),
                )
            else:
                span.set_attributes(
                    {
                        "toolmesh.mcp.tools.added": len(report.added),
                        "toolmesh.mcp.tools.removed": len(report.removed),
                        "toolmesh.mcp.tools.changed": len(report.changed),
                    }
                )
                logger.info(
                    "MCP connection %s changed its tools: added %s, removed %s, changed %s",
                    name,
                    report.added or "none",
                    report.removed or "none",
                    report.changed or "none",
                )
        record_mcp_operation("tools/list", time.monotonic() - started, error_type=error_type)
        return outcome

    def _gone(self, live: LiveConnection) -> bool:
        """Whether a re-listing of `live` has nothing left to do: the connection was closed or
        replaced, or its server went down (its supervisor lists the tools when it reopens)."""
        if live.closing or self._connections.get(live.config.name) not in (live, None):
            return True
        try:
            live.client()
        except Unavailable:
            return True
        return False

    # --- registration ---------------------------------------------------------------------

    async def _register(self, live: LiveConnection, tools: list[McpTool]) -> InventoryReport:
        """_register_names, one connection at a time: names are chosen against the other
        connections' registered tools, so two connections registering at once (`a_b` with a
        tool `c`, `a` with a tool `b_c`) both took `mcp_a_b_c`, the second overwriting the
        first's."""
        async with self._naming:
            return await self._register_names(live, tools)

    async def _register_names(self, live: LiveConnection, tools: list[McpTool]) -> InventoryReport:
        """Register a listing: names, `[MCP: conn]` descriptions, pinned definition hashes,
        each server tool's title and hints, and the destructive capability gate. A changed
        definition (annotations included: a tool turning destructive is a change) is held in
        `testing` (with hold_changed); tools gone from the server are soft-deleted. What an
        administrator set on a registered tool survives (ToolSink.upsert)."""
        config = live.config
        tools, skipped = _distinct_named(tools)
        stored = await self._sink.connection_tools(config.created_by)
        live_rows = {s.name: s for s in stored if not s.deleted}
        by_name = {s.name: s for s in stored}
        previous: dict[str, str] = {}
        for s in stored:
            parsed = parse_implementation(s.implementation)
            if parsed is not None and parsed[0] == config.name:
                previous.setdefault(parsed[1], s.name)
        taken = {t.name for t in await self._sink.live_tools() if t.created_by != config.created_by}
        names, renamed = assign_names(
            config.name, [t.name for t in tools], taken=taken, previous=previous
        )
        report = InventoryReport(renamed=renamed, skipped=skipped)
        registrations: list[ToolRegistration] = []
        for tool in sorted(tools, key=lambda t: names[t.name]):
            name = names[tool.name]
            problem = _unregistrable(tool)
            if problem is not None:
                logger.warning("MCP connection %s: tool %r skipped: %s", config.name, name, problem)
                report.skipped.append(f"{convert.clip(tool.name, 100)}: {problem}")
                continue
            digest = definition_hash(tool)
            annotations = annotations_of(tool)
            old = by_name.get(name)
            status = "approved"
            if name not in live_rows:
                report.added.append(name)
            if old is not None and old.definition_hash:
                if old.definition_hash != digest:
                    report.changed.append(name)
                    if self._hold_changed:
                        status = "testing"
                        report.held.append(name)
                else:
                    status = old.status
            registrations.append(
                ToolRegistration(
                    name=name,
                    description=_description(config.name, tool.description),
                    input_schema=tool.input_schema or {"type": "object"},
                    implementation=implementation_of(config.name, tool.name),
                    created_by=config.created_by,
                    tenant_id=config.tenant_id,
                    status=status,
                    definition_hash=digest,
                    # What a new row gets: a stored one keeps its own (ToolSink.upsert).
                    enabled=old.enabled if old is not None else True,
                    annotations=annotations,
                    required_capabilities=required_capabilities(
                        annotations, self._destructive_capability
                    ),
                )
            )
            report.tool_names.append(name)
        gone = sorted(set(live_rows) - set(report.tool_names))
        if gone:
            report.removed = await self._sink.delete(gone, config.created_by)
        if registrations:
            await self._sink.upsert(registrations)
        if report.held:
            logger.warning(
                "MCP connection %s: changed tool definitions held in testing until approved: %s",
                config.name,
                ", ".join(report.held),
            )
        return report

    # --- calls ----------------------------------------------------------------------------

    async def call_tool(
        self,
        connection: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float = 0.0,
        on_progress: ProgressSink | None = None,
    ) -> CallOutcome:
        """Proxy one call. Connection problems raise (NotFound, Unavailable); whatever the tool
        does — including failing, timing out or answering garbage — is an envelope."""
        live = self._connections.get(connection)
        if live is None:
            raise NotFound(
                f"no MCP connection named {connection!r}",
                reason="MCP_CONNECTION_NOT_FOUND",
                metadata={"connection": connection},
            )
        client = live.client()
        timeout = timeout_s if timeout_s > 0 else self._call_timeout_s
        transport = "pipe" if live.config.transport == "stdio" else "tcp"
        attrs = span_attributes(
            mcp__method__name="tools/call",
            mcp__session__id=live.session_id,
            mcp__protocol__version=live.identity.get("protocol_version"),
            gen_ai__tool__name=tool,
            gen_ai__operation__name="execute_tool",
            network__transport=transport,
            network__protocol__name="http" if transport == "tcp" else None,
            server__address=url_host(live.config.url) or None,
            toolmesh__mcp__connection=connection,
        )

        started = time.monotonic()
        with tracer().start_as_current_span(
            f"tools/call {tool}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:

            async def progress(value: float, total: float | None, message: str | None) -> None:
                # On the trace whether or not a caller listens (CallToolUnary relays none). The
                # SDK runs this in a task of its own: it may come after the result (span ended).
                if span.is_recording():
                    span.add_event(
                        "mcp.progress",
                        {"progress": value, "total": total or 0.0, "message": message or ""},
                    )
                if on_progress is not None:
                    await on_progress(ProgressUpdate(value, total, message))

            # Baggage stays inside the mesh: the SDK injects the current context into _meta.
            token = otel_context.attach(baggage.clear())
            listed = live.tools  # this session's listing (a re-opened one gets a new list)
            try:
                try:
                    outcome = await self._invoke(
                        live, client, live.session_id, tool, arguments, timeout, progress
                    )
                except _SessionLost:
                    # Refused before it ran: safe to send again, on the new session — unless
                    # the tool is no longer what was approved (the server came back changed).
                    span.add_event("mcp.session.reopen", {"mcp.session.id": live.session_id})
                    left = timeout - (time.monotonic() - started)
                    client = await live.reopened(client, min(left, self._connect_timeout_s))
                    if client is None:
                        raise Unavailable(
                            f"MCP server {connection!r} no longer knows this bridge's session "
                            "(it restarted or expired it) and a new session is not open yet; "
                            "retry shortly",
                            reason="MCP_SERVER_UNAVAILABLE",
                            metadata={"connection": connection},
                        ) from None
                    span.set_attribute("mcp.session.id", live.session_id)
                    if self._hold_changed and _definition_of(live.tools, tool) != _definition_of(
                        listed, tool
                    ):
                        outcome = CallOutcome(
                            Err(
                                f"MCP tool {tool!r} of {connection!r} was not run: its server "
                                "came back with a different definition of it (or without it), "
                                "which is held for an administrator's approval",
                                err_kind="tool_changed",
                            )
                        )
                    else:
                        left = timeout - (time.monotonic() - started)
                        outcome = await self._invoke(
                            live,
                            client,
                            live.session_id,
                            tool,
                            arguments,
                            max(left, 0.001),
                            progress,
                        )
            except Unavailable as exc:
                span.set_attribute("error.type", exc.reason)
                span.set_status(Status(StatusCode.ERROR, exc.message))
                record_mcp_operation(
                    "tools/call",
                    time.monotonic() - started,
                    tool=tool,
                    transport=transport,
                    error_type=exc.reason,
                )
                raise
            finally:
                otel_context.detach(token)
            env = outcome.envelope
            error_type = ""
            if isinstance(env, Err):
                error_type = env.err_kind
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, env.message[:200]))
        record_mcp_operation(
            "tools/call",
            time.monotonic() - started,
            tool=tool,
            transport=transport,
            error_type=error_type,
        )
        return outcome

    async def _invoke(
        self,
        live: LiveConnection,
        client: Any,
        session: str,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        progress: Callable[[float, float | None, str | None], Awaitable[None]],
    ) -> CallOutcome:
        name = live.config.name
        sent_at = time.monotonic()
        try:
            result = await client.call_tool(
                tool, arguments, read_timeout_seconds=timeout, progress_callback=progress
            )
        except Exception as exc:
            exc = sdk.leaf_exception(exc)  # type: ignore[assignment]
            code = getattr(exc, "code", None)
            kind = type(exc).__name__
            if kind == "MCPError" and sdk.local_timeout(exc):
                return CallOutcome(
                    Err(
                        f"MCP tool {tool!r} of {name!r} did not answer within {timeout:g}s "
                        "(the call was cancelled on the server)",
                        err_kind="timeout",
                    )
                )
            if (kind == "MCPError" and sdk.local_closed(exc)) or sdk.session_closed(client):
                live.mark_broken()
                raise Unavailable(
                    f"MCP server {name!r} went away during the call to {tool!r}; "
                    + _RECOVERING[live.config.transport],
                    reason="MCP_SERVER_UNAVAILABLE",
                    metadata={"connection": name},
                ) from None
            if kind == "MCPError" and sdk.local_stream_lost(exc) and not live.forgot(session):
                # Sent, and perhaps run: not sent again. The next call finds out whether the
                # session outlived the stream (else it is re-opened, see _SessionLost).
                live.mark_broken()
                said = sdk.with_http_failure(str(exc), live.http_failure_since(sent_at))
                raise Unavailable(
                    f"MCP server {name!r} stopped answering during the call to {tool!r} (its "
                    f"response stream ended: {said}); the tool may or may not have run — check "
                    f"before calling it again; {_RECOVERING[live.config.transport]}",
                    reason="MCP_SERVER_UNAVAILABLE",
                    metadata={"connection": name},
                ) from None
            if live.forgot(session):
                raise _SessionLost from None
            if kind == "MCPError" and code == sdk.PARSE_ERROR:
                return CallOutcome(
                    Err(
                        f"MCP server {name!r} returned a malformed result for {tool!r}: {exc}",
                        err_kind="malformed_result",
                    )
                )
            if kind == "MCPError":
                said = sdk.with_http_failure(str(exc), live.http_failure_since(sent_at))
                return CallOutcome(
                    Err(f"MCP server {name!r} rejected the call to {tool!r}: {said}", "mcp_error")
                )
            if kind == "ValidationError":
                first = str(exc).splitlines()
                return CallOutcome(
                    Err(
                        f"MCP server {name!r} returned a malformed result for {tool!r}: "
                        + " ".join(first[:3]),
                        err_kind="malformed_result",
                    )
                )
            logger.exception("MCP call %s/%s failed", name, tool)
            return CallOutcome(
                Err(f"MCP call {tool!r} of {name!r} failed: {kind}: {exc}", "mcp_error")
            )
        envelope = result_to_envelope(
            result,
            connection=name,
            tool=tool,
            export_dir=self._export_dir,
            export_max_bytes=self._export_max_bytes,
        )
        structured = getattr(result, "structured_content", None)
        return CallOutcome(envelope, structured if isinstance(structured, dict) else None)
