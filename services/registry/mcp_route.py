"""The registry's route for `tool_type="mcp"`: a ToolExecutor that proxies the call to the
mcp_bridge service (`implementation` is `mcp:<connection>:<tool>`). A call whose context has a
progress sink (a streaming caller of ExecuteToolStream) goes over the CallTool stream: progress
notifications arrive as stream messages and are handed to the sink, the final message is the
result. Any other call goes over the unary CallToolUnary, which costs less than a stream; the
bridge records progress notifications on its MCP span either way. Cancelling the registry call
cancels the RPC, and the bridge cancels the request on the MCP session."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.registry.context import ToolContext
from services.registry.model import ToolDef
from services.registry.servicer import context_to_pb
from shared import convert
from shared.clients import CHANNEL_OPTIONS, open_channel
from shared.contract import Err, ToolResult, envelope_to_tool_result
from shared.errors import Unavailable
from shared.rpc_errors import from_rpc_error
from shared.telemetry.tracing import inject_metadata, tracer
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)

_SERVICE = "toolmesh.mcp_bridge.v1.McpBridgeService"


def _span_attributes(method: str) -> dict[str, str]:
    return {
        "rpc.system": "grpc",
        "rpc.service": _SERVICE,
        "rpc.method": method,
        "peer.service": "mcp_bridge",
    }


_STREAM_ATTRIBUTES = _span_attributes("CallTool")
_UNARY_ATTRIBUTES = _span_attributes("CallToolUnary")
# Extra room for the bridge to answer a timed-out call with its own Err before the deadline.
_DEADLINE_SLACK_S = 10.0
# A restarted bridge is reachable again within a second, not after gRPC's default backoff.
_CHANNEL_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def parse_implementation(implementation: str) -> tuple[str, str] | None:
    """(connection, server tool name) of `mcp:<connection>:<tool>`."""
    kind, _, rest = implementation.partition(":")
    connection, sep, tool = rest.partition(":")
    if kind != "mcp" or not sep or not connection or not tool:
        return None
    return connection, tool


def _report_progress(context: ToolContext, p: mpb.Progress) -> None:
    """An MCP progress notification as a ToolContext progress report (a streaming caller of
    ExecuteToolStream / DispatchToolCallStream receives it; nobody else listens)."""
    sink = getattr(context, "progress_sink", None)
    if sink is None:
        return
    total = p.total or None
    report: dict[str, Any] = {
        "message": p.message or (f"{p.progress:g} of {total:g}" if total else f"{p.progress:g}"),
        "data": {"progress": p.progress, "total": total},
    }
    if total:
        report["fraction"] = max(0.0, min(1.0, p.progress / total))
    sink(report)


class McpRoute:
    """ToolExecutor for MCP tools, over a lazily opened channel to the bridge."""

    def __init__(self, address: str, *, tracing: bool, default_timeout_s: float = 120.0) -> None:
        self._address = address
        self._tracing = tracing
        self._default_timeout_s = default_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: mcp_bridge_pb2_grpc.McpBridgeServiceStub | None = None

    def _bridge(self) -> mcp_bridge_pb2_grpc.McpBridgeServiceStub:
        """The bridge's stub, made once per channel (constructing a stub builds a multicallable
        for every method of the service)."""
        if self._stub is None:
            self._channel = open_channel(self._address, options=_CHANNEL_OPTIONS)
            self._stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def execute(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        target = parse_implementation(tool.implementation)
        if target is None:
            return envelope_to_tool_result(
                Err(
                    f"MCP tool {tool.name!r} has no valid implementation "
                    f"(expected mcp:<connection>:<tool>, got {tool.implementation!r})",
                    err_kind="mcp_misconfigured",
                )
            )
        connection, server_tool = target
        timeout = tool.timeout_seconds or self._default_timeout_s
        streamed = context.progress_sink is not None
        request_type = mpb.CallToolRequest if streamed else mpb.CallToolUnaryRequest
        request = request_type(
            connection=connection,
            tool=server_tool,
            arguments_json=convert.dumps(inputs),
            context=context_to_pb(context),
            timeout_seconds=timeout,
        )
        method = "CallTool" if streamed else "CallToolUnary"
        with tracer().start_as_current_span(
            f"{_SERVICE}/{method}",
            kind=SpanKind.CLIENT,
            attributes=_STREAM_ATTRIBUTES if streamed else _UNARY_ATTRIBUTES,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            metadata = tuple(inject_metadata({}).items()) if self._tracing else ()
            deadline = timeout + _DEADLINE_SLACK_S
            result: pb.ToolResult | None = None
            try:
                if isinstance(request, mpb.CallToolRequest):
                    result = await self._stream(request, context, metadata, deadline)
                else:
                    response = await self._bridge().CallToolUnary(
                        request, metadata=metadata, timeout=deadline
                    )
                    if response.HasField("result"):
                        result = response.result
            except grpc.aio.AioRpcError as exc:
                err = from_rpc_error(exc)
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not err.metadata:
                    err = Unavailable(
                        f"mcp_bridge unavailable: {exc.details()}", reason="SERVICE_UNAVAILABLE"
                    )
                span.set_status(Status(StatusCode.ERROR, err.message))
                span.set_attribute("error.type", err.reason)
                raise err from None
        if result is None:
            return envelope_to_tool_result(
                Err(f"the MCP bridge sent no result for {tool.name!r}", "empty_result")
            )
        return convert.tool_result_from_pb(result)

    async def _stream(
        self,
        request: mpb.CallToolRequest,
        context: ToolContext,
        metadata: tuple[tuple[str, str], ...],
        deadline: float,
    ) -> pb.ToolResult | None:
        """The result of a CallTool stream, its progress messages handed to the context."""
        result: pb.ToolResult | None = None
        async for message in self._bridge().CallTool(request, metadata=metadata, timeout=deadline):
            if message.WhichOneof("event") == "progress":
                _report_progress(context, message.progress)
            elif message.HasField("result"):
                result = message.result
        return result
