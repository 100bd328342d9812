"""API keys across the mesh (TOOLMESH_API_KEYS_FILE on every service): each service calls the
others with its own key (TOOLMESH_API_KEY), so a tenant's call still runs end to end —
dispatcher -> registry -> sandbox -> registry (call_tool), registry -> surface — while a
caller that reaches an internal service directly needs a key, an admin key for what
administers or runs things (approving tools, MCP connections, sandbox executions, deriving the
tool floor), and its own tenant otherwise."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.auth import key_digest
from shared.clients import cli_channel
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import fresh_database_url
from tests.integration.conftest import Mesh, free_ports, start_mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.surface.v1 import surface_pb2, surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

SERVICE_KEY = "mesh-service-key"
ROOT = str(Path(__file__).resolve().parents[2])
KEYS = {
    SERVICE_KEY: {"name": "mesh", "tenant_id": "mesh", "admin": True},
    "tenant-key": {"name": "backend-t", "tenant_id": "keyed-t"},
    "other-key": {"name": "backend-o", "tenant_id": "keyed-o"},
}


@pytest.fixture(scope="module")
def keyed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("mesh-auth")
    keys = tmp / "keys.json"
    keys.write_text(
        json.dumps({"keys": [{"key_sha256": key_digest(k), **v} for k, v in KEYS.items()]})
    )
    sink, port = collector
    sandbox_port, bridge_port, surface_port = free_ports(3)
    extra = {
        "TOOLMESH_API_KEYS_FILE": str(keys),
        "TOOLMESH_API_KEY": SERVICE_KEY,
        "TOOLMESH_SANDBOX_ADDR": f"127.0.0.1:{sandbox_port}",
        "TOOLMESH_MCP_BRIDGE_ADDR": f"127.0.0.1:{bridge_port}",
        "TOOLMESH_SURFACE_ADDR": f"127.0.0.1:{surface_port}",
        "TOOLMESH_TOOL_CACHE_TTL_S": "0",
    }
    also = [("sandbox", sandbox_port), ("mcp_bridge", bridge_port), ("surface", surface_port)]
    url = fresh_database_url(request, "sqlite", str(tmp))
    m = start_mesh("sqlite", url, tmp, sink, port, extra, also)
    yield m
    m.close()


def stub(m: Mesh, service: str, key: str | None, factory: Callable[[Any], Any]) -> Any:
    channel = cli_channel(m.address(service), api_key=key or "")
    m.channels.append(channel)
    return factory(channel)


def refused(call: Callable[..., Any], request: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value.code(), info.value.details() or ""


def test_a_tenants_call_runs_end_to_end_through_a_keyed_mesh(keyed: Mesh) -> None:
    sandbox = stub(keyed, "sandbox", "tenant-key", sandbox_pb2_grpc.SandboxServiceStub)
    sandbox.RegisterCustomTool(
        spb.RegisterCustomToolRequest(
            tool=pb.ToolDefinition(
                name="keyed_echo",
                description="echo through call_tool",
                implementation="a = call_tool('ping', {'echo': 7})\nresult = str(a['ok'])",
                input_schema_json=json.dumps({"type": "object"}),
                tenant_id="keyed-t",
            )
        ),
        timeout=30,
    )
    admin_registry = stub(keyed, "registry", SERVICE_KEY, registry_pb2_grpc.RegistryServiceStub)
    admin_registry.SetToolStatus(
        rpb.SetToolStatusRequest(name="keyed_echo", status=pb.TOOL_STATUS_APPROVED), timeout=30
    )
    dispatcher = stub(keyed, "dispatcher", "tenant-key", dispatcher_pb2_grpc.DispatcherServiceStub)

    def dispatch(name: str, input_json: str) -> pb.ToolResult:
        request = dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name=name, input_json=input_json),
            context=pb.CallContext(conversation_id="keyed-conv"),
        )
        result: pb.ToolResult = dispatcher.DispatchToolCall(request, timeout=60).result
        assert result.envelope.WhichOneof("kind") == "ok", result.content
        return result

    assert dispatch("keyed_echo", "{}").content == "True"
    # search_tools: the registry asks the surface with its own key.
    dispatch("search_tools", '{"query": "run a SQL query"}')


def test_internal_services_refuse_callers_without_the_right_key(keyed: Mesh) -> None:
    def registry(key: str | None) -> Any:
        return stub(keyed, "registry", key, registry_pb2_grpc.RegistryServiceStub)

    ping = rpb.ExecuteToolRequest(
        name="ping", input_json="{}", context=pb.CallContext(tenant_id="keyed-t")
    )
    code, detail = refused(registry(None).ExecuteTool, ping)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "API key" in detail
    code, _ = refused(registry("not-a-key").ExecuteTool, ping)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # Running a tool directly would bypass the dispatcher's policy rules, rate limits,
    # budgets and log: only the mesh's own (admin) keys may.
    for key in ("tenant-key", "other-key"):
        code, detail = refused(registry(key).ExecuteTool, ping)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in detail
    assert registry(SERVICE_KEY).ExecuteTool(ping, timeout=30).result.envelope.HasField("ok")
    code, _ = refused(registry("tenant-key").ListTools, rpb.ListToolsRequest())
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, detail = refused(
        registry("tenant-key").SetToolStatus,
        rpb.SetToolStatusRequest(name="ping", status=pb.TOOL_STATUS_REJECTED),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in detail

    # The bridge runs commands: only the mesh's admin keys may touch it.
    bridge_t = stub(keyed, "mcp_bridge", "tenant-key", mcp_bridge_pb2_grpc.McpBridgeServiceStub)
    launch = mpb.ConnectRequest(
        server=mpb.ServerConfig(
            name="evil",
            transport=mpb.TRANSPORT_STDIO,
            command="/bin/sh",
            args=["-c", "touch /tmp/toolmesh-pwned"],
            tenant_id="keyed-t",
        )
    )
    code, _ = refused(bridge_t.Connect, launch)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert not Path("/tmp/toolmesh-pwned").exists()
    code, _ = refused(
        stub(keyed, "mcp_bridge", None, mcp_bridge_pb2_grpc.McpBridgeServiceStub).ListConnections,
        mpb.ListConnectionsRequest(),
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    admin_bridge = stub(keyed, "mcp_bridge", SERVICE_KEY, mcp_bridge_pb2_grpc.McpBridgeServiceStub)
    admin_bridge.ListConnections(mpb.ListConnectionsRequest(), timeout=30)

    # Only the registry (an admin key) runs code in the sandbox.
    sandbox_t = stub(keyed, "sandbox", "tenant-key", sandbox_pb2_grpc.SandboxServiceStub)
    code, _ = refused(
        sandbox_t.Execute,
        spb.ExecuteRequest(
            tool_name="x", code="result = 1", input_json="{}", context=pb.CallContext()
        ),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED

    # The surface: a tenant assembles its own tools only; deriving the floor is an admin's.
    surface_t = stub(keyed, "surface", "tenant-key", surface_pb2_grpc.SurfaceServiceStub)
    surface_t.AssembleTools(surface_pb2.AssembleToolsRequest(tenant_id="keyed-t"), timeout=30)
    code, _ = refused(
        surface_t.AssembleTools, surface_pb2.AssembleToolsRequest(tenant_id="keyed-o")
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, _ = refused(surface_t.DeriveTier0, surface_pb2.DeriveTier0Request())
    assert code == grpc.StatusCode.PERMISSION_DENIED

    # Health stays open, for load balancers and orchestrators.
    for service in ("registry", "mcp_bridge", "sandbox", "surface"):
        health = stub(keyed, service, None, health_pb2_grpc.HealthStub)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_every_mcp_bridge_rpc_needs_an_admin_key(keyed: Mesh) -> None:
    # Enumerated from the service descriptor: an RPC added to the bridge is covered at once.
    service = mpb.DESCRIPTOR.services_by_name["McpBridgeService"]
    assert {"CallTool", "CallToolUnary"} <= set(service.methods_by_name)
    for key, expected in (
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("not-a-key", grpc.StatusCode.UNAUTHENTICATED),
        ("tenant-key", grpc.StatusCode.PERMISSION_DENIED),
    ):
        channel = cli_channel(keyed.address("mcp_bridge"), api_key=key or "")
        keyed.channels.append(channel)
        for method in service.methods:
            request_type = getattr(mpb, method.input_type.name)
            response_type = getattr(mpb, method.output_type.name)
            factory = channel.unary_stream if method.server_streaming else channel.unary_unary
            call = factory(
                f"/{service.full_name}/{method.name}",
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
            # The tenant key's own tenant wherever a request names one: refused all the same.
            request = request_type()
            if "context" in request_type.DESCRIPTOR.fields_by_name:
                request.context.tenant_id = "keyed-t"
            if "server" in request_type.DESCRIPTOR.fields_by_name:
                request.server.tenant_id = "keyed-t"
            with pytest.raises(grpc.RpcError) as info:
                response = call(request, timeout=30)
                if method.server_streaming:
                    list(response)
            assert info.value.code() == expected, (method.name, key)


def test_a_tenants_mcp_calls_reach_the_bridge_with_the_registrys_key(keyed: Mesh) -> None:
    admin_bridge = stub(keyed, "mcp_bridge", SERVICE_KEY, mcp_bridge_pb2_grpc.McpBridgeServiceStub)
    admin_bridge.Connect(
        mpb.ConnectRequest(
            server=mpb.ServerConfig(
                name="keyedraw",
                transport=mpb.TRANSPORT_STDIO,
                command=sys.executable,
                args=["-m", "tests.mcp_servers.raw_server"],
                env={"PYTHONPATH": ROOT},
                tenant_id="keyed-t",
            )
        ),
        timeout=60,
    )
    dispatcher = stub(keyed, "dispatcher", "tenant-key", dispatcher_pb2_grpc.DispatcherServiceStub)
    context = pb.CallContext(conversation_id="keyed-mcp")
    # No progress listener: the registry calls CallToolUnary.
    echoed = dispatcher.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name="mcp_keyedraw_echo", input_json='{"message": "k"}'),
            context=context,
        ),
        timeout=60,
    ).result
    assert json.loads(echoed.envelope.ok.data_json) == "Echo: k", echoed.content
    # A streaming caller: the registry calls the CallTool stream.
    messages = list(
        dispatcher.DispatchToolCallStream(
            dpb.DispatchToolCallStreamRequest(
                tool_use=pb.ToolUse(name="mcp_keyedraw_progress", input_json="{}"),
                context=context,
            ),
            timeout=60,
        )
    )
    kinds = [m.WhichOneof("event") for m in messages]
    # Three notifications; a hop may send only the latest of those not yet sent (coalescing).
    assert 1 <= kinds.count("progress") <= 3 and kinds[-1] == "result"
    last = [m.progress for m in messages if m.WhichOneof("event") == "progress"][-1]
    assert last.fraction == pytest.approx(1.0)
    assert json.loads(messages[-1].result.result.envelope.ok.data_json) == "done"
