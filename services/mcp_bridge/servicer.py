"""The MCP bridge's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio
import contextlib
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
        arguments = _call_arguments(request)
        # Progress updates and the end of the call arrive on one queue (None: the call is
        # over), so waiting for the next message is a single await, with no waiter task.
        events: asyncio.Queue[ProgressUpdate | None] = asyncio.Queue()

        async def on_progress(update: ProgressUpdate) -> None:
            events.put_nowait(update)

        async def run() -> CallOutcome:
            try:
                return await self._core.call_tool(
                    request.connection,
                    request.tool,
                    arguments,
                    timeout_s=request.timeout_seconds,
                    on_progress=on_progress,
                )
            finally:
                events.put_nowait(None)

        call = asyncio.ensure_future(run())
        try:
            while (update := await events.get()) is not None:
                yield _progress_pb(update)
            outcome = call.result()
        finally:
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
