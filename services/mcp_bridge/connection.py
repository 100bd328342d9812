"""One live MCP connection: a supervisor task that owns the SDK client (anyio scopes must be
entered and left in one task), detects a crashed server or a broken transport, and re-opens it
with exponential backoff. Calls from other tasks go through `call`; while the server is down
they fail with UNAVAILABLE. Closing the client reaps a stdio server's process tree."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from services.mcp_bridge import sdk
from services.mcp_bridge.model import (
    ConnectionInfo,
    ConnectionStateName,
    InventoryReport,
    McpTool,
    ServerConfig,
)
from shared.errors import Unavailable

logger = logging.getLogger(__name__)

# How often the supervisor checks whether the session's transport has ended.
WATCH_INTERVAL_S = 0.2
CLOSE_TIMEOUT_S = 10.0

REOPEN_POLL_S = 0.05  # how often a call waiting for a new session looks for it
# A session that served this long resets the restart backoff when it ends: a server that crashes
# once a day restarts after the first delay, not the longest; one crashing as soon as it is up
# still backs off further each time.
STABLE_SESSION_S = 30.0
# A server that forgets our session again within this many seconds of the last time gets the
# usual backoff before the next one (say, a load balancer without sticky sessions).
FORGOTTEN_AGAIN_S = 5.0

OnOpen = Callable[["LiveConnection", list[McpTool]], Awaitable[InventoryReport]]
OnToolsChanged = Callable[["LiveConnection"], None]


class _SessionForgotten(ConnectionError):
    """The streamable HTTP server answered that it does not know our session."""


class LiveConnection:
    """The supervisor of one connection. `start()` returns once the first session is open and
    its tools are registered (or raises); with `retry_first` (restoring at start-up) it returns
    at once and keeps retrying in the background. When the server says its tools changed (a
    `notifications/tools/list_changed`, or an event on the `subscriptions/listen` stream the
    supervisor holds open for a modern server that announces changes), `on_tools_changed` is
    called; it must not block."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        on_open: OnOpen,
        on_tools_changed: OnToolsChanged | None = None,
        connect_timeout_s: float,
        backoff_s: float,
        backoff_max_s: float,
    ) -> None:
        self.config = config
        self.state: ConnectionStateName = "connecting"
        self.last_error = ""
        self.restarts = 0
        self.identity: dict[str, str] = {}
        self.tools: list[McpTool] = []
        self.tool_names: list[str] = []
        self.tool_list_changes = 0
        self.last_tool_change: InventoryReport | None = None
        self.last_relist_at = float("-inf")  # time.monotonic() of the last re-listing
        self._on_open = on_open
        self._on_tools_changed = on_tools_changed
        self._connect_timeout_s = connect_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._client: Any = None
        self._http = sdk.HttpState()
        self._closing = asyncio.Event()
        self._broken = asyncio.Event()
        self._forgotten_at = float("-inf")  # time.monotonic() the server last forgot a session
        self._opened_at: float | None = None  # when the current session began to serve
        self.last_backoff_s = 0.0  # the last wait before re-opening, for ListConnections/tests
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Future[InventoryReport] | None = None
        # Held while a listing of this connection is registered (the supervisor's on each
        # open, a re-listing's) and while Disconnect soft-deletes its tools: a re-listing of an
        # old session registered after a restarted server's own listing offered tools the
        # server no longer had, and a restarted server's registration landing after
        # Disconnect's delete brought a forgotten connection's tools back.
        self.registration = asyncio.Lock()
        # A change announced while a session was still being opened (its tools listed and
        # registered): announced once the session is up, or the bridge, not yet owning the
        # connection, dropped it.
        self._announced_while_opening = False

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, *, retry_first: bool = False) -> InventoryReport | None:
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        self._task = asyncio.create_task(
            self._supervise(retry_first), name=f"mcp-connection-{self.config.name}"
        )
        if retry_first:
            return None
        try:
            return await asyncio.shield(self._first)
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the session (a stdio server's process tree is reaped) and stop supervising."""
        self._closing.set()
        task = self._task
        if task is None or task.done():
            self.state = "disconnected"
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
        except TimeoutError:
            logger.warning("connection %s did not close in time; cancelling", self.config.name)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.state = "disconnected"

    @property
    def closing(self) -> bool:
        """Whether the connection was closed (or retired): nothing of it is registered again."""
        return self._closing.is_set()

    def retire(self) -> None:
        """Stop taking announcements and registering reopened sessions, ahead of `close()`
        (Disconnect, under `registration`, once the tools are deleted)."""
        self._closing.set()

    def is_current(self, client: Any) -> bool:
        """Whether `client` is still the connection's open session (not one since replaced by a
        restart)."""
        return client is self._client and self.state == "connected"

    async def _supervise(self, retry_first: bool) -> None:
        attempt = 0
        opened_once = False
        while not self._closing.is_set():
            self._broken.clear()
            self.state = "connecting"
            forgotten = False
            opening = time.monotonic()
            self._opened_at = None
            try:
                await self._session(first=not opened_once)
            except Exception as exc:  # noqa: BLE001 - the supervisor's top level: record, retry
                if self._opened_at is not None:
                    opened_once = True
                    if time.monotonic() - self._opened_at >= STABLE_SESSION_S:
                        attempt = 0  # it served a while: back off from the start again
                leaf = sdk.leaf_exception(exc)  # through the SDK's task groups
                if isinstance(leaf, _SessionForgotten):
                    # The server is up but lost our session: a new one at once — unless it
                    # forgot the previous one too a moment ago (then the usual backoff).
                    now = time.monotonic()
                    forgotten = now - self._forgotten_at >= FORGOTTEN_AGAIN_S
                    self._forgotten_at, self.last_error = now, str(leaf)
                    logger.warning("MCP connection %s: %s", self.config.name, leaf)
                else:
                    error = sdk.connect_error(self.config, exc, self._http.failure_since(opening))
                    self.last_error = error.message
                    if self._first is not None and not self._first.done() and not retry_first:
                        self._first.set_exception(error)
                        self.state = "failed"
                        return
                    logger.warning("MCP connection %s failed: %s", self.config.name, error.message)
            finally:
                self._client = None
                self._http.session_id = ""
            if self._closing.is_set():
                break
            self.state = "failed"
            if forgotten:
                self.restarts += 1
                continue
            delay = min(self._backoff_s * (2**attempt), self._backoff_max_s)
            self.last_backoff_s = delay
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
            if not self._closing.is_set():
                self.restarts += 1
        self.state = "disconnected"

    async def _session(self, *, first: bool) -> None:
        self._announced_while_opening = False
        async with AsyncExitStack() as stack:
            async with asyncio.timeout(self._connect_timeout_s):
                client = await sdk.open_client(self.config, stack, self._http, self._tools_changed)
                tools = await list_tools(client)
            self.identity = dict(sdk.server_identity(client))
            async with self.registration:
                if self.closing:
                    return  # disconnected meanwhile: its tools are deleted, keep them so
                self.tools = tools
                report = await self._on_open(self, tools)
                self.tool_names = list(report.tool_names)
                self._client = client
                self.state = "connected"
                self._opened_at = time.monotonic()
            self.last_error = ""
            if self._first is not None and not self._first.done():
                self._first.set_result(report)
            elif not first:
                logger.info("MCP connection %s re-established", self.config.name)
            if self._announced_while_opening:
                self._tools_changed()
            listener: asyncio.Task[None] | None = None
            if sdk.uses_listen(client) and sdk.announces_tool_changes(client):
                listener = asyncio.create_task(
                    sdk.listen_for_tool_changes(client, self._tools_changed),
                    name=f"mcp-listen-{self.config.name}",
                )
            try:
                await self._watch(client)
            finally:
                if listener is not None:
                    listener.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await listener

    def _tools_changed(self) -> None:
        if self._on_tools_changed is None or self.closing:
            return
        if self.state != "connected":  # the session is still opening: see _session
            self._announced_while_opening = True
            return
        self._announced_while_opening = False
        self._on_tools_changed(self)

    async def _watch(self, client: Any) -> None:
        while not self._closing.is_set():
            if self._http.session_lost:
                self._client = None
                raise _SessionForgotten(
                    f"the server no longer knows session {self._http.lost} (it restarted or "
                    "expired it); opening a new one"
                )
            if self._broken.is_set() or sdk.session_closed(client):
                self._client = None
                raise ConnectionError(f"MCP server {self.config.name!r} went away")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), WATCH_INTERVAL_S)

    # --- calls ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._http.session_id

    def client(self) -> Any:
        """The open client, or Unavailable naming the connection's state."""
        client = self._client
        if client is None or self.state != "connected" or sdk.session_closed(client):
            detail = f": {self.last_error}" if self.last_error else ""
            raise Unavailable(
                f"MCP server {self.config.name!r} is {self.state}{detail}; retry shortly",
                reason="MCP_SERVER_UNAVAILABLE",
                metadata={"connection": self.config.name, "state": self.state},
            )
        return client

    def mark_broken(self) -> None:
        """A call saw the transport end: restart the server now."""
        self._broken.set()

    def http_failure_since(self, started: float) -> str:
        """The HTTP error status the server answered since `started` (time.monotonic()), as
        a line of text, or ""."""
        return self._http.failure_since(started)

    def forgot(self, session_id: str) -> bool:
        """Whether the server answered that it no longer knows the HTTP session `session_id`
        (the supervisor then opens a new one)."""
        return bool(session_id) and self._http.lost == session_id

    async def reopened(self, old: Any, timeout_s: float) -> Any | None:
        """The session that replaced `old` once the supervisor has opened it, or None when it
        is not open within `timeout_s` (or the connection is closing)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._closing.is_set():
            client = self._client
            if client is not None and client is not old and self.state == "connected":
                return client
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), min(REOPEN_POLL_S, left))
        return None

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            server=self.config.redacted(),
            state=self.state,
            server_name=self.identity.get("name", ""),
            server_version=self.identity.get("version", ""),
            protocol_version=self.identity.get("protocol_version", ""),
            tool_names=tuple(self.tool_names),
            last_error=self.last_error,
            session_id=self.session_id,
            restarts=self.restarts,
            tool_list_changes=self.tool_list_changes,
            last_tool_change=self.last_tool_change,
        )


async def list_tools(client: Any, *, fresh: bool = False) -> list[McpTool]:
    """Every page of the server's tool listing; `fresh` skips the SDK's response cache (a
    modern server's listing may be cached for its ttlMs)."""
    tools: list[McpTool] = []
    cursor: str | None = None
    for _ in range(100):  # a server paging forever is cut off
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if fresh else "use")
        tools.extend(McpTool(**sdk.tool_from_sdk(t)) for t in page.tools)
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            break
    return tools
