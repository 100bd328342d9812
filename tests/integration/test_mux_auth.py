"""Call streams (toolmesh.mux.v1.MuxService/Calls) to a service with API keys, through real
processes: a stream opens only with a valid key in its own metadata, and is refused at once
otherwise, as a unary call without that key is, however long its caller means to hold it; the
mesh's own streams (its admin key) carry its calls as before; and a client whose key is refused
fails its calls at once, UNAUTHENTICATED, holding no stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from shared.auth import key_digest
from shared.clients import cli_channel, open_channel
from shared.mux import CALLS_METHOD, MuxChannel
from shared.rpc_errors import DETAILS_KEY, from_rpc_error
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import fresh_database_url
from tests.integration.conftest import Mesh, start_mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mux.v1 import mux_pb2 as mxpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

SERVICE_KEY = "mux-auth-mesh-key"
TENANT_KEY = "mux-auth-tenant-key"
KEYS: dict[str, dict[str, Any]] = {
    SERVICE_KEY: {"name": "mesh", "tenant_id": "mesh", "admin": True},
    TENANT_KEY: {"name": "backend", "tenant_id": "mux-t"},
}
LIST_TOOLS = "/toolmesh.registry.v1.RegistryService/ListTools"


@pytest.fixture(scope="module")
def keyed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    """Registry and dispatcher with API keys; each calls the other with the mesh's key."""
    tmp = tmp_path_factory.mktemp("mux-auth")
    keys = tmp / "keys.json"
    keys.write_text(
        json.dumps({"keys": [{"key_sha256": key_digest(k), **v} for k, v in KEYS.items()]})
    )
    sink, port = collector
    extra = {"TOOLMESH_API_KEYS_FILE": str(keys), "TOOLMESH_API_KEY": SERVICE_KEY}
    m = start_mesh(
        "sqlite", fresh_database_url(request, "sqlite", str(tmp)), tmp, sink, port, extra
    )
    yield m
    m.close()


def _bearer(key: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {key}"),) if key else None


def _refusal(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, Any]:
    """What a refusal carries: code, message and the google.rpc.Status (ErrorInfo) trailer."""
    return (
        error.code(),
        error.details() or "",
        dict(error.trailing_metadata() or ()).get(DETAILS_KEY),
    )


async def test_a_call_stream_without_a_valid_key_is_refused_as_it_opens(keyed: Mesh) -> None:
    channel = grpc.aio.insecure_channel(keyed.address("registry"))
    open_stream = channel.stream_stream(
        CALLS_METHOD,
        request_serializer=mxpb.CallsRequest.SerializeToString,
        response_deserializer=mxpb.CallsResponse.FromString,
    )
    list_tools = channel.unary_unary(
        LIST_TOOLS,
        request_serializer=rpb.ListToolsRequest.SerializeToString,
        response_deserializer=rpb.ListToolsResponse.FromString,
    )
    try:
        for key, reason in ((None, "API_KEY_MISSING"), ("not-a-key", "API_KEY_UNKNOWN")):
            # Many at once, each held open by its caller (never half-closed): all refused.
            streams = [open_stream(metadata=_bearer(key)) for _ in range(50)]
            ends = await asyncio.wait_for(
                asyncio.gather(*(s.read() for s in streams), return_exceptions=True), 15
            )
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await list_tools(rpb.ListToolsRequest(), metadata=_bearer(key), timeout=15)
            for end in ends:
                assert isinstance(end, grpc.aio.AioRpcError), end
                assert end.code() == grpc.StatusCode.UNAUTHENTICATED, end.details()
                assert from_rpc_error(end).reason == reason
                assert _refusal(end) == _refusal(unary.value)  # the unary call's refusal
        # A stream with a valid key opens; the calls on it are still checked one by one.
        admitted = open_stream(metadata=_bearer(TENANT_KEY))
        await admitted.write(
            mxpb.CallsRequest(
                calls=[
                    mxpb.Call(
                        call_id=1,
                        method=LIST_TOOLS,
                        request=rpb.ListToolsRequest().SerializeToString(),
                        timeout_seconds=15,
                    )
                ]
            )
        )
        message = await asyncio.wait_for(admitted.read(), 15)
        (reply,) = message.replies
        assert reply.code == grpc.StatusCode.PERMISSION_DENIED.value[0]  # as unary: not its tenant
        admitted.cancel()
    finally:
        await channel.close()


async def test_the_dispatchers_call_streams_open_only_with_a_key_too(keyed: Mesh) -> None:
    """The dispatcher checks its callers' keys in its servicer, not through the handler
    wrapper's auth: its call streams are admitted by the same keys."""
    channel = grpc.aio.insecure_channel(keyed.address("dispatcher"))
    open_stream = channel.stream_stream(
        CALLS_METHOD,
        request_serializer=mxpb.CallsRequest.SerializeToString,
        response_deserializer=mxpb.CallsResponse.FromString,
    )
    dispatch = "/toolmesh.dispatcher.v1.DispatcherService/DispatchToolCall"
    try:
        for key, reason in ((None, "API_KEY_MISSING"), ("not-a-key", "API_KEY_UNKNOWN")):
            streams = [open_stream(metadata=_bearer(key)) for _ in range(20)]
            ends = await asyncio.wait_for(
                asyncio.gather(*(s.read() for s in streams), return_exceptions=True), 15
            )
            for end in ends:
                assert isinstance(end, grpc.aio.AioRpcError), end
                assert end.code() == grpc.StatusCode.UNAUTHENTICATED, end.details()
                assert from_rpc_error(end).reason == reason
        admitted = open_stream(metadata=_bearer(TENANT_KEY))
        request = dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name="ping", input_json='{"echo": 5}'),
            context=pb.CallContext(conversation_id="mux-auth-stream"),
        )
        await admitted.write(
            mxpb.CallsRequest(
                calls=[
                    mxpb.Call(
                        call_id=1,
                        method=dispatch,
                        request=request.SerializeToString(),
                        timeout_seconds=30,
                    )
                ]
            )
        )
        message = await asyncio.wait_for(admitted.read(), 30)
        (reply,) = message.replies
        assert reply.code == 0, reply
        answer = dpb.DispatchToolCallResponse.FromString(reply.response)
        assert not answer.result.error and "5" in answer.result.content
        admitted.cancel()
    finally:
        await channel.close()


