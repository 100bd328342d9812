"""The CallTool stream of the servicer over a real bridge core and a real stdio MCP server,
without a network: one result as the last message, errors raised for the RPC boundary, and a
caller that goes away cancels the request on the MCP session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.mcp_bridge.servicer import McpBridgeServicer
from shared.errors import InvalidArgument, NotFound
from tests.unit.mcp_bridge.conftest import BridgeFactory, raw_config
from tests.unit.mcp_bridge.test_core import wait_until
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb


async def call(servicer: McpBridgeServicer, **fields: object) -> list[mpb.CallToolResponse]:
    request = mpb.CallToolRequest(**fields)
    return [m async for m in servicer.CallTool(request, None)]


async def test_the_result_is_the_one_and_last_message(make_bridge: BridgeFactory) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    servicer = McpBridgeServicer(bridge)
    messages = await call(
        servicer, connection="raw", tool="echo", arguments_json='{"message": "hi"}'
    )
    assert [m.WhichOneof("event") for m in messages] == ["result"]
    assert json.loads(messages[0].result.envelope.ok.data_json) == "Echo: hi"
    failed = await call(servicer, connection="raw", tool="fail", arguments_json="{}")
    assert failed[-1].result.envelope.err.err_kind == "tool_error"


async def test_bad_requests_and_unknown_connections_raise_for_the_rpc_boundary(
    make_bridge: BridgeFactory,
) -> None:
    servicer = McpBridgeServicer(make_bridge())
    with pytest.raises(InvalidArgument):
        await call(servicer, connection="raw", tool="echo", arguments_json="[1]")
    with pytest.raises(NotFound) as excinfo:
        await call(servicer, connection="nope", tool="echo", arguments_json="{}")
    assert excinfo.value.reason == "MCP_CONNECTION_NOT_FOUND"


async def test_a_caller_that_goes_away_cancels_the_request_on_the_session(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    bridge = make_bridge()
    markers = tmp_path / "m"
    await bridge.connect(raw_config("raw", "--marker-dir", str(markers)))
    servicer = McpBridgeServicer(bridge)
    # grpc.aio cancels the handler's task when the caller cancels or its deadline passes.
    stream = asyncio.ensure_future(call(servicer, connection="raw", tool="hang"))
    await wait_until(lambda: any(markers.glob("hang-*")))
    stream.cancel()
    # Well before the call's own timeout (120 s): the server is told as soon as the caller goes.
    await wait_until(lambda: any(markers.glob("cancelled-*")), timeout=10)
    with pytest.raises(asyncio.CancelledError):
        await stream
    messages = await call(
        servicer, connection="raw", tool="echo", arguments_json='{"message": "x"}'
    )
    assert json.loads(messages[-1].result.envelope.ok.data_json) == "Echo: x"
