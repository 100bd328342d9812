"""MCP tools through the real mesh: dispatcher -> registry -> mcp_bridge -> a real MCP server
(server-everything over stdio and streamable HTTP, our raw test server), as one trace."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from shared.launcher import start_service
from shared.rpc_errors import from_rpc_error
from shared.telemetry.collector import MemorySpanSink, ReceivedSpan
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh, free_ports
from tests.mcp_servers.install import NotInstallable, server_everything
from tests.support.waiting import wait_for
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

RAW = [sys.executable, "-m", "tests.mcp_servers.raw_server"]
ROOT = str(Path(__file__).resolve().parents[2])


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def everything_cmd() -> list[str]:
    try:
        return server_everything()
    except NotInstallable as exc:
        pytest.skip(str(exc))


@contextmanager
def everything_over_http(command: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """server-everything over streamable HTTP on `port`, while the block runs."""
    proc = subprocess.Popen(
        [*command, "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        assert proc.poll() is None, "server-everything (streamableHttp) exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def everything_http(everything_cmd: list[str]) -> Iterator[str]:
    (port,) = free_ports(1)
    with everything_over_http(everything_cmd, port):
        yield f"http://127.0.0.1:{port}/mcp"


def serve_over_http(module: str, *args: str) -> Iterator[str]:
    """One of our Python MCP servers over streamable HTTP on a free port: its URL, while up."""
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args, str(port)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        assert proc.poll() is None, f"{module} exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # an open stream holds up a graceful shutdown
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def http_probe() -> Iterator[str]:
    """Our streamable HTTP server that answers with the headers and _meta it received."""
    yield from serve_over_http("tests.mcp_servers.http_probe_server")


@pytest.fixture
def changing_http() -> Iterator[str]:
    """Our streamable HTTP server whose `grow` tool adds a tool and announces it (one per test:
    what it grows stays grown)."""
    yield from serve_over_http("tests.mcp_servers.changing_server", "--http")


@pytest.fixture(scope="module", params=BACKENDS)
def mcp_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    catalog = tmp_path_factory.mktemp(f"mcp-catalog-{request.param}") / "mcp_catalog.json"
    catalog.write_text(
        json.dumps(
            [
                {
                    "name": "rawcat",
                    "description": "The raw test server, from the catalog.",
                    "transport": "stdio",
                    "command": RAW[0],
                    "args": RAW[1:],
                }
            ]
        )
    )
    env = {
        "TOOLMESH_MCP_CATALOG": str(catalog),
        "TOOLMESH_MCP_RESTART_BACKOFF_S": "0.2",
        "PYTHONPATH": ROOT,
    }
    with backend_mesh(
        request, tmp_path_factory, collector, "mcp", env, services=["mcp_bridge"]
    ) as mesh:
        yield mesh


def bridge(mesh: Mesh) -> mcp_bridge_pb2_grpc.McpBridgeServiceStub:
    channel = grpc.insecure_channel(mesh.address("mcp_bridge"))
    mesh.channels.append(channel)
    return mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel)


def stdio(name: str, command: list[str], *args: str) -> mpb.ConnectRequest:
    return mpb.ConnectRequest(
        server=mpb.ServerConfig(
            name=name, transport=mpb.TRANSPORT_STDIO, command=command[0], args=[*command[1:], *args]
        )
    )


def connected(mesh: Mesh, name: str) -> mpb.Connection | None:
    for c in bridge(mesh).ListConnections(mpb.ListConnectionsRequest()).connections:
        if c.server.name == name and c.state == mpb.CONNECTION_STATE_CONNECTED:
            return c
    return None


@pytest.fixture(scope="module")
def everything(mcp_mesh: Mesh, everything_cmd: list[str]) -> mpb.ConnectResponse:
    return bridge(mcp_mesh).Connect(stdio("everything", everything_cmd, "stdio"), timeout=60)


def mcp_cli(mesh: Mesh, *args: str) -> subprocess.CompletedProcess[str]:
    """`toolmesh mcp <args>` against the mesh's bridge, as a user runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "shared.cli.main",
            "mcp",
            *args,
            "--bridge",
            mesh.address("mcp_bridge"),
        ],
        env=mesh.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def dispatch(
    mesh: Mesh, name: str, arguments: dict[str, Any], *, conversation: str, metadata: Any = None
) -> dpb.DispatchToolCallResponse:
    return mesh.dispatcher.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name=name, input_json=json.dumps(arguments)),
            context=pb.CallContext(
                tenant_id="tenant-a", user_id="tester", conversation_id=conversation
            ),
        ),
        metadata=metadata,
        timeout=60,
    )


