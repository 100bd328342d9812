"""Tenant isolation with API keys on every service, probed as an attacker would: a caller holding
tenant A's key (knowing tenant B's ids and tool names), a caller with no key, and a caller that
reaches an internal service's port directly, over plain RPCs and over the internal call stream
(toolmesh.mux.v1.MuxService/Calls)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from services.surface.store import SqlSurfaceStore
from services.surface.tier0 import SEED_KEY, Derivation, encode_floor
from shared.auth import key_digest
from shared.clients import cli_channel
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import fresh_database_url
from tests.integration.conftest import Mesh, free_ports, start_mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mux.v1 import mux_pb2 as mxpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.surface.v1 import surface_pb2 as supb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

ADMIN = "iso-admin-key"
KEY_A = "iso-key-a"
KEY_B = "iso-key-b"
CAPPED_A = "iso-capped-a"
KEYS = {
    ADMIN: {"name": "mesh", "tenant_id": "mesh", "admin": True},
    KEY_A: {"name": "backend-a", "tenant_id": "iso-a"},
    KEY_B: {"name": "backend-b", "tenant_id": "iso-b"},
    CAPPED_A: {"name": "analyst-a", "tenant_id": "iso-a", "capabilities": ["analyst"]},
}
SECRET = "iso_b_secret_tool"
B_CONVERSATION = "iso-b-conversation"


@pytest.fixture(scope="module")
def iso(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("tenant-isolation")
    keys = tmp / "keys.json"
    keys.write_text(
        json.dumps({"keys": [{"key_sha256": key_digest(k), **v} for k, v in KEYS.items()]})
    )
    sink, port = collector
    sandbox_port, surface_port = free_ports(2)
    extra = {
        "TOOLMESH_API_KEYS_FILE": str(keys),
        "TOOLMESH_API_KEY": ADMIN,
        "TOOLMESH_SANDBOX_ADDR": f"127.0.0.1:{sandbox_port}",
        "TOOLMESH_SURFACE_ADDR": f"127.0.0.1:{surface_port}",
        "TOOLMESH_TOOL_CACHE_TTL_S": "0",
        "TOOLMESH_SURFACE_FLOOR_TTL_S": "0",
    }
    also = [("sandbox", sandbox_port), ("surface", surface_port)]
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
        response = call(request, timeout=30)
        if not hasattr(response, "ListFields"):  # a server stream
            list(response)
    return info.value.code(), info.value.details() or ""


def dispatch(m: Mesh, key: str, name: str, inputs: dict[str, Any], conversation: str) -> Any:
    dispatcher = stub(m, "dispatcher", key, dispatcher_pb2_grpc.DispatcherServiceStub)
    return dispatcher.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name=name, input_json=json.dumps(inputs)),
            context=pb.CallContext(conversation_id=conversation),
        ),
        timeout=60,
    ).result


@pytest.fixture(scope="module")
def b_has_history(iso: Mesh) -> None:
    """Tenant B's private custom tool, approved and called, and a ping in its conversation."""
    sandbox_b = stub(iso, "sandbox", KEY_B, sandbox_pb2_grpc.SandboxServiceStub)
    sandbox_b.RegisterCustomTool(
        spb.RegisterCustomToolRequest(
            tool=pb.ToolDefinition(
                name=SECRET,
                description="tenant b's private tool",
                implementation="result = 'b-secret-output'",
                input_schema_json=json.dumps({"type": "object"}),
                tenant_id="iso-b",
            )
        ),
        timeout=30,
    )
    sandbox_b.SetCustomToolStatus(
        spb.SetCustomToolStatusRequest(name=SECRET, status=pb.TOOL_STATUS_APPROVED), timeout=30
    )
    for _ in range(3):
        result = dispatch(iso, KEY_B, SECRET, {}, B_CONVERSATION)
        assert result.envelope.WhichOneof("kind") == "ok", result.content
    assert dispatch(iso, KEY_B, "ping", {}, B_CONVERSATION).envelope.HasField("ok")


# --- findings: each failed before its fix ---------------------------------------------------


