"""search_tools for the conversation's model (CallContext.model) over the surface's gRPC API: a
resident tool the model's native capability replaces is not on the model's surface, so a search
never calls it already available (it pages it in, and a paged-in tool is kept, as the spec
says), the budget counts the surface the model really sees, a SearchTools request that names
the model only in its context is filtered the same way, and a context model no config could
have is refused like the other context identifiers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.surface.assembly import MAX_TOOL_SURFACE
from services.surface.core import SurfaceCore
from services.surface.servicer import SurfaceServicer
from services.surface.store import SqlSurfaceStore
from shared.db.models import ToolDefinitionRow
from shared.llm.config import ModelConfig, ModelConfigStore
from shared.rpc_errors import from_rpc_error
from shared.server import ServiceBinding, create_server
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

# openai_responses delivers web_search natively, so its model config claiming it filters the
# web_search tool out of the resident floor (the double guard of the spec).
NATIVE_MODEL = "gpt-native-search"
# A model whose provider delivers nothing natively: it filters nothing.
PLAIN_MODEL = "gpt-plain"
GROUPS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf")


def add_tool(
    sessions: sessionmaker[Session], name: str, description: str, replaced_by: str | None = None
) -> None:
    with sessions.begin() as s:
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


@pytest.fixture
def tools(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    for name in ("search_tools", "query"):  # in the floor with web_search
        add_tool(sessions, name, f"the {name} tool")
    add_tool(
        sessions,
        "web_search",
        "Search the web and return result snippets with links",
        replaced_by="web_search",
    )
    for i in range(130):
        add_tool(sessions, f"widget_{i}", f"widget {GROUPS[i // 20]} operation")
    for model, provider in ((NATIVE_MODEL, "openai_responses"), (PLAIN_MODEL, "openai")):
        ModelConfigStore(sessions).upsert(
            ModelConfig(
                model=model,
                provider=provider,
                max_output_tokens=1024,
                capabilities=frozenset({"web_search"}),
            )
        )
    return sessions


@pytest.fixture
async def surface(
    tools: sessionmaker[Session],
) -> AsyncIterator[surface_pb2_grpc.SurfaceServiceStub]:
    core = SurfaceCore(SqlSurfaceStore(tools), ModelConfigStore(tools), None, catalog_ttl_s=0.0)
    binding = ServiceBinding(
        surface_pb2_grpc.add_SurfaceServiceServicer_to_server,
        SurfaceServicer(core),
        spb.DESCRIPTOR.services_by_name["SurfaceService"].full_name,
    )
    server, port, _ = await create_server([binding], host="127.0.0.1", port=0, tracing=False)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield surface_pb2_grpc.SurfaceServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)
        await core.close()


def context(conversation: str, model: str = "") -> pb.CallContext:
    return pb.CallContext(tenant_id="t", conversation_id=conversation, model=model)


async def search(
    stub: surface_pb2_grpc.SurfaceServiceStub, query: str, ctx: pb.CallContext, limit: int = 1
) -> spb.SearchToolsResponse:
    return await stub.SearchTools(
        spb.SearchToolsRequest(query=query, limit=limit, context=ctx), timeout=30
    )


async def assemble(
    stub: surface_pb2_grpc.SurfaceServiceStub, conversation: str, model: str
) -> list[str]:
    response = await stub.AssembleTools(
        spb.AssembleToolsRequest(tenant_id="t", conversation_id=conversation, model=model),
        timeout=30,
    )
    return [t.name for t in response.tools]


async def test_a_tool_the_models_native_capability_replaces_is_not_called_available(
    surface: surface_pb2_grpc.SurfaceServiceStub,
) -> None:
    # Without a model nothing is filtered: the floor's web_search is on the surface.
    unfiltered = await search(surface, "search the web for snippets", context("no-model"))
    assert list(unfiltered.already_available) == ["web_search"] and not unfiltered.paged_in
    assert "web_search" not in await assemble(surface, "native", NATIVE_MODEL)
    found = await search(surface, "search the web for snippets", context("native", NATIVE_MODEL))
    # Before: "already available" -- the model was told of a tool its array did not hold.
    assert "web_search" not in found.already_available
    assert list(found.paged_in) == ["web_search"]
    # The model asked for it: a paged-in tool is never capability-filtered.
    assert "web_search" in await assemble(surface, "native", NATIVE_MODEL)


async def test_the_budget_counts_the_surface_the_model_sees(
    surface: surface_pb2_grpc.SurfaceServiceStub,
) -> None:
    ctx = context("full", NATIVE_MODEL)
    refusal = ""
    for group in GROUPS:
        refusal = refusal or (await search(surface, f"{group} widget", ctx, limit=20)).refusal
    assert f"budget of {MAX_TOOL_SURFACE}" in refusal
    # The floor's web_search is not on this model's surface: its slot went to a widget (with
    # the budget counted on the unfiltered surface, the model saw 119 tools).
    tools = await assemble(surface, "full", NATIVE_MODEL)
    assert "web_search" not in tools and len(tools) == MAX_TOOL_SURFACE


async def test_the_contexts_model_is_used_unless_the_request_names_one(
    surface: surface_pb2_grpc.SurfaceServiceStub,
) -> None:
    def request(conversation: str, model: str) -> spb.SearchToolsRequest:
        return spb.SearchToolsRequest(
            query="search the web for snippets",
            limit=1,
            model=model,
            context=context(conversation, NATIVE_MODEL),
        )

    from_context = await surface.SearchTools(request("context", ""), timeout=30)
    assert list(from_context.paged_in) == ["web_search"]
    # SearchToolsRequest.model, where a client sets it, is the one the search is for.
    own = await surface.SearchTools(request("own", PLAIN_MODEL), timeout=30)
    assert list(own.already_available) == ["web_search"]


@pytest.mark.parametrize(
    ("model", "reason", "code"),
    [
        ("m" * 129, "ID_TOO_LONG", grpc.StatusCode.INVALID_ARGUMENT),
        ("gpt\n4", "ID_INVALID", grpc.StatusCode.INVALID_ARGUMENT),
        ("no-such-model", "MODEL_NOT_CONFIGURED", grpc.StatusCode.NOT_FOUND),
    ],
)
async def test_a_context_model_no_config_could_have_is_refused(
    surface: surface_pb2_grpc.SurfaceServiceStub, model: str, reason: str, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await search(surface, "widget", context("bad-model", model))
    assert caught.value.code() == code
    error = from_rpc_error(caught.value)
    assert error.reason == reason
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert [f for f, _ in error.field_violations] == ["context.model"]