UNARY = "toolmesh.mcp_bridge.v1.McpBridgeService/CallToolUnary"
STREAM = "toolmesh.mcp_bridge.v1.McpBridgeService/CallTool"
DISPATCH = "toolmesh.dispatcher.v1.DispatcherService/DispatchToolCall"
DISPATCH_STREAM = "toolmesh.dispatcher.v1.DispatcherService/DispatchToolCallStream"


def trace_of(
    mesh: Mesh, conversation: str, tool: str, *, rpc: str = UNARY, root: str = DISPATCH
) -> list[ReceivedSpan]:
    """Every span of the conversation's last call, once each process's spans of it arrived
    (each exports on its own schedule)."""
    entry = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation, limit=1)
    ).entries[0]
    # `rpc` names two spans, the registry's CLIENT and the bridge's SERVER: wait for both.
    expected = (
        (root, 1),
        (f"execute_tool {entry.tool_name}", 1),
        (rpc, 2),
        (f"tools/call {tool}", 1),
    )
    for name, count in expected:

        def arrived(s: ReceivedSpan, name: str = name) -> bool:
            return s.trace_id == entry.trace_id and s.name == name

        mesh.spans.wait_for_sync(arrived, timeout=20, count=count)
    return mesh.spans.spans(entry.trace_id)


def assert_mcp_span_path(spans: list[ReceivedSpan], tool: str, rpc: str, root: str) -> None:
    """The MCP client span is the child of the bridge's SERVER span of `rpc`, itself the child
    of the registry's CLIENT span of `rpc`, under the registry's execute_tool span, in a trace
    rooted at the dispatcher's `root` span; the MCP SDK adds no span of its own."""
    by_id = {s.span_id: s for s in spans}
    mcp_span = next(s for s in spans if s.name == f"tools/call {tool}")
    assert (mcp_span.kind, mcp_span.service_name) == ("CLIENT", "toolmesh-mcp_bridge")
    server = by_id[mcp_span.parent_span_id]
    assert (server.name, server.kind, server.service_name) == (rpc, "SERVER", "toolmesh-mcp_bridge")
    client = by_id[server.parent_span_id]
    assert (client.name, client.kind, client.service_name) == (rpc, "CLIENT", "toolmesh-registry")
    chain = []
    cursor = client
    while cursor.parent_span_id in by_id:
        cursor = by_id[cursor.parent_span_id]
        chain.append(cursor.name)
    assert any(name.startswith("execute_tool mcp_") for name in chain)
    assert cursor.name == root
    assert not [s.name for s in spans if s.name.startswith("MCP send")]