def test_a_capped_key_cannot_claim_more_capabilities_at_an_internal_service(iso: Mesh) -> None:
    """The dispatcher caps a key's capabilities; the registry and surface, reached directly,
    did not: an analyst-only key claimed telemetry_admin there and read tenant B's usage."""
    registry = stub(iso, "registry", CAPPED_A, registry_pb2_grpc.RegistryServiceStub)
    peek = rpb.ExecuteToolRequest(
        name="query_telemetry",
        input_json=json.dumps({"tenant": "iso-b"}),
        context=pb.CallContext(tenant_id="iso-a", capabilities=["analyst", "telemetry_admin"]),
    )
    # Running a tool at the registry directly needs an admin key at all (it would bypass the
    # dispatcher's policy, budgets and log); the capability cap is checked for the surface.
    code, detail = refused(registry.ExecuteTool, peek)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in detail
    code, _ = refused(
        stub(iso, "registry", CAPPED_A, registry_pb2_grpc.RegistryServiceStub).ExecuteToolStream,
        rpb.ExecuteToolStreamRequest(
            name=peek.name, input_json=peek.input_json, context=peek.context
        ),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    surface = stub(iso, "surface", CAPPED_A, surface_pb2_grpc.SurfaceServiceStub)
    code, detail = refused(
        surface.AssembleTools,
        supb.AssembleToolsRequest(tenant_id="iso-a", capabilities=["telemetry_admin"]),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "telemetry_admin" in detail
    # What the key may claim still works.
    surface.AssembleTools(
        supb.AssembleToolsRequest(tenant_id="iso-a", capabilities=["analyst"]), timeout=30
    )


def test_contract_stats_of_every_tenants_calls_need_an_admin_key(iso: Mesh) -> None:
    dispatch(iso, KEY_B, "ping", {}, B_CONVERSATION)
    code, detail = refused(
        stub(iso, "registry", KEY_A, registry_pb2_grpc.RegistryServiceStub).GetContractStats,
        rpb.GetContractStatsRequest(),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in detail
    admin = stub(iso, "registry", ADMIN, registry_pb2_grpc.RegistryServiceStub)
    assert admin.GetContractStats(rpb.GetContractStatsRequest(), timeout=30).instance


def test_the_tool_floor_never_names_another_tenants_private_tool(
    iso: Mesh, b_has_history: None
) -> None:
    """The shared Tier-0 floor was derived from every tenant's calls, B's private tools
    included, and A's AssembleTools reported those names in `skipped`."""
    admin_surface = stub(iso, "surface", ADMIN, surface_pb2_grpc.SurfaceServiceStub)
    derived = admin_surface.DeriveTier0(supb.DeriveTier0Request(), timeout=60)
    assert SECRET not in derived.names
    surface_a = stub(iso, "surface", KEY_A, surface_pb2_grpc.SurfaceServiceStub)
    assembled = surface_a.AssembleTools(supb.AssembleToolsRequest(tenant_id="iso-a"), timeout=30)
    assert SECRET not in assembled.skipped
    # A floor stored before (or by another version) that names B's tool: still not shown to A,
    # while a name no tenant has is reported as before, and B gets its tool.
    engine = create_engine(iso.database_url)
    try:
        store = SqlSurfaceStore(sessionmaker(bind=engine))
        store.write_seed(
            SEED_KEY, encode_floor(Derivation((*derived.names, SECRET, "iso_no_such_tool")))
        )
    finally:
        engine.dispose()
    assembled = surface_a.AssembleTools(supb.AssembleToolsRequest(tenant_id="iso-a"), timeout=30)
    assert SECRET not in assembled.skipped and "iso_no_such_tool" in assembled.skipped
    surface_b = stub(iso, "surface", KEY_B, surface_pb2_grpc.SurfaceServiceStub)
    assembled_b = surface_b.AssembleTools(supb.AssembleToolsRequest(tenant_id="iso-b"), timeout=30)
    assert SECRET in {t.name for t in assembled_b.tools}
    admin_surface.DeriveTier0(supb.DeriveTier0Request(), timeout=60)


def test_registering_a_taken_name_says_nothing_of_its_owner(iso: Mesh, b_has_history: None) -> None:
    sandbox_a = stub(iso, "sandbox", KEY_A, sandbox_pb2_grpc.SandboxServiceStub)
    details = []
    for name in (SECRET, "ping"):
        code, detail = refused(
            sandbox_a.RegisterCustomTool,
            spb.RegisterCustomToolRequest(
                tool=pb.ToolDefinition(
                    name=name,
                    implementation="result = 1",
                    input_schema_json='{"type": "object"}',
                    tenant_id="iso-a",
                )
            ),
        )
        assert code == grpc.StatusCode.ALREADY_EXISTS
        details.append(detail.replace(name, "NAME"))
    # Tenant B's custom tool and a shared system tool read the same: neither its kind nor
    # its owner is told.
    assert details[0] == details[1], details
    assert "iso-b" not in details[0] and "custom" not in details[0]
    # A build job named after B's tool would record its audit (a rejection) on B's tool:
    # refused when submitted, with the same answer.
    code, detail = refused(
        sandbox_a.SubmitBuildJob,
        spb.SubmitBuildJobRequest(
            request="a tool that adds two numbers",
            tool_name=SECRET,
            context=pb.CallContext(tenant_id="iso-a"),
        ),
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert detail.replace(SECRET, "NAME") == details[0]
    assert not sandbox_a.ListJobs(spb.ListJobsRequest(tenant_id="iso-a"), timeout=30).jobs


# --- checked and found sound ----------------------------------------------------------------


def test_tenant_a_reads_nothing_of_tenant_b_at_the_dispatcher(
    iso: Mesh, b_has_history: None
) -> None:
    admin = stub(iso, "dispatcher", ADMIN, dispatcher_pb2_grpc.DispatcherServiceStub)
    b_log = admin.ListExecutionLog(
        dpb.ListExecutionLogRequest(tenant_id="iso-b", conversation_id=B_CONVERSATION),
        timeout=30,
    ).entries
    b_events = admin.ListConversationEvents(
        dpb.ListConversationEventsRequest(tenant_id="iso-b", conversation_id=B_CONVERSATION),
        timeout=30,
    ).events
    assert b_log and b_events
    a = stub(iso, "dispatcher", KEY_A, dispatcher_pb2_grpc.DispatcherServiceStub)
    for tenant in ("iso-b", "", "*"):
        log = a.ListExecutionLog(
            dpb.ListExecutionLogRequest(tenant_id=tenant, conversation_id=B_CONVERSATION),
            timeout=30,
        ).entries
        events = a.ListConversationEvents(
            dpb.ListConversationEventsRequest(tenant_id=tenant, conversation_id=B_CONVERSATION),
            timeout=30,
        ).events
        exports = a.ListExports(dpb.ListExportsRequest(tenant_id=tenant), timeout=30).exports
        rules = a.ListPolicyRules(dpb.ListPolicyRulesRequest(tenant_id=tenant), timeout=30).rules
        assert not log and not events and not exports
        assert all(r.tenant_id in ("*", "iso-a") for r in rules)
    # B's event by its (guessable) id: the same NOT_FOUND as an event that does not exist.
    answers = []
    for event_id in (b_events[0].id, 10**9):
        code, detail = refused(
            a.GetConversationEventData,
            dpb.GetConversationEventDataRequest(
                tenant_id="iso-b", conversation_id=B_CONVERSATION, event_id=event_id
            ),
        )
        answers.append((code, detail.replace(str(event_id), "ID")))
    assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.NOT_FOUND
    # Cancelling B's conversation acts on A's own conversation of that id only.
    cancelled = a.Cancel(
        dpb.CancelRequest(tenant_id="iso-b", conversation_id=B_CONVERSATION), timeout=30
    )
    assert cancelled.cancelled_calls == 0 and not cancelled.known_conversation
    # B's tool, named by A: not found, exactly as a tool that does not exist.
    contents = []
    dispatcher_a = stub(iso, "dispatcher", KEY_A, dispatcher_pb2_grpc.DispatcherServiceStub)
    for name in (SECRET, "iso_no_such_tool_x"):
        code, detail = refused(
            dispatcher_a.DispatchToolCall,
            dpb.DispatchToolCallRequest(
                tool_use=pb.ToolUse(name=name, input_json="{}"),
                context=pb.CallContext(conversation_id="iso-a-conv"),
            ),
        )
        assert code == grpc.StatusCode.NOT_FOUND
        # The suggestions are the tenant's own tools closest to the name given.
        assert SECRET not in detail.replace(name, "NAME")
        contents.append(detail.replace(name, "NAME").partition(";")[0])
    assert contents[0] == contents[1] and "b-secret" not in contents[0], contents


def test_a_tenant_key_reaches_no_other_tenant_at_any_internal_rpc(
    iso: Mesh, b_has_history: None
) -> None:
    """Every RPC of the registry, surface and sandbox, enumerated from the descriptors: no key
    is UNAUTHENTICATED; tenant A's key naming tenant B (wherever a request names a tenant) is
    PERMISSION_DENIED — and so is every administrative RPC and every RPC naming no tenant but
    reading every tenant's data."""
    services = {
        "registry": rpb.DESCRIPTOR.services_by_name["RegistryService"],
        "surface": supb.DESCRIPTOR.services_by_name["SurfaceService"],
        "sandbox": spb.DESCRIPTOR.services_by_name["SandboxService"],
    }
    modules = {"registry": rpb, "surface": supb, "sandbox": spb}
    open_to_tenants = {"ListModelConfigs"}  # the mesh's model list: no tenant's data
    for service_name, service in services.items():
        for key, expected in (
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("not-a-key", grpc.StatusCode.UNAUTHENTICATED),
            (KEY_A, grpc.StatusCode.PERMISSION_DENIED),
        ):
            channel = cli_channel(iso.address(service_name), api_key=key or "")
            iso.channels.append(channel)
            for method in service.methods:
                request_type = getattr(modules[service_name], method.input_type.name)
                response_type = getattr(modules[service_name], method.output_type.name)
                factory = channel.unary_stream if method.server_streaming else channel.unary_unary
                call = factory(
                    f"/{service.full_name}/{method.name}",
                    request_serializer=request_type.SerializeToString,
                    response_deserializer=response_type.FromString,
                )
                request = request_type()
                fields = request_type.DESCRIPTOR.fields_by_name
                if "tenant_id" in fields:
                    request.tenant_id = "iso-b"
                for holder in ("context", "tool"):
                    if holder in fields:
                        getattr(request, holder).tenant_id = "iso-b"
                if "name" in fields:
                    request.name = SECRET
                if method.name in open_to_tenants and key == KEY_A:
                    call(request, timeout=30)
                    continue
                code, _ = refused(call, request)
                assert code == expected, (service_name, method.name, key, code)


def _calls_stream(address: str, stream_key: str | None, calls: list[mxpb.Call]) -> list[Any]:
    channel = grpc.insecure_channel(address)
    try:
        stream = channel.stream_stream(
            "/toolmesh.mux.v1.MuxService/Calls",
            request_serializer=mxpb.CallsRequest.SerializeToString,
            response_deserializer=mxpb.CallsResponse.FromString,
        )
        metadata = [("authorization", f"Bearer {stream_key}")] if stream_key else None
        replies: dict[int, Any] = {}
        responses = stream(iter([mxpb.CallsRequest(calls=calls)]), metadata=metadata, timeout=30)
        for message in responses:
            for reply in message.replies:
                replies[reply.call_id] = reply
            if len(replies) == len(calls):
                responses.cancel()
                break
        return [replies[c.call_id] for c in calls]
    finally:
        channel.close()


def test_the_call_stream_grants_nothing_a_unary_call_would_not(iso: Mesh) -> None:
    """MuxService/Calls on an internal port: each call is checked like a unary one; a key in a
    call's own metadata never outranks the stream's, and a forged header counts for nothing."""
    method = "/toolmesh.registry.v1.RegistryService/"
    approve = rpb.SetToolStatusRequest(name=SECRET, status=pb.TOOL_STATUS_REJECTED)
    other = rpb.ExecuteToolRequest(
        name="ping", input_json="{}", context=pb.CallContext(tenant_id="iso-b")
    )
    forged = [
        mxpb.MetadataEntry(key="authorization", text="Bearer forged"),
        mxpb.MetadataEntry(key="x-toolmesh-tenant", text="mesh"),
        mxpb.MetadataEntry(key="baggage", text="toolmesh.tenant.id=iso-b"),
    ]

    def call(call_id: int, name: str, request: Any, *, metadata: Any = ()) -> mxpb.Call:
        return mxpb.Call(
            call_id=call_id,
            method=method + name,
            request=request.SerializeToString(),
            metadata=list(metadata),
            timeout_seconds=20,
        )

    registry = iso.address("registry")
    # Without a key the stream itself is refused as it opens, before any call on it is read.
    with pytest.raises(grpc.RpcError) as no_key:
        _calls_stream(
            registry,
            None,
            [call(1, "SetToolStatus", approve), call(2, "SetToolStatus", approve, metadata=forged)],
        )
    assert no_key.value.code() == grpc.StatusCode.UNAUTHENTICATED
    tenant = _calls_stream(
        registry,
        KEY_A,
        [
            call(1, "SetToolStatus", approve, metadata=forged),
            call(2, "ExecuteTool", other, metadata=forged),
            call(
                3,
                "SetToolStatus",
                approve,
                metadata=[mxpb.MetadataEntry(key="authorization", text=f"Bearer {KEY_B}")],
            ),
        ],
    )
    assert [r.code for r in tenant] == [grpc.StatusCode.PERMISSION_DENIED.value[0]] * 3
    # The dispatcher's stream: the tenant is the stream key's, whatever the call claims.
    dispatcher = iso.address("dispatcher")
    (reply,) = _calls_stream(
        dispatcher,
        KEY_A,
        [
            mxpb.Call(
                call_id=1,
                method="/toolmesh.dispatcher.v1.DispatcherService/ListExecutionLog",
                request=dpb.ListExecutionLogRequest(tenant_id="iso-b").SerializeToString(),
                metadata=forged,
                timeout_seconds=20,
            )
        ],
    )
    assert reply.code == 0
    entries = dpb.ListExecutionLogResponse.FromString(reply.response).entries
    assert all(e.tenant_id == "iso-a" for e in entries)
