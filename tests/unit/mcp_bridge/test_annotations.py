"""MCP tool annotations end to end, in one process: the raw test server lists tools with a
title and hints, the bridge registers them through the registry's own UpsertTools (GrpcToolSink
against a RegistryServicer on loopback), GetTool / ListTools return them, the hints count in
definition pinning, and TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY gates tools declared destructive
through the registry's existing capability check (ExecuteTool over McpRoute back to the
bridge's servicer)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.annotations import (
    annotations_of,
    clean_listing,
    display_title,
    required_capabilities,
)
from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.model import McpTool, ToolAnnotations
from services.mcp_bridge.naming import definition_hash
from services.mcp_bridge.sdk import ToolListings
from services.mcp_bridge.servicer import McpBridgeServicer
from services.mcp_bridge.sink import GrpcToolSink
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.core import Registry
from services.registry.mcp_route import McpRoute
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from services.registry.servicer import RegistryServicer
from shared import convert
from shared.config import Settings
from shared.contract import Err, Ok
from shared.convert import MAX_TOOL_TITLE_CHARS
from tests.unit.mcp_bridge.conftest import raw_config
from tests.unit.mcp_bridge.test_tool_changes import settled
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

SCHEMA = {"type": "object"}
CAPABILITY = "mcp.destructive"


def tool(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "description": f"{name} things", "inputSchema": SCHEMA, **fields}


def inventory(path: Path, *tools: dict[str, Any]) -> Path:
    path.write_text(json.dumps(list(tools)))
    return path


@dataclass
class Mesh:
    bridge: McpBridge
    registry: registry_pb2_grpc.RegistryServiceStub
    repo: SqlToolRepository

    async def get(self, name: str) -> pb.ToolDefinition:
        return (await self.registry.GetTool(rpb.GetToolRequest(name=name))).tool

    async def run(self, name: str, *capabilities: str) -> Any:
        response = await self.registry.ExecuteTool(
            rpb.ExecuteToolRequest(
                name=name,
                input_json="{}",
                context=pb.CallContext(tenant_id="acme", capabilities=list(capabilities)),
            )
        )
        return convert.tool_result_from_pb(response.result).envelope


@asynccontextmanager
async def mesh(sessions: sessionmaker[Session], **bridge_options: Any) -> AsyncIterator[Mesh]:
    """A registry and a bridge serving on one loopback port: the bridge registers through the
    registry's UpsertTools, the registry runs MCP tools through the bridge's CallToolUnary."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address)
    stub = registry_pb2_grpc.RegistryServiceStub(channel)
    repo = SqlToolRepository(sessions)
    bridge = McpBridge(
        SqlConnectionStore(sessions),
        GrpcToolSink(stub, tracing=False),
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
        yield Mesh(bridge, stub, repo)
    finally:
        await bridge.stop()
        await route.close()
        await channel.close()
        await server.stop(None)
        registry.close()


def hints(message: pb.ToolAnnotations) -> dict[str, bool]:
    return {h: getattr(message, h) for h in convert.ANNOTATION_HINTS if message.HasField(h)}


async def test_a_servers_title_and_hints_are_stored_and_returned_by_get_tool_and_list_tools(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    listed = inventory(
        tmp_path / "inventory.json",
        tool(
            "lookup",
            title="Look up a widget",
            annotations={"readOnlyHint": True, "openWorldHint": False},
        ),
        tool("purge", annotations={"title": "Purge widgets", "destructiveHint": True}),
        tool("plain"),
    )
    async with mesh(sqlite_sessions) as m:
        await m.bridge.connect(raw_config("inv", "--inventory", str(listed)))

        lookup = await m.get("mcp_inv_lookup")
        assert lookup.annotations.title == "Look up a widget"
        assert hints(lookup.annotations) == {"read_only": True, "open_world": False}
        purge = await m.get("mcp_inv_purge")
        assert purge.annotations.title == "Purge widgets"  # the annotations' own title
        assert hints(purge.annotations) == {"destructive": True}
        assert list(purge.required_capabilities) == []  # no gating unless configured
        assert not (await m.get("mcp_inv_plain")).HasField("annotations")
        assert not (await m.get("mcp_inv_echo")).HasField("annotations")

        listing = await m.registry.ListTools(rpb.ListToolsRequest(created_by="mcp:inv"))
        by_name = {t.name: t for t in listing.tools}
        assert by_name["mcp_inv_lookup"].annotations == lookup.annotations
        assert by_name["mcp_inv_purge"].annotations == purge.annotations
        stored = m.repo.get("mcp_inv_lookup")
        assert stored is not None
        assert stored.annotations == {
            "title": "Look up a widget",
            "read_only": True,
            "open_world": False,
        }


async def test_malformed_titles_and_hints_are_ignored_and_the_connection_serves(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """The SDK failed the whole listing (so the connection) on a hint of "maybe" or
    annotations that were not an object, and read "yes" or 1 as true."""
    listed = inventory(
        tmp_path / "inventory.json",
        tool(
            "odd",
            title="Odd\n\x1b[31mtool\u202e",
            annotations={
                "readOnlyHint": "yes",
                "destructiveHint": 1,
                "idempotentHint": True,
                "openWorldHint": "maybe",
                "vendorHint": {"x": 1},
            },
        ),
        tool("stringy", title=42, annotations="destructive"),
        tool("listy", annotations=[True]),
        tool("long", title="t" * 100_000, annotations={"title": ["no"]}),
    )
    async with mesh(sqlite_sessions) as m:
        report = await m.bridge.connect(raw_config("inv", "--inventory", str(listed)))
        assert {"mcp_inv_odd", "mcp_inv_stringy", "mcp_inv_listy", "mcp_inv_long"} <= set(
            report.tool_names
        )
        assert report.skipped == []

        odd = await m.get("mcp_inv_odd")
        assert odd.annotations.title == "Odd [31mtool"
        assert hints(odd.annotations) == {"idempotent": True}
        assert not (await m.get("mcp_inv_stringy")).HasField("annotations")
        assert not (await m.get("mcp_inv_listy")).HasField("annotations")
        long = (await m.get("mcp_inv_long")).annotations
        assert len(long.title) == MAX_TOOL_TITLE_CHARS and long.title.endswith("…")
        assert hints(long) == {}
        assert await m.run("mcp_inv_stringy") == Ok(data="stringy v1")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"readOnlyHint": False, "destructiveHint": False}, {"readOnlyHint": False}),
        ({"readOnlyHint": False, "destructiveHint": False}, {"destructiveHint": True}),
        ({"readOnlyHint": True}, {}),  # no longer read-only
    ],
    ids=["destructive-by-default", "turned-destructive", "no-longer-read-only"],
)
async def test_a_tool_whose_hints_change_on_a_relisting_is_held_in_testing(
    sqlite_sessions: sessionmaker[Session],
    tmp_path: Path,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    listed = inventory(tmp_path / "inventory.json", tool("wipe", annotations=before), tool("keep"))
    async with mesh(sqlite_sessions, destructive_capability=CAPABILITY) as m:
        config = raw_config("inv", "--inventory", str(listed), "--announce-changes")
        await m.bridge.connect(config)
        assert (await m.get("mcp_inv_wipe")).status == pb.TOOL_STATUS_APPROVED

        # Only the hints change, and the server says so.
        inventory(listed, tool("wipe", annotations=after), tool("keep"))
        assert (await m.bridge.call_tool("inv", "reload", {})).envelope == Ok(
            data="reloaded 2 tools"
        )
        info = await settled(m.bridge, "inv", lambda c: c.tool_list_changes > 0)

        assert info.last_tool_change is not None
        assert info.last_tool_change.changed == ["mcp_inv_wipe"] == info.last_tool_change.held
        wipe = await m.get("mcp_inv_wipe")
        assert wipe.status == pb.TOOL_STATUS_TESTING
        assert hints(wipe.annotations) == {
            "read_only" if k == "readOnlyHint" else "destructive": v for k, v in after.items()
        }
        assert (await m.get("mcp_inv_keep")).status == pb.TOOL_STATUS_APPROVED
        refused = await m.run("mcp_inv_wipe", CAPABILITY)
        assert isinstance(refused, Err) and refused.err_kind == "tool_not_approved"


def pre_annotations_digest(
    name: str, description: str, title: str | None, annotations: dict[str, Any] | None
) -> str:
    """The definition hash as the bridge computed it before it stored annotations (commit
    e475d97 onwards), written out here so a change of naming.definition_hash cannot hide."""
    canonical = json.dumps(
        {
            "name": name,
            "title": title,
            "description": description,
            "input_schema": SCHEMA,
            "output_schema": None,
            "annotations": annotations,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# What the bridge stored, before this release, for `alpha` below: read-only, closed-world.
LEGACY_ALPHA_DIGEST = "01373a61d57a9e1b36691391cb1cdd04eacfbadbd10c943348a597b8135eb8e3"


async def test_a_tool_pinned_before_the_upgrade_is_not_held_and_gets_its_annotations(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Rows pinned by the previous release have a digest and no annotations (the migration
    adds the column empty). An unchanged tool keeps its approval and is given its annotations;
    one whose hints differ from what was pinned is held."""
    alpha_hints = {"read_only_hint": True, "open_world_hint": False}
    assert (
        pre_annotations_digest("alpha", "Reads a widget.", "Read widget", alpha_hints)
        == LEGACY_ALPHA_DIGEST
    )
    beta_digest = pre_annotations_digest("beta", "beta things", None, {"read_only_hint": True})
    repo = SqlToolRepository(sqlite_sessions)
    repo.upsert(
        [
            ToolDef(
                name=f"mcp_inv_{name}",
                description=f"[MCP: inv] {name}",
                input_schema=SCHEMA,
                tool_type="mcp",
                implementation=f"mcp:inv:{name}",
                category="mcp",
                created_by="mcp:inv",
                definition_hash=digest,
            )
            for name, digest in (("alpha", LEGACY_ALPHA_DIGEST), ("beta", beta_digest))
        ]
    )
    listed = inventory(
        tmp_path / "inventory.json",
        {
            "name": "alpha",
            "title": "Read widget",
            "description": "Reads a widget.",
            "inputSchema": SCHEMA,
            "annotations": {"readOnlyHint": True, "openWorldHint": False},
        },
        tool("beta", annotations={"readOnlyHint": False}),  # pinned as read-only
    )
    async with mesh(sqlite_sessions) as m:
        report = await m.bridge.connect(raw_config("inv", "--inventory", str(listed)))

        assert report.changed == ["mcp_inv_beta"] == report.held
        alpha = await m.get("mcp_inv_alpha")
        assert alpha.status == pb.TOOL_STATUS_APPROVED
        assert alpha.definition_hash == LEGACY_ALPHA_DIGEST
        assert alpha.annotations.title == "Read widget"
        assert hints(alpha.annotations) == {"read_only": True, "open_world": False}
        assert (await m.get("mcp_inv_beta")).status == pb.TOOL_STATUS_TESTING
        assert await m.run("mcp_inv_alpha") == Ok(data="alpha v1")


async def test_with_the_destructive_capability_set_only_callers_holding_it_run_destructive_tools(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    listed = inventory(
        tmp_path / "inventory.json",
        tool("purge", annotations={"destructiveHint": True}),
        tool("peek", annotations={"readOnlyHint": True}),
        # MCP would read this one as destructive (no hints at all): only an explicit hint gates.
        tool("vague"),
        tool("additive", annotations={"readOnlyHint": False, "destructiveHint": False}),
    )
    async with mesh(sqlite_sessions, destructive_capability=CAPABILITY) as m:
        await m.bridge.connect(raw_config("inv", "--inventory", str(listed)))

        assert list((await m.get("mcp_inv_purge")).required_capabilities) == [CAPABILITY]
        for name in ("peek", "vague", "additive"):
            assert list((await m.get(f"mcp_inv_{name}")).required_capabilities) == []

        refused = await m.run("mcp_inv_purge")
        assert isinstance(refused, Err) and refused.err_kind == "permission_denied"
        refused = await m.run("mcp_inv_purge", "some.other.capability")
        assert isinstance(refused, Err) and refused.err_kind == "permission_denied"
        assert await m.run("mcp_inv_purge", CAPABILITY) == Ok(data="purge v1")
        assert await m.run("mcp_inv_vague") == Ok(data="vague v1")
        assert await m.run("mcp_inv_peek") == Ok(data="peek v1")

        # The gate follows the setting: a bridge without it registers the tool ungated.
        await m.bridge.stop()
    async with mesh(sqlite_sessions) as m:
        await m.bridge.reconnect("inv")
        assert list((await m.get("mcp_inv_purge")).required_capabilities) == []
        assert await m.run("mcp_inv_purge") == Ok(data="purge v1")


# --- the pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "title"),
    [
        ("Read widget", "Read widget"),
        ("  spaced  out ", "  spaced  out "),  # printable and short: kept as it is
        ("a\x00b\r\nc\u2028d", "a b c d"),
        ("\u202eevil\u200b", "evil"),
        ("\x07\n ", None),
        ("", None),
        (42, None),
        (None, None),
        (["x"], None),
    ],
)
def test_a_title_is_kept_only_as_printable_text(value: Any, title: str | None) -> None:
    assert display_title(value) == title


def test_a_title_is_cut_to_the_bound_however_long() -> None:
    for text in ("x" * (MAX_TOOL_TITLE_CHARS + 1), "y" * 10_000_000):
        cut = display_title(text)
        assert cut is not None and len(cut) == MAX_TOOL_TITLE_CHARS and cut.endswith("…")
    exact = "z" * MAX_TOOL_TITLE_CHARS
    assert display_title(exact) == exact


def test_a_well_formed_listing_passes_unchanged_so_its_definition_hashes_do_too() -> None:
    tools = [
        tool("a", title="A", annotations={"title": "A!", "readOnlyHint": True}),
        tool("b", annotations={}),
        tool("c"),
        "not a tool",
    ]
    listing = {"tools": json.loads(json.dumps(tools)), "nextCursor": "2"}
    clean_listing(listing)
    assert listing == {"tools": tools, "nextCursor": "2"}
    clean_listing({"tools": "nope"})  # not a listing: left alone
    clean_listing(None)


def test_annotations_of_takes_only_booleans_and_prefers_the_tools_own_title() -> None:
    listed = McpTool(
        "t",
        "d",
        SCHEMA,
        annotations={"title": "B", "destructive_hint": True, "read_only_hint": "yes"},
        title="A",
    )
    assert annotations_of(listed) == ToolAnnotations(title="A", destructive=True)
    assert annotations_of(McpTool("t", "d", SCHEMA, annotations={})) is None
    assert annotations_of(McpTool("t", "d", SCHEMA)) is None


def test_only_an_explicit_destructive_hint_is_gated_and_only_when_configured() -> None:
    destructive = ToolAnnotations(destructive=True)
    assert required_capabilities(destructive, CAPABILITY) == (CAPABILITY,)
    assert required_capabilities(destructive, "") == ()
    assert required_capabilities(ToolAnnotations(read_only=False), CAPABILITY) == ()
    assert required_capabilities(None, CAPABILITY) == ()
    contradictory = ToolAnnotations(read_only=True, destructive=True)
    assert required_capabilities(contradictory, CAPABILITY) == (CAPABILITY,)


def test_the_definition_hash_counts_the_hints_and_the_title() -> None:
    plain = McpTool("t", "d", SCHEMA)
    safe = McpTool("t", "d", SCHEMA, annotations={"destructive_hint": False})
    flipped = McpTool("t", "d", SCHEMA, annotations={"destructive_hint": True})
    titled = McpTool("t", "d", SCHEMA, title="T")
    digests = {definition_hash(x) for x in (plain, safe, flipped, titled)}
    assert len(digests) == 4
    assert definition_hash(plain) == pre_annotations_digest("t", "d", None, None)


def test_only_the_answer_to_a_tools_list_request_is_cleaned() -> None:
    from mcp.shared.message import SessionMessage
    from mcp_types import JSONRPCRequest, JSONRPCResponse

    def answer(request_id: int) -> Any:
        result = {"tools": [tool("t", annotations="not an object")]}
        return SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result))

    listings = ToolListings("c")
    listings.sent(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=7, method="tools/list")))
    listings.sent(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=8, method="tools/call")))

    other = listings.received(answer(8))
    assert other.message.result["tools"][0]["annotations"] == "not an object"
    listed = listings.received(answer(7))
    assert "annotations" not in listed.message.result["tools"][0]
    again = listings.received(answer(7))  # answered once already: not a listing any more
    assert again.message.result["tools"][0]["annotations"] == "not an object"


def test_the_destructive_capability_setting_is_a_capability_name_or_empty() -> None:
    assert Settings.from_env({}).mcp_destructive_capability == ""
    env = {"TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY": " mcp.destructive "}
    assert Settings.from_env(env).mcp_destructive_capability == "mcp.destructive"
    for bad in ("two words", "x" * 129, "tab\there"):
        with pytest.raises(ValueError, match="TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY"):
            Settings.from_env({"TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY": bad})
