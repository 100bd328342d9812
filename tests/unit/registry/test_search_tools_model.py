"""The conversation's model (CallContext.model) in the registry: read into the handler's context,
written back on every call the registry makes with it (a composed tool call, the surface's
SearchTools), and search_tools asking the surface with it, so the surface searches against the
model's capability-filtered surface. The surface here is the real servicer and core over the
test database, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from services.registry.servicer import GrpcToolCaller, context_from_pb, context_to_pb
from services.registry.tools import surface as search_tool
from services.surface.core import SurfaceCore
from services.surface.servicer import SurfaceServicer
from services.surface.store import SqlSurfaceStore
from shared import convert
from shared.config import Settings
from shared.contract import Err, Ok, envelope_to_tool_result
from shared.db.models import ToolDefinitionRow
from shared.llm.config import ModelConfig, ModelConfigStore
from shared.server import ServiceBinding, create_server
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

NATIVE_MODEL = "gpt-native-search"  # openai_responses claiming web_search: filters web_search


class RecordingSurface(SurfaceServicer):
    """The real surface servicer, keeping the SearchTools requests it was sent."""

    def __init__(self, core: SurfaceCore) -> None:
        super().__init__(core)
        self.requests: list[spb.SearchToolsRequest] = []

    async def SearchTools(
        self, request: spb.SearchToolsRequest, context: grpc.aio.ServicerContext
    ) -> spb.SearchToolsResponse:
        self.requests.append(request)
        return await super().SearchTools(request, context)


@dataclass
class Surface:
    address: str
    servicer: RecordingSurface


@pytest.fixture
async def surface(sessions: sessionmaker[Session]) -> AsyncIterator[Surface]:
    with sessions.begin() as s:
        for name, description, replaced_by in (
            ("search_tools", "the search_tools tool", None),
            ("web_search", "Search the web and return result snippets with links", "web_search"),
            ("crm_create_lead", "Create a sales lead in the CRM", None),
        ):
            s.add(
                ToolDefinitionRow(
                    name=name,
                    description=description,
                    input_schema={"type": "object"},
                    tool_type="custom",
                    status="approved",
                    replaced_by_model_capability=replaced_by,
                )
            )
    ModelConfigStore(sessions).upsert(
        ModelConfig(
            model=NATIVE_MODEL,
            provider="openai_responses",
            max_output_tokens=1024,
            capabilities=frozenset({"web_search"}),
        )
    )
    core = SurfaceCore(
        SqlSurfaceStore(sessions), ModelConfigStore(sessions), None, catalog_ttl_s=0.0
    )
    servicer = RecordingSurface(core)
    binding = ServiceBinding(
        surface_pb2_grpc.add_SurfaceServiceServicer_to_server,
        servicer,
        spb.DESCRIPTOR.services_by_name["SurfaceService"].full_name,
    )
    server, port, _ = await create_server([binding], host="127.0.0.1", port=0, tracing=False)
    address = f"127.0.0.1:{port}"
    try:
        yield Surface(address, servicer)
    finally:
        # search_tools keeps one channel per (event loop, address): this test's is closed here.
        for key in [k for k in search_tool._CHANNELS if k[1] == address]:
            await search_tool._CHANNELS.pop(key).close()
        await server.stop(None)
        await core.close()


def tool_context(surface: Surface, model: str, conversation: str) -> ToolContext:
    settings = Settings.from_env({}).with_overrides(
        addresses={"surface": surface.address}, tracing=False
    )
    return ToolContext(
        tool_name="search_tools",
        tenant_id="t",
        conversation_id=conversation,
        model=model,
        settings=settings,
    )


async def test_search_tools_asks_the_surface_with_the_conversations_model(
    surface: Surface,
) -> None:
    # Without a model nothing is filtered: the floor's web_search is already available.
    unfiltered = await search_tool.search_tools(
        {"query": "search the web for snippets", "limit": 1},
        tool_context(surface, "", "no-model"),
    )
    assert isinstance(unfiltered.envelope, Ok), unfiltered.content
    assert unfiltered.envelope.data["already_available"] == ["web_search"]
    result = await search_tool.search_tools(
        {"query": "search the web for snippets", "limit": 1},
        tool_context(surface, NATIVE_MODEL, "native"),
    )
    request = surface.servicer.requests[-1]
    assert request.model == NATIVE_MODEL and request.context.model == NATIVE_MODEL
    assert isinstance(result.envelope, Ok), result.content
    data = result.envelope.data
    # web_search is filtered out of this model's floor: not "already available", paged in.
    assert data["paged_in"] == ["web_search"] and data["already_available"] == []


async def test_search_tools_for_a_model_without_a_config_is_an_err(surface: Surface) -> None:
    result = await search_tool.search_tools(
        {"query": "search the web"}, tool_context(surface, "no-such-model", "unknown")
    )
    assert isinstance(result.envelope, Err)
    assert result.envelope.err_kind == "model_not_configured"


def test_the_model_survives_the_registrys_context_both_ways() -> None:
    message = pb.CallContext(tenant_id="t", conversation_id="c", model=NATIVE_MODEL)
    context = context_from_pb(message, "search_tools")
    assert context.model == NATIVE_MODEL
    assert context_to_pb(context).model == NATIVE_MODEL


class RecordingRegistry(registry_pb2_grpc.RegistryServiceServicer):
    """A registry that answers every ExecuteTool with an empty Ok and keeps the request."""

    def __init__(self) -> None:
        self.requests: list[rpb.ExecuteToolRequest] = []

    async def ExecuteTool(
        self, request: rpb.ExecuteToolRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ExecuteToolResponse:
        self.requests.append(request)
        return rpb.ExecuteToolResponse(
            result=convert.tool_result_to_pb(envelope_to_tool_result(Ok(data={})))
        )


async def test_a_composed_call_carries_the_model_one_level_deeper() -> None:
    registry = RecordingRegistry()
    binding = ServiceBinding(
        registry_pb2_grpc.add_RegistryServiceServicer_to_server,
        registry,
        rpb.DESCRIPTOR.services_by_name["RegistryService"].full_name,
    )
    server, port, _ = await create_server([binding], host="127.0.0.1", port=0, tracing=False)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        caller = GrpcToolCaller(registry_pb2_grpc.RegistryServiceStub(channel), tracing=False)
        context = ToolContext(
            tool_name="outer", tenant_id="t", tool_use_id="toolu_1", model=NATIVE_MODEL
        )
        await caller.call_tool("search_tools", {"query": "web"}, context)
    finally:
        await channel.close()
        await server.stop(None)
    (request,) = registry.requests
    assert request.context.model == NATIVE_MODEL
    assert request.context.depth == 1 and request.context.parent_tool_use_id == "toolu_1"
