"""What an administrator sets on a registered MCP tool survives the bridge listing the server's
tools again (an announced change, Reconnect, a restarted bridge): extra required capabilities
(UpsertTools), a disable (SetToolStatus), category and timeout, a review of an unchanged
definition. The bridge owns only what the server declares and its destructive gate, which
follows the server's hint and the bridge's setting. In one process: the bridge registers through
the registry's own UpsertTools (GrpcToolSink against a RegistryServicer on loopback), and the
registry runs the tools through the bridge (ExecuteTool over McpRoute)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.model import ToolRegistration
from services.mcp_bridge.servicer import McpBridgeServicer
from services.mcp_bridge.sink import GrpcToolSink
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.core import Registry
from services.registry.mcp_route import McpRoute
from services.registry.repository import SqlToolRepository
from services.registry.servicer import RegistryServicer
from shared.contract import Err, Ok
from tests.unit.mcp_bridge.conftest import raw_config
from tests.unit.mcp_bridge.test_annotations import Mesh, inventory, tool
from tests.unit.mcp_bridge.test_tool_changes import settled
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

GATE = "mcp.destructive"
ADMIN = "billing.admin"


class MeanwhileSink(GrpcToolSink):
    """GrpcToolSink where, once `meanwhile` is set, an administrator acts after the bridge has
    read the connection's rows and before its registration reaches the registry."""

    meanwhile: Callable[[], Awaitable[None]] | None = None

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        action, self.meanwhile = self.meanwhile, None
        if action is not None:
            await action()
        await super().upsert(tools)


@dataclass
class SinkMesh(Mesh):
    sink: MeanwhileSink | None = None


@asynccontextmanager
async def mesh(sessions: sessionmaker[Session], **bridge_options: Any) -> AsyncIterator[SinkMesh]:
    """A registry and a bridge serving on one loopback port (test_annotations.mesh, with a
    MeanwhileSink as the bridge's)."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address)
    stub = registry_pb2_grpc.RegistryServiceStub(channel)
    repo = SqlToolRepository(sessions)
    sink = MeanwhileSink(stub, tracing=False)
    bridge = McpBridge(
        SqlConnectionStore(sessions),
        sink,
        connect_timeout_s=20.0,
        backoff_s=0.1,
        backoff_max_s=0.5,
        **bridge_options,
    )
    route = McpRoute(address, tracing=False)
    registry = Registry(repo, routes={"mcp": route}, cache_ttl_s=0.0)
    registry_pb2_grpc.add_RegistryServiceServicer_to_server(
        RegistryServicer(registry, max_input_bytes=1 << 20), server
    )
    mcp_bridge_pb2_grpc.add_McpBridgeServiceServicer_to_server(McpBridgeServicer(bridge), server)
    await server.start()
    try:
        yield SinkMesh(bridge, stub, repo, sink)
    finally:
        await bridge.stop()
        await route.close()
        await channel.close()
        await server.stop(None)
        registry.close()


async def administer(m: Mesh, name: str, **changes: Any) -> None:
    """An administrator's UpsertTools: the definition read with GetTool, changed, written back."""
    definition = await m.get(name)
    for field, value in changes.items():
        if field == "required_capabilities":
            del definition.required_capabilities[:]
            definition.required_capabilities.extend(value)
        else:
            setattr(definition, field, value)
    await m.registry.UpsertTools(rpb.UpsertToolsRequest(tools=[definition]))


async def capabilities(m: Mesh, name: str) -> list[str]:
    return list((await m.get(name)).required_capabilities)


async def relisted(m: Mesh, connection: str = "inv") -> None:
    """The server announces a change (its `reload` tool); returns once it was registered."""
    before = {c.server.name: c for c in m.bridge.list_connections()}[connection]
    assert (await m.bridge.call_tool(connection, "reload", {})).envelope == Ok(
        data="reloaded 3 tools"
    )
    await settled(m.bridge, connection, lambda c: c.tool_list_changes > before.tool_list_changes)


def announcing(listed: Path) -> Any:
    return raw_config("inv", "--inventory", str(listed), "--announce-changes")