def test_mcp_everything_echo_goes_through_the_mesh_and_back_as_one_trace(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    assert everything.tools_discovered == len(everything.tool_names) > 0
    assert "mcp_everything_echo" in everything.tool_names
    # Its task-only tool (execution.taskSupport "required") is not offered: a plain call fails.
    assert "mcp_everything_simulate-research-query" not in everything.tool_names
    assert any(
        s.startswith("simulate-research-query: it runs only as a task") for s in everything.skipped
    )
    response = dispatch(mcp_mesh, "mcp_everything_echo", {"message": "hi"}, conversation="mcp-1")
    assert response.result.envelope.WhichOneof("kind") == "ok"
    assert json.loads(response.result.envelope.ok.data_json) == "Echo: hi"
    assert response.result.cost_usd == 0
    spans = trace_of(mcp_mesh, "mcp-1", "echo")
    services = {s.service_name for s in spans}
    assert {"toolmesh-dispatcher", "toolmesh-registry", "toolmesh-mcp_bridge"} <= services
    mcp_span = next(s for s in spans if s.name == "tools/call echo")
    assert mcp_span.kind == "CLIENT"
    assert mcp_span.attributes["mcp.method.name"] == "tools/call"
    assert mcp_span.attributes["gen_ai.tool.name"] == "echo"
    assert mcp_span.attributes["network.transport"] == "pipe"
    # A call without a progress listener takes the unary RPC, as one unbroken trace.
    assert_mcp_span_path(spans, "echo", UNARY, DISPATCH)
    execute = next(s for s in spans if s.name == "execute_tool mcp_everything_echo")
    assert execute.span_id in {s.parent_span_id for s in spans if s.name == UNARY}
    assert not [s for s in spans if s.name == STREAM]


def test_a_servers_tool_annotations_reach_the_registry_across_processes(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    """server-everything annotates its echo tool (a title; read-only, not destructive)."""
    echo = mcp_mesh.registry.GetTool(
        rpb.GetToolRequest(name="mcp_everything_echo"), timeout=30
    ).tool
    assert echo.annotations.title
    assert echo.annotations.HasField("read_only") and echo.annotations.read_only
    assert echo.annotations.HasField("destructive") and not echo.annotations.destructive
    assert list(echo.required_capabilities) == []  # TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY unset

    # And an operator sees them in the catalog listing.
    def tools(*args: str) -> subprocess.CompletedProcess[str]:
        where = ("--registry", mcp_mesh.address("registry"))
        return subprocess.run(
            [sys.executable, "-m", "shared.cli.main", "tools", "--all", *args, *where],
            env=mcp_mesh.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = tools()
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("mcp_everything_echo "))
    assert f'("{echo.annotations.title}"; read-only' in line and "destructive" not in line
    (row,) = [t for t in json.loads(tools("--json").stdout) if t["name"] == "mcp_everything_echo"]
    assert row["annotations"]["read_only"] is True and row["annotations"]["destructive"] is False


def test_images_structured_content_and_resources_map_into_the_result(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    image = dispatch(mcp_mesh, "mcp_everything_get-tiny-image", {}, conversation="mcp-2")
    cards = [dict(c) for c in image.result.envelope.ok.effects.cards]
    assert any(c["type"] == "image" and c["mime_type"] == "image/png" for c in cards)
    assert image.result.envelope.ok.effects.exports[0].mime_type == "image/png"
    weather = dispatch(
        mcp_mesh,
        "mcp_everything_get-structured-content",
        {"location": "New York"},
        conversation="mcp-2",
    )
    data = json.loads(weather.result.envelope.ok.data_json)
    assert isinstance(data["temperature"], int)
    resource = dispatch(
        mcp_mesh,
        "mcp_everything_get-resource-reference",
        {"resourceType": "Text", "resourceId": 1},
        conversation="mcp-2",
    )
    kinds = [dict(c)["type"] for c in resource.result.envelope.ok.effects.cards]
    assert "resource" in kinds


def test_progress_notifications_stream_through_call_tool(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    messages = list(
        bridge(mcp_mesh).CallTool(
            mpb.CallToolRequest(
                connection="everything",
                tool="trigger-long-running-operation",
                arguments_json=json.dumps({"duration": 1, "steps": 3}),
            ),
            timeout=60,
        )
    )
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds[-1] == "result" and kinds.count("result") == 1
    progress = [m.progress for m in messages if m.HasField("progress")]
    assert len(progress) >= 2 and progress[-1].total == 3
    assert "completed" in messages[-1].result.content


def test_progress_reaches_a_streaming_dispatch_caller(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    messages = list(
        mcp_mesh.dispatcher.DispatchToolCallStream(
            dpb.DispatchToolCallStreamRequest(
                tool_use=pb.ToolUse(
                    id="mcp-progress",
                    name="mcp_everything_trigger-long-running-operation",
                    input_json=json.dumps({"duration": 1, "steps": 3}),
                ),
                context=pb.CallContext(tenant_id="tenant-a", conversation_id="mcp-stream"),
            ),
            timeout=60,
        )
    )
    progress = [m.progress for m in messages if m.WhichOneof("event") == "progress"]
    assert len(progress) >= 2
    assert all(p.tool_use_id == "mcp-progress" for p in progress)
    assert progress[-1].fraction == pytest.approx(1.0)
    assert messages[-1].WhichOneof("event") == "result"
    assert "completed" in messages[-1].result.result.content
    # A caller that listens for progress gets the CallTool stream end to end.
    spans = trace_of(
        mcp_mesh,
        "mcp-stream",
        "trigger-long-running-operation",
        rpc=STREAM,
        root=DISPATCH_STREAM,
    )
    assert_mcp_span_path(spans, "trigger-long-running-operation", STREAM, DISPATCH_STREAM)
    assert not [s for s in spans if s.name == UNARY]


def test_call_tool_unary_answers_with_the_result_alone(
    mcp_mesh: Mesh, everything: mpb.ConnectResponse
) -> None:
    stub = bridge(mcp_mesh)
    done = stub.CallToolUnary(
        mpb.CallToolUnaryRequest(
            connection="everything",
            tool="trigger-long-running-operation",
            arguments_json=json.dumps({"duration": 1, "steps": 3}),
        ),
        timeout=60,
    )
    assert "completed" in done.result.content
    weather = stub.CallToolUnary(
        mpb.CallToolUnaryRequest(
            connection="everything",
            tool="get-structured-content",
            arguments_json=json.dumps({"location": "New York"}),
        ),
        timeout=60,
    )
    assert isinstance(json.loads(weather.structured_content_json)["temperature"], int)
    with pytest.raises(grpc.RpcError) as bad:
        stub.CallToolUnary(
            mpb.CallToolUnaryRequest(connection="everything", tool="echo", arguments_json="[1]"),
            timeout=60,
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as missing:
        stub.CallToolUnary(
            mpb.CallToolUnaryRequest(connection="nope", tool="echo", arguments_json="{}"),
            timeout=60,
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert from_rpc_error(missing.value).reason == "MCP_CONNECTION_NOT_FOUND"


def test_streamable_http_connection_calls_over_tcp(mcp_mesh: Mesh, everything_http: str) -> None:
    response = bridge(mcp_mesh).Connect(
        mpb.ConnectRequest(
            server=mpb.ServerConfig(
                name="everything_http",
                transport=mpb.TRANSPORT_STREAMABLE_HTTP,
                url=everything_http,
                headers={"X-Api-Key": "secret"},
            )
        ),
        timeout=60,
    )
    assert "mcp_everything_http_echo" in response.tool_names
    result = dispatch(mcp_mesh, "mcp_everything_http_echo", {"message": "h"}, conversation="mcp-3")
    assert json.loads(result.result.envelope.ok.data_json) == "Echo: h"
    conn = connected(mcp_mesh, "everything_http")
    assert conn is not None and conn.session_id
    assert conn.server.headers["X-Api-Key"] == "***"
    spans = trace_of(mcp_mesh, "mcp-3", "echo")
    mcp_span = next(s for s in spans if s.name == "tools/call echo")
    assert mcp_span.attributes["network.transport"] == "tcp"
    assert mcp_span.attributes["mcp.session.id"] == conn.session_id


def test_a_restarted_http_server_gets_a_new_session_and_the_call_goes_through(
    mcp_mesh: Mesh, everything_cmd: list[str]
) -> None:
    """server-everything keeps sessions in memory: restarted, it answers the old session id
    with 400 "No valid session ID provided". The bridge opens a new session and sends the
    refused call again, so the model never sees the restart."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/mcp"
    config = mpb.ServerConfig(name="reborn", transport=mpb.TRANSPORT_STREAMABLE_HTTP, url=url)
    with everything_over_http(everything_cmd, port):
        bridge(mcp_mesh).Connect(mpb.ConnectRequest(server=config), timeout=60)
        before = connected(mcp_mesh, "reborn")
        assert before is not None and before.session_id
        first = dispatch(mcp_mesh, "mcp_reborn_echo", {"message": "a"}, conversation="mcp-r")
        assert json.loads(first.result.envelope.ok.data_json) == "Echo: a"
    with everything_over_http(everything_cmd, port):
        again = dispatch(mcp_mesh, "mcp_reborn_echo", {"message": "b"}, conversation="mcp-r")
        assert json.loads(again.result.envelope.ok.data_json) == "Echo: b"
        after = connected(mcp_mesh, "reborn")
        assert after is not None and after.session_id and after.session_id != before.session_id
        assert after.restarts >= 1
    bridge(mcp_mesh).Disconnect(mpb.DisconnectRequest(name="reborn"), timeout=60)


def test_trace_context_reaches_the_server_in_meta_but_baggage_does_not(mcp_mesh: Mesh) -> None:
    bridge(mcp_mesh).Connect(stdio("raw", RAW), timeout=60)
    response = dispatch(
        mcp_mesh,
        "mcp_raw_meta",
        {},
        conversation="mcp-4",
        metadata=(("baggage", "toolmesh.tenant_id=tenant-a,secret=do-not-leak"),),
    )
    meta = json.loads(json.loads(response.result.envelope.ok.data_json))
    entry = mcp_mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="mcp-4", limit=1)
    ).entries[0]
    assert meta["traceparent"].split("-")[1] == entry.trace_id
    assert "baggage" not in meta
    # The server's parent is the bridge's MCP client span (the SDK's own span is turned off).
    spans = trace_of(mcp_mesh, "mcp-4", "meta")
    mcp_span = next(s for s in spans if s.name == "tools/call meta")
    assert meta["traceparent"].split("-")[2] == mcp_span.span_id
    assert_mcp_span_path(spans, "meta", UNARY, DISPATCH)


def test_streamable_http_carries_w3c_trace_headers_and_no_baggage(
    mcp_mesh: Mesh, http_probe: str
) -> None:
    bridge(mcp_mesh).Connect(
        mpb.ConnectRequest(
            server=mpb.ServerConfig(
                name="probe", transport=mpb.TRANSPORT_STREAMABLE_HTTP, url=http_probe
            )
        ),
        timeout=60,
    )
    response = dispatch(
        mcp_mesh,
        "mcp_probe_probe",
        {},
        conversation="mcp-4h",
        metadata=(("baggage", "toolmesh.tenant_id=tenant-a,secret=do-not-leak"),),
    )
    data = json.loads(response.result.envelope.ok.data_json)
    seen = json.loads(data["result"])
    entry = mcp_mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="mcp-4h", limit=1)
    ).entries[0]
    assert seen["headers"]["traceparent"].split("-")[1] == entry.trace_id
    assert seen["headers"]["traceparent"] == seen["meta"]["traceparent"]
    assert "baggage" not in seen["headers"] and "baggage" not in seen["meta"]
    spans = trace_of(mcp_mesh, "mcp-4h", "probe")
    mcp_span = next(s for s in spans if s.name == "tools/call probe")
    assert mcp_span.attributes["network.transport"] == "tcp"
    # A result over 1 MiB (the MCP SDK's default limit of one SSE event) comes through.
    sized = dispatch(mcp_mesh, "mcp_probe_sized", {"kb": 1536}, conversation="mcp-4h")
    assert json.loads(sized.result.envelope.ok.data_json) == {"result": "z" * (1536 << 10)}


def test_a_failing_tool_is_an_err_result_not_an_rpc_error(mcp_mesh: Mesh) -> None:
    wait_for(lambda: connected(mcp_mesh, "raw"))
    failed = dispatch(mcp_mesh, "mcp_raw_fail", {}, conversation="mcp-5")
    assert failed.result.envelope.err.err_kind == "tool_error"
    assert "widget is broken" in failed.result.content
    bad = dispatch(mcp_mesh, "mcp_raw_malformed", {}, conversation="mcp-5")
    assert bad.result.envelope.err.err_kind == "malformed_result"
    spans = trace_of(mcp_mesh, "mcp-5", "malformed")
    span = next(s for s in spans if s.name == "tools/call malformed")
    assert span.attributes["error.type"] == "malformed_result"
    assert span.status_code == "ERROR"
    # An answer the SDK cannot parse (an unpaired surrogate escape): an Err at once, not a
    # call left waiting for its timeout.
    odd = dispatch(mcp_mesh, "mcp_raw_not_unicode", {}, conversation="mcp-5")
    assert odd.result.envelope.err.err_kind == "malformed_result"
    assert "answer is unreadable" in odd.result.content and "surrogate" in odd.result.content
    entry = mcp_mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="mcp-5", limit=1)
    ).entries[0]
    assert (entry.tool_name, entry.success) == ("mcp_raw_not_unicode", False)
    assert dispatch(mcp_mesh, "mcp_raw_fail", {}, conversation="mcp-5b").result.content


def test_a_byte_that_is_not_utf8_is_replaced_and_the_connection_keeps_working(
    mcp_mesh: Mesh,
) -> None:
    """Before, the SDK's reader died on it while the session looked open: this call and every
    later one of the server waited out the 120 s timeout, until someone reconnected."""
    wait_for(lambda: connected(mcp_mesh, "raw"))
    started = time.monotonic()
    odd = dispatch(mcp_mesh, "mcp_raw_bad_utf8", {}, conversation="mcp-utf8")
    assert json.loads(odd.result.envelope.ok.data_json) == "caf\ufffd"
    echoed = dispatch(mcp_mesh, "mcp_raw_echo", {"message": "after"}, conversation="mcp-utf8b")
    assert json.loads(echoed.result.envelope.ok.data_json) == "Echo: after"
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("tool", ["null_result", "deep_result"])
def test_an_answer_the_sdk_cannot_read_fails_its_call_at_once(mcp_mesh: Mesh, tool: str) -> None:
    """Before, these waited out the 120 s timeout: the bridge recognised an unreadable answer
    only when Python could parse its line and the SDK's error carried the line."""
    wait_for(lambda: connected(mcp_mesh, "raw"))
    started = time.monotonic()
    odd = dispatch(mcp_mesh, f"mcp_raw_{tool}", {}, conversation=f"mcp-{tool}")
    assert odd.result.envelope.err.err_kind == "malformed_result", odd.result
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("code", [-32000, -32001])
def test_a_server_error_with_a_reserved_code_is_the_servers_error_not_a_lost_connection(
    mcp_mesh: Mesh, code: int
) -> None:
    """-32000 is the usual code of any server-side error, and a server may answer -32001: the
    bridge took the first for its own "connection closed" (and restarted the server, failing
    every call in flight on it) and the second for its own timeout."""
    wait_for(lambda: connected(mcp_mesh, "raw"))
    before = children_of(mcp_mesh.processes["mcp_bridge"].process.pid)
    failed = dispatch(mcp_mesh, "mcp_raw_server_error", {"code": code}, conversation="mcp-32k")
    err = failed.result.envelope.err
    assert err.err_kind == "mcp_error", failed.result
    assert "widget backend is down" in err.message
    assert children_of(mcp_mesh.processes["mcp_bridge"].process.pid) == before  # no restart
    echoed = dispatch(mcp_mesh, "mcp_raw_echo", {"message": "same"}, conversation="mcp-32kb")
    assert json.loads(echoed.result.envelope.ok.data_json) == "Echo: same"


def test_cancelling_the_conversation_cancels_the_request_on_the_mcp_session(
    mcp_mesh: Mesh, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    bridge(mcp_mesh).Connect(stdio("hanger", RAW, "--marker-dir", str(markers)), timeout=60)
    future = mcp_mesh.dispatcher.DispatchToolCall.future(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name="mcp_hanger_hang", input_json="{}"),
            context=pb.CallContext(tenant_id="tenant-a", conversation_id="mcp-cancel"),
        ),
        timeout=60,
    )
    wait_for(lambda: list(markers.glob("hang-*")))
    cancelled = mcp_mesh.dispatcher.Cancel(
        dpb.CancelRequest(conversation_id="mcp-cancel", tenant_id="tenant-a")
    )
    assert cancelled.cancelled_calls == 1
    assert future.result(timeout=10).result.envelope.err.err_kind == "cancelled"
    wait_for(lambda: list(markers.glob("cancelled-*")), timeout=10)


def test_a_changed_tool_is_held_until_approved_through_set_tool_status(
    mcp_mesh: Mesh, tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    tool = {"name": "widget", "description": "v1", "inputSchema": {"type": "object"}}
    inventory.write_text(json.dumps([tool]))
    stub = bridge(mcp_mesh)
    stub.Connect(stdio("inv", RAW, "--inventory", str(inventory)), timeout=60)
    inventory.write_text(json.dumps([{**tool, "description": "v2", "version": 2}]))
    report = stub.Reconnect(mpb.ReconnectRequest(name="inv"), timeout=60)
    assert list(report.changed) == ["mcp_inv_widget"]
    held = dispatch(mcp_mesh, "mcp_inv_widget", {}, conversation="mcp-6")
    assert held.result.envelope.err.err_kind == "tool_not_approved"
    mcp_mesh.registry.SetToolStatus(
        rpb.SetToolStatusRequest(name="mcp_inv_widget", status=pb.TOOL_STATUS_APPROVED)
    )
    tries = itertools.count()  # a conversation per try: repeats in one trip the loop guard
    approved = wait_for(
        lambda: (
            (
                r := dispatch(mcp_mesh, "mcp_inv_widget", {}, conversation=f"mcp-6b-{next(tries)}")
            ).result.envelope.WhichOneof("kind")
            == "ok"
            and r
        )
    )
    assert json.loads(approved.result.envelope.ok.data_json) == "widget v2"


def test_tools_a_server_adds_while_connected_are_registered_and_callable(
    mcp_mesh: Mesh, changing_http: str
) -> None:
    """A current-protocol server over streamable HTTP announces a new tool on its listen
    stream; the bridge registers it (its own tools/list span) and the LLM can call it."""
    name = f"changing_{mcp_mesh.backend}"  # the span collector serves both backends' meshes
    stub = bridge(mcp_mesh)
    stub.Connect(
        mpb.ConnectRequest(
            server=mpb.ServerConfig(
                name=name, transport=mpb.TRANSPORT_STREAMABLE_HTTP, url=changing_http
            )
        ),
        timeout=60,
    )
    grown = dispatch(mcp_mesh, f"mcp_{name}_grow", {"name": "sprout"}, conversation="mcp-grow")
    assert json.loads(grown.result.envelope.ok.data_json) == {"result": "added sprout"}
    conn = wait_for(lambda: (c := connected(mcp_mesh, name)) and c.tool_list_changes >= 1 and c)
    assert f"mcp_{name}_sprout" in conn.tool_names
    assert list(conn.last_tool_change.added) == [f"mcp_{name}_sprout"]
    tools = mcp_mesh.registry.GetToolsForLLM(rpb.GetToolsForLLMRequest(tenant_id="tenant-a"))
    assert f"mcp_{name}_sprout" in {t.name for t in tools.tools}
    called = dispatch(mcp_mesh, f"mcp_{name}_sprout", {}, conversation="mcp-sprout")
    assert json.loads(called.result.envelope.ok.data_json) == {"result": "sprout here"}
    (listing,) = mcp_mesh.spans.wait_for_sync(
        lambda s: s.name == "tools/list" and s.attributes.get("toolmesh.mcp.connection") == name,
        timeout=20,
    )
    assert (listing.kind, listing.service_name) == ("CLIENT", "toolmesh-mcp_bridge")
    assert listing.attributes["toolmesh.mcp.tools.added"] == 1
    listed = mcp_cli(mcp_mesh, "list")
    assert listed.returncode == 0, listed.stderr
    assert "tool list changes announced by the server: 1 (the last: 1 added" in listed.stdout
    stub.Disconnect(mpb.DisconnectRequest(name=name), timeout=60)


def test_bad_connections_fail_clearly_and_disconnect_reaps_every_process(mcp_mesh: Mesh) -> None:
    stub = bridge(mcp_mesh)
    with pytest.raises(grpc.RpcError) as missing:
        stub.Connect(stdio("missing", ["no-such-mcp-server-xyz"]), timeout=60)
    assert missing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert from_rpc_error(missing.value).reason == "MCP_COMMAND_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as unspecified:
        stub.Connect(mpb.ConnectRequest(server=mpb.ServerConfig(name="x")), timeout=60)
    assert unspecified.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bridge_pid = mcp_mesh.processes["mcp_bridge"].process.pid
    before = children_of(bridge_pid)
    # Enough cycles to catch a new server losing its pipes to the old one's teardown (it did on
    # uvloop: about one cycle in a hundred).
    for _ in range(12):
        stub.Connect(stdio("cycle", RAW), timeout=60)
        assert len(children_of(bridge_pid) - before) == 1
        removed = stub.Disconnect(mpb.DisconnectRequest(name="cycle"), timeout=60)
        assert "mcp_cycle_echo" in removed.removed_tools
    assert children_of(bridge_pid) - before == set()
    with pytest.raises(grpc.RpcError) as gone:
        dispatch(mcp_mesh, "mcp_cycle_echo", {"message": "x"}, conversation="mcp-7")
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_model_can_search_the_catalog_and_install_a_server(mcp_mesh: Mesh) -> None:
    found = dispatch(mcp_mesh, "search_mcp_marketplace", {"query": "raw"}, conversation="mcp-9")
    assert [e["name"] for e in json.loads(found.result.envelope.ok.data_json)] == ["rawcat"]
    installed = dispatch(mcp_mesh, "install_mcp_server", {"name": "rawcat"}, conversation="mcp-9")
    data = json.loads(installed.result.envelope.ok.data_json)
    assert "mcp_rawcat_echo" in data["tool_names"]
    echoed = dispatch(mcp_mesh, "mcp_rawcat_echo", {"message": "cat"}, conversation="mcp-9b")
    assert json.loads(echoed.result.envelope.ok.data_json) == "Echo: cat"
    unknown = dispatch(mcp_mesh, "install_mcp_server", {"name": "rowcat"}, conversation="mcp-9c")
    assert unknown.result.envelope.WhichOneof("kind") == "hint"


def test_the_cli_connects_lists_reconnects_and_disconnects(mcp_mesh: Mesh) -> None:
    def toolmesh(*args: str) -> subprocess.CompletedProcess[str]:
        return mcp_cli(mcp_mesh, *args)

    connect = toolmesh(
        "connect", "clitool", "--command", RAW[0], "--arg=-m", f"--arg={RAW[2]}", "--env", "T=abc"
    )
    assert connect.returncode == 0, connect.stderr
    assert "mcp_clitool_echo" in connect.stdout
    listed = toolmesh("list", "--json")
    assert listed.returncode == 0, listed.stderr
    conns = {c["server"]["name"]: c for c in json.loads(listed.stdout)["connections"]}
    assert conns["clitool"]["state"] == "CONNECTION_STATE_CONNECTED"
    assert conns["clitool"]["server"]["env"] == {"T": "***"}
    assert toolmesh("reconnect", "clitool").returncode == 0
    assert toolmesh("disconnect", "clitool").returncode == 0
    again = toolmesh("disconnect", "clitool")
    assert again.returncode == 2 and "MCP_CONNECTION_NOT_FOUND" in again.stderr
    bad = toolmesh("connect", "both", "--command", "x", "--url", "http://x")
    assert bad.returncode == 2 and "exactly one" in bad.stderr


def test_a_restarted_bridge_re_establishes_its_stored_connections(mcp_mesh: Mesh) -> None:
    bridge(mcp_mesh).Connect(stdio("keep", RAW), timeout=60)
    old = mcp_mesh.processes.pop("mcp_bridge")
    port = int(old.address.rsplit(":", 1)[1])
    old.stop()
    # While the bridge is down the registry answers UNAVAILABLE, not a hang.
    with pytest.raises(grpc.RpcError) as down:
        dispatch(mcp_mesh, "mcp_keep_echo", {"message": "x"}, conversation="mcp-8")
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    mcp_mesh.processes["mcp_bridge"] = start_service("mcp_bridge", env=mcp_mesh.env, port=port)
    wait_for(lambda: connected(mcp_mesh, "keep"))

    attempts = itertools.count()

    def echo_back() -> dpb.DispatchToolCallResponse | None:
        # A conversation per attempt: retries of one call in one conversation would trip the
        # loop guard (every attempt, failed or not, is logged and counted).
        conversation = f"mcp-8b-{next(attempts)}"
        try:
            return dispatch(
                mcp_mesh, "mcp_keep_echo", {"message": "back"}, conversation=conversation
            )
        except grpc.RpcError as exc:  # the registry's channel may still be in reconnect backoff
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return None

    again = wait_for(echo_back)
    assert again.result.envelope.WhichOneof("kind") == "ok", again.result.content
    assert json.loads(again.result.envelope.ok.data_json) == "Echo: back"


def test_a_tool_the_registry_cannot_take_is_skipped_and_the_others_are_registered(
    mcp_mesh: Mesh, tmp_path: Path
) -> None:
    """Before, one tool with a schema of megabytes (or a NUL in its description) failed the
    registration of the whole connection, or held the registry's loop for seconds."""
    big = {"type": "object", "description": "x" * 300_000}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            [
                {"name": "enormous", "description": "too big", "inputSchema": big},
                {"name": "nul_doc", "description": "a\u0000b", "inputSchema": {"type": "object"}},
                {"name": "twice", "description": "first", "inputSchema": {"type": "object"}},
                {"name": "twice", "description": "second", "inputSchema": {"type": "object"}},
                {"name": "", "description": "nameless", "inputSchema": {"type": "object"}},
            ]
        )
    )
    stub = bridge(mcp_mesh)
    connected_now = stub.Connect(stdio("skips", RAW, "--inventory", str(inventory)), timeout=60)
    try:
        skipped = {s.split(": ")[0]: s for s in connected_now.skipped}
        assert sorted(skipped) == ["", "enormous", "twice"]
        assert "over the 262144-byte limit" in skipped["enormous"]
        assert [n for n in connected_now.tool_names if "twice" in n] == ["mcp_skips_twice"]
        assert "mcp_skips_nul_doc" in connected_now.tool_names
        assert "mcp_skips_echo" in connected_now.tool_names
        answered = dispatch(mcp_mesh, "mcp_skips_nul_doc", {}, conversation="mcp-skips")
        assert json.loads(answered.result.envelope.ok.data_json) == "nul_doc v1"
    finally:
        stub.Disconnect(mpb.DisconnectRequest(name="skips"), timeout=60)
