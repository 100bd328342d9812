"""The MCP bridge's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.mcp_bridge.core import CallOutcome, McpBridge
from services.mcp_bridge.model import (
    ConnectionInfo,
    InventoryReport,
    ProgressUpdate,
    ServerConfig,
)
from shared import convert
from shared.contract import envelope_to_tool_result
from shared.errors import InvalidArgument
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)

TRANSPORTS = {mpb.TRANSPORT_STDIO: "stdio", mpb.TRANSPORT_STREAMABLE_HTTP: "streamable_http"}
TRANSPORT_VALUES = {v: k for k, v in TRANSPORTS.items()}
STATES = {
    "connected": mpb.CONNECTION_STATE_CONNECTED,
    "connecting": mpb.CONNECTION_STATE_CONNECTING,
    "failed": mpb.CONNECTION_STATE_FAILED,
    "disconnected": mpb.CONNECTION_STATE_DISCONNECTED,
}


def config_from_pb(m: mpb.ServerConfig) -> ServerConfig:
    transport = TRANSPORTS.get(m.transport)
    if transport is None:
        raise InvalidArgument(
            "server.transport must be TRANSPORT_STDIO or TRANSPORT_STREAMABLE_HTTP",
            reason="MCP_CONFIG_INVALID",
            field_violations=[("server.transport", "unspecified")],
        )
    return ServerConfig(
        name=m.name,
        transport=transport,  # type: ignore[arg-type]
        command=m.command,
        args=tuple(m.args),
        env=dict(m.env),
        url=m.url,
        headers=dict(m.headers),
        tenant_id=m.tenant_id or "*",
    )


def config_to_pb(c: ServerConfig) -> mpb.ServerConfig:
    return mpb.ServerConfig(
        name=c.name,
        transport=TRANSPORT_VALUES[c.transport],
        command=c.command,
        args=list(c.args),
        env=dict(c.env),
        url=c.url,
        headers=dict(c.headers),
        tenant_id=c.tenant_id,
    )


def connection_to_pb(c: ConnectionInfo) -> mpb.Connection:
    return mpb.Connection(
        server=config_to_pb(c.server),
        state=STATES.get(c.state, mpb.CONNECTION_STATE_UNSPECIFIED),
        server_name=c.server_name,
        server_version=c.server_version,
        protocol_version=c.protocol_version,
        tool_names=list(c.tool_names),
        last_error=c.last_error,
        session_id=c.session_id,
        restarts=c.restarts,
        tool_list_changes=c.tool_list_changes,
        last_tool_change=report_to_pb(c.last_tool_change) if c.last_tool_change else None,
    )


def report_to_pb(report: InventoryReport) -> mpb.ReconnectResponse:
    return mpb.ReconnectResponse(
        added=report.added,
        removed=report.removed,
        changed=report.changed,
        tool_names=report.tool_names,
        renamed=report.renamed,
    )


def _progress_pb(p: ProgressUpdate) -> mpb.CallToolResponse:
    return mpb.CallToolResponse(
        progress=mpb.Progress(progress=p.progress, total=p.total or 0.0, message=p.message or "")
    )


def _require_name(name: str, field: str = "name") -> None:
    if not name:
        raise InvalidArgument(f"{field} is required", field_violations=[(field, "empty")])


def _call_arguments(request: mpb.CallToolRequest | mpb.CallToolUnaryRequest) -> dict[str, Any]:
    """The checked arguments of a CallTool or CallToolUnary request (InvalidArgument if not)."""
    _require_name(request.connection, "connection")
    _require_name(request.tool, "tool")
    convert.check_ids(convert.context_ids(request.context))
    return convert.parse_json_object(request.arguments_json, "arguments_json")


def _result_pb(outcome: CallOutcome) -> pb.ToolResult:
    return convert.tool_result_to_pb(envelope_to_tool_result(outcome.envelope))


class LatestProgress:
    """The progress of one CallTool stream not yet sent: a single slot, as progress is a state.
    An update replaces the one waiting (counted in `superseded`), so what waits is one update
    whatever the server's rate and the caller's pace, and `put` never waits. Used on the event
    loop only (the SDK runs progress callbacks there)."""

    def __init__(self) -> None:
        self._latest: ProgressUpdate | None = None
        # Set when an update waits (or the stream should look again); cleared by the stream.
        self.ready = asyncio.Event()
        self.superseded = 0

    def put(self, update: ProgressUpdate) -> None:
        if self._latest is not None:
            self.superseded += 1
        self._latest = update
        self.ready.set()

    def take(self) -> ProgressUpdate | None:
        update, self._latest = self._latest, None
        return update


class McpBridgeServicer(mcp_bridge_pb2_grpc.McpBridgeServiceServicer):
    def __init__(self, core: McpBridge) -> None:
        self._core = core

    async def Connect(
        self, request: mpb.ConnectRequest, context: grpc.aio.ServicerContext
    ) -> mpb.ConnectResponse:
        report: InventoryReport = await self._core.connect(config_from_pb(request.server))
        return mpb.ConnectResponse(
            tools_discovered=len(report.tool_names),
            tool_names=report.tool_names,
            renamed=report.renamed,
            held=report.held,
            skipped=report.skipped,
        )

    async def Disconnect(
        self, request: mpb.DisconnectRequest, context: grpc.aio.ServicerContext
    ) -> mpb.DisconnectResponse:
        _require_name(request.name)
        return mpb.DisconnectResponse(removed_tools=await self._core.disconnect(request.name))

    async def Reconnect(
        self, request: mpb.ReconnectRequest, context: grpc.aio.ServicerContext
    ) -> mpb.ReconnectResponse:
        _require_name(request.name)
        config = config_from_pb(request.server) if request.HasField("server") else None
        return report_to_pb(await self._core.reconnect(request.name, config))

    async def ListConnections(
        self, request: mpb.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> mpb.ListConnectionsResponse:
        return mpb.ListConnectionsResponse(
            connections=[connection_to_pb(c) for c in self._core.list_connections()]
        )

    async def CallTool(
        self, request: mpb.CallToolRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[mpb.CallToolResponse]:
        """The call's progress notifications as they arrive, then its result. The MCP SDK hands
        each notification to the progress callback in a task of its own, so the callback must
        never wait for the caller (a waiting callback would leave one task per notification):
        it puts the update in a LatestProgress slot, and a caller that reads slowly gets the
        latest update rather than every one (the last one always, before the result). A caller
        that goes away (cancelled or deadline) cancels the request on the session."""
        arguments = _call_arguments(request)
        relay = LatestProgress()

        async def on_progress(update: ProgressUpdate) -> None:
            relay.put(update)

        call = asyncio.ensure_future(
            self._core.call_tool(
                request.connection,
                request.tool,
                arguments,
                timeout_s=request.timeout_seconds,
                on_progress=on_progress,
            )
        )
        call.add_done_callback(lambda _: relay.ready.set())
        try:
            while True:
                relay.ready.clear()
                update = relay.take()
                if update is not None:
                    yield _progress_pb(update)
                elif call.done():
                    break
                else:
                    await relay.ready.wait()
            outcome = call.result()
        finally:
            if relay.superseded:
                logger.debug(
                    "CallTool %s/%s: %d progress notifications superseded before they were sent",
                    request.connection,
                    request.tool,
                    relay.superseded,
                )
            if not call.done():
                # The caller went away (cancelled or deadline): cancel the call on the session.
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        response = mpb.CallToolResponse(result=_result_pb(outcome))
        if outcome.structured is not None:
            response.structured_content_json = convert.dumps(outcome.structured)
            response.structured_content.CopyFrom(convert.to_struct(outcome.structured))
        yield response

    async def CallToolUnary(
        self, request: mpb.CallToolUnaryRequest, context: grpc.aio.ServicerContext
    ) -> mpb.CallToolUnaryResponse:
        # No progress sink: the core still records progress notifications on the MCP span. A
        # caller that goes away cancels this handler, and with it the request on the session.
        outcome = await self._core.call_tool(
            request.connection,
            request.tool,
            _call_arguments(request),
            timeout_s=request.timeout_seconds,
        )
        response = mpb.CallToolUnaryResponse(result=_result_pb(outcome))
        if outcome.structured is not None:
            response.structured_content_json = convert.dumps(outcome.structured)
        return response
