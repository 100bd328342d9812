"""CallTool (the stream) and CallToolUnary of the servicer over a real bridge core and real stdio
MCP servers, without a network: the result (the last message of the stream, the one message of
the unary call), errors raised for the RPC boundary, a caller that goes away cancels the request
on the MCP session, and progress notifications recorded on the MCP span either way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.mcp_bridge import core, sdk
from services.mcp_bridge.model import ServerConfig
from services.mcp_bridge.servicer import McpBridgeServicer
from shared.errors import InvalidArgument, NotFound, Unavailable
from tests.unit.mcp_bridge.conftest import BridgeFactory, raw_config
from tests.unit.mcp_bridge.test_core import wait_until
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.type.v1 import types_pb2 as pb


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


async def unary(servicer: McpBridgeServicer, **fields: object) -> mpb.CallToolUnaryResponse:
    return await servicer.CallToolUnary(mpb.CallToolUnaryRequest(**fields), None)


async def test_call_tool_unary_answers_with_the_result_alone(make_bridge: BridgeFactory) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    command = str(Path(sys.executable).parent / "mcp-server-time")
    await bridge.connect(ServerConfig(name="time", transport="stdio", command=command))
    servicer = McpBridgeServicer(bridge)
    echoed = await unary(servicer, connection="raw", tool="echo", arguments_json='{"message": "u"}')
    assert json.loads(echoed.result.envelope.ok.data_json) == "Echo: u"
    assert echoed.structured_content_json == ""
    failed = await unary(servicer, connection="raw", tool="fail", arguments_json="{}")
    assert failed.result.envelope.err.err_kind == "tool_error"
    timed = await unary(servicer, connection="raw", tool="hang", timeout_seconds=0.3)
    assert timed.result.envelope.err.err_kind == "timeout"
    now = await unary(
        servicer, connection="time", tool="get_current_time", arguments_json='{"timezone": "UTC"}'
    )
    assert json.loads(now.structured_content_json)["timezone"] == "UTC"


async def test_call_tool_unary_raises_bad_requests_and_unknown_connections(
    make_bridge: BridgeFactory,
) -> None:
    servicer = McpBridgeServicer(make_bridge())
    with pytest.raises(InvalidArgument) as bad:
        await unary(servicer, connection="raw", tool="echo", arguments_json="[1]")
    assert bad.value.field_violations[0][0] == "arguments_json"
    with pytest.raises(InvalidArgument) as nameless:
        await unary(servicer, connection="raw", arguments_json="{}")
    assert nameless.value.field_violations[0][0] == "tool"
    with pytest.raises(NotFound) as excinfo:
        await unary(servicer, connection="nope", tool="echo", arguments_json="{}")
    assert excinfo.value.reason == "MCP_CONNECTION_NOT_FOUND"


async def via_stream(servicer: McpBridgeServicer, **fields: object) -> pb.ToolResult:
    return (await call(servicer, **fields))[-1].result


async def via_unary(servicer: McpBridgeServicer, **fields: object) -> pb.ToolResult:
    return (await unary(servicer, **fields)).result


@pytest.mark.parametrize("rpc", [via_stream, via_unary], ids=["CallTool", "CallToolUnary"])
async def test_a_caller_that_goes_away_cancels_the_request_on_the_session(
    rpc: Callable[..., Awaitable[pb.ToolResult]], make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    bridge = make_bridge()
    markers = tmp_path / "m"
    await bridge.connect(raw_config("raw", "--marker-dir", str(markers)))
    servicer = McpBridgeServicer(bridge)
    # grpc.aio cancels the handler's task when the caller cancels or its deadline passes.
    pending = asyncio.ensure_future(rpc(servicer, connection="raw", tool="hang"))
    await wait_until(lambda: any(markers.glob("hang-*")))
    pending.cancel()
    # Well before the call's own timeout (120 s): the server is told as soon as the caller goes.
    await wait_until(lambda: any(markers.glob("cancelled-*")), timeout=10)
    with pytest.raises(asyncio.CancelledError):
        await pending
    echoed = await rpc(servicer, connection="raw", tool="echo", arguments_json='{"message": "x"}')
    assert json.loads(echoed.envelope.ok.data_json) == "Echo: x"


@pytest.fixture
def mcp_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The bridge core's spans, in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(core, "tracer", lambda: provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


async def test_progress_is_recorded_on_the_mcp_span_whether_or_not_the_caller_listens(
    make_bridge: BridgeFactory, mcp_spans: InMemorySpanExporter
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    servicer = McpBridgeServicer(bridge)
    streamed = await call(servicer, connection="raw", tool="progress")
    assert [m.WhichOneof("event") for m in streamed] == ["progress"] * 3 + ["result"]
    answered = await unary(servicer, connection="raw", tool="progress")
    # The server was asked for progress (it answers "done, no token" otherwise).
    assert json.loads(answered.result.envelope.ok.data_json) == "done"
    spans = [s for s in mcp_spans.get_finished_spans() if s.name == "tools/call progress"]
    assert len(spans) == 2
    for span in spans:
        events = [(e.name, dict(e.attributes or {})) for e in span.events]
        assert events == [
            ("mcp.progress", {"progress": float(step), "total": 3.0, "message": f"step {step}"})
            for step in (1, 2, 3)
        ]


async def test_a_call_context_with_ids_no_table_can_store_is_invalid_argument(
    make_bridge: BridgeFactory,
) -> None:
    servicer = McpBridgeServicer(make_bridge())
    with pytest.raises(InvalidArgument) as caught:
        await call(
            servicer,
            connection="raw",
            tool="echo",
            arguments_json="{}",
            context=pb.CallContext(tenant_id="t", conversation_id="c" * 500),
        )
    assert caught.value.reason == "ID_TOO_LONG"


async def test_a_result_too_large_to_send_on_is_an_err_and_the_connection_keeps_serving(
    make_bridge: BridgeFactory,
) -> None:
    # 20 MB of text goes out as the content and as the Ok's data: over the 32 MB a result may
    # be (before: the bridge's answer failed at the next hop, "Sent message larger than max").
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    servicer = McpBridgeServicer(bridge)
    answer = await unary(servicer, connection="raw", tool="huge", arguments_json='{"mb": 20}')
    assert answer.result.envelope.err.err_kind == "result_too_large"
    fits = await unary(servicer, connection="raw", tool="huge", arguments_json='{"mb": 1}')
    assert fits.result.envelope.WhichOneof("kind") == "ok"
    echo = await unary(servicer, connection="raw", tool="echo", arguments_json='{"message": "x"}')
    assert json.loads(echo.result.envelope.ok.data_json) == "Echo: x"


async def test_a_message_over_the_stdio_limit_ends_the_session_and_the_server_serves_again(
    make_bridge: BridgeFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's stdout line longer than MAX_MESSAGE_BYTES is not held in memory while it
    grows: the call fails at once, the log says why, and the restarted server serves."""
    monkeypatch.setattr(sdk, "MAX_MESSAGE_BYTES", 2 << 20)
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    servicer = McpBridgeServicer(bridge)
    with pytest.raises(Unavailable) as caught:
        await asyncio.wait_for(
            unary(servicer, connection="raw", tool="huge", arguments_json='{"mb": 3}'), 30
        )
    assert caught.value.reason == "MCP_SERVER_UNAVAILABLE"
    assert "went away during the call to 'huge'" in caught.value.message
    assert "sent a message over 2 MiB on stdout" in caplog.text

    for _ in range(600):  # until the restarted server is up
        try:
            echo = await unary(servicer, connection="raw", tool="echo", arguments_json="{}")
            break
        except Unavailable:
            await asyncio.sleep(0.05)
    else:
        pytest.fail("the restarted server did not serve within 30 s")
    assert echo.result.envelope.WhichOneof("kind") == "ok"
    fits = await unary(servicer, connection="raw", tool="huge", arguments_json='{"mb": 1}')
    assert fits.result.envelope.WhichOneof("kind") == "ok"