async def test_what_an_administrator_set_survives_every_kind_of_relisting(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    listed = inventory(
        tmp_path / "inventory.json",
        tool("purge", annotations={"destructiveHint": True}),
        tool("peek", annotations={"readOnlyHint": True}),
        tool("plain"),
    )

    async def unchanged_by_the_listing(m: Mesh) -> None:
        assert await capabilities(m, "mcp_inv_purge") == [GATE, ADMIN]
        assert (await m.get("mcp_inv_purge")).timeout_seconds == 30.0
        peek = await m.get("mcp_inv_peek")
        assert (list(peek.required_capabilities), peek.category) == ([ADMIN], "internal")
        assert not (await m.get("mcp_inv_plain")).enabled
        for name, caller in (("purge", [GATE]), ("purge", [ADMIN]), ("peek", [])):
            refused = await m.run(f"mcp_inv_{name}", *caller)
            assert isinstance(refused, Err) and refused.err_kind == "permission_denied"
        assert await m.run("mcp_inv_purge", GATE, ADMIN) == Ok(data="purge v1")
        assert await m.run("mcp_inv_peek", ADMIN) == Ok(data="peek v1")

    async with mesh(sqlite_sessions, destructive_capability=GATE) as m:
        await m.bridge.connect(announcing(listed))
        assert await capabilities(m, "mcp_inv_purge") == [GATE]
        await administer(
            m, "mcp_inv_purge", required_capabilities=[GATE, ADMIN], timeout_seconds=30.0
        )
        await administer(m, "mcp_inv_peek", required_capabilities=[ADMIN], category="internal")
        await m.registry.SetToolStatus(
            rpb.SetToolStatusRequest(name="mcp_inv_plain", enabled=False)
        )

        await relisted(m)  # notifications/tools/list_changed
        await unchanged_by_the_listing(m)
        await m.bridge.reconnect("inv")
        await unchanged_by_the_listing(m)
    async with mesh(sqlite_sessions, destructive_capability=GATE) as m:
        assert await m.bridge.restore() == ["inv"]  # a restarted bridge lists them again
        await settled(m.bridge, "inv", lambda c: c.state == "connected")
        await unchanged_by_the_listing(m)


async def test_the_gate_follows_the_hint_and_the_setting_and_the_administrators_capability_stays(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    def offer(*purge_annotations: dict[str, Any]) -> Path:
        return inventory(
            tmp_path / "inventory.json",
            *(tool("purge", annotations=a) for a in purge_annotations),
            tool("keep"),
            tool("plain"),
        )

    async def approve(m: Mesh) -> None:  # each hint change is a changed definition, held
        assert (await m.get("mcp_inv_purge")).status == pb.TOOL_STATUS_TESTING
        await m.registry.SetToolStatus(
            rpb.SetToolStatusRequest(name="mcp_inv_purge", status=pb.TOOL_STATUS_APPROVED)
        )

    listed = offer({"destructiveHint": True})
    async with mesh(sqlite_sessions, destructive_capability=GATE) as m:
        await m.bridge.connect(announcing(listed))
        await administer(m, "mcp_inv_purge", required_capabilities=[ADMIN, GATE])

        offer({"destructiveHint": False})  # the server drops the hint
        await relisted(m)
        await approve(m)
        assert await capabilities(m, "mcp_inv_purge") == [ADMIN]
        assert await m.run("mcp_inv_purge", ADMIN) == Ok(data="purge v1")

        offer({"destructiveHint": True})  # and declares it again
        await relisted(m)
        await approve(m)
        assert await capabilities(m, "mcp_inv_purge") == [ADMIN, GATE]
        refused = await m.run("mcp_inv_purge", ADMIN)
        assert isinstance(refused, Err) and refused.err_kind == "permission_denied"
    async with mesh(sqlite_sessions) as m:  # the gate turned off
        await m.bridge.reconnect("inv")
        assert await capabilities(m, "mcp_inv_purge") == [ADMIN]
        assert await m.run("mcp_inv_purge", ADMIN) == Ok(data="purge v1")
    async with mesh(sqlite_sessions, destructive_capability="mcp.dangerous") as m:  # renamed
        await m.bridge.reconnect("inv")
        assert await capabilities(m, "mcp_inv_purge") == [ADMIN, "mcp.dangerous"]
    async with mesh(sqlite_sessions, destructive_capability=GATE) as m:
        await m.bridge.reconnect("inv")
        assert await capabilities(m, "mcp_inv_purge") == [ADMIN, GATE]


async def test_an_administrators_change_while_the_bridge_registers_is_not_lost(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """The bridge reads the connection's rows, then registers: an approval, a disable and a
    capability given in between are the registry's to keep, not the bridge's to overwrite
    with what it read."""
    widget = tool("widget")
    listed = inventory(tmp_path / "inventory.json", widget)
    async with mesh(sqlite_sessions, destructive_capability=GATE) as m:
        await m.bridge.connect(raw_config("inv", "--inventory", str(listed)))
        inventory(listed, {**widget, "description": "reworded", "version": 2})
        assert (await m.bridge.reconnect("inv")).held == ["mcp_inv_widget"]

        async def administrator() -> None:
            await m.registry.SetToolStatus(
                rpb.SetToolStatusRequest(
                    name="mcp_inv_widget", status=pb.TOOL_STATUS_APPROVED, enabled=False
                )
            )
            await administer(m, "mcp_inv_widget", required_capabilities=[ADMIN])

        assert m.sink is not None
        m.sink.meanwhile = administrator
        await m.bridge.reconnect("inv")
        assert m.sink.meanwhile is None  # it acted

        widget_row = await m.get("mcp_inv_widget")
        assert widget_row.status == pb.TOOL_STATUS_APPROVED
        assert not widget_row.enabled
        assert list(widget_row.required_capabilities) == [ADMIN]