async def test_the_mesh_calls_over_keyed_streams_and_a_refused_client_fails_at_once(
    keyed: Mesh,
) -> None:
    # dispatcher -> registry over the dispatcher's call streams, with the mesh's key.
    dispatcher = cli_channel(keyed.address("dispatcher"), api_key=TENANT_KEY)
    keyed.channels.append(dispatcher)
    result = (
        dispatcher_pb2_grpc.DispatcherServiceStub(dispatcher)
        .DispatchToolCall(
            dpb.DispatchToolCallRequest(
                tool_use=pb.ToolUse(name="ping", input_json='{"echo": 3}'),
                context=pb.CallContext(conversation_id="mux-auth-conv"),
            ),
            timeout=60,
        )
        .result
    )
    assert result.envelope.WhichOneof("kind") == "ok", result.content

    registry = keyed.address("registry")
    mesh = open_channel(registry, api_key=SERVICE_KEY)
    keyless = open_channel(registry, api_key="")
    wrong = open_channel(registry, api_key="not-a-key")
    try:
        assert isinstance(mesh, MuxChannel)
        tools = await registry_pb2_grpc.RegistryServiceStub(mesh).ListTools(
            rpb.ListToolsRequest(), timeout=15
        )
        assert any(t.name == "ping" for t in tools.tools)
        assert any(c is not None and not c.closed for c in mesh._slots)  # over its stream
        for channel, reason in ((keyless, "API_KEY_MISSING"), (wrong, "API_KEY_UNKNOWN")):
            assert isinstance(channel, MuxChannel)
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            ends = await asyncio.wait_for(
                asyncio.gather(
                    *(stub.ListTools(rpb.ListToolsRequest(), timeout=15) for _ in range(20)),
                    return_exceptions=True,
                ),
                15,
            )
            for end in ends:
                assert isinstance(end, grpc.aio.AioRpcError), end
                assert end.code() == grpc.StatusCode.UNAUTHENTICATED, end.details()
                assert from_rpc_error(end).reason == reason
            assert all(c is None or c.closed for c in channel._slots)  # it holds no stream
    finally:
        for channel in (mesh, keyless, wrong):
            await channel.close()