class Chunks:
    """A byte stream handing out the given chunks, then the end of the stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def receive(self) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        self.chunks.clear()


async def read_all(stream: sdk.WholeLines) -> list[bytes]:
    got = []
    with contextlib.suppress(anyio.EndOfStream):
        while True:
            got.append(await stream.receive())
    return got


async def test_stdout_reaches_the_sdk_in_whole_lines_so_reading_a_long_message_is_linear() -> None:
    chunks = [
        b'{"a": 1}\n{"b"',
        b": " + b"x" * 70_000,
        b"y" * 70_000,
        b'"}\n{"c": 3}\n{"d"',
        b": 4}",
    ]
    got = await read_all(sdk.WholeLines(Chunks(chunks), 1 << 20, "srv"))
    assert b"".join(got) == b"".join(chunks)
    assert got[:-1] == [
        b'{"a": 1}\n',
        b'{"b": ' + b"x" * 70_000 + b"y" * 70_000 + b'"}\n{"c": 3}\n',
    ]
    assert got[-1] == b'{"d": 4}'  # the last line, unfinished when the stream ended
    assert all(g.endswith(b"\n") for g in got[:-1])


async def test_a_line_over_the_limit_ends_the_stream_without_holding_it() -> None:
    chunks = [b'{"a": 1}\n', *[b"z" * 65_536] * 40, b"never read\n"]
    stream = sdk.WholeLines(Chunks(chunks), 1 << 20, "srv")
    assert await read_all(stream) == [b'{"a": 1}\n']
    assert stream._held_bytes <= (1 << 20) + 65_536 and not stream._held
