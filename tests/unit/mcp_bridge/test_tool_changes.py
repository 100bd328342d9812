"""Servers that change their tools while connected: an announced change (a handshake-era
`notifications/tools/list_changed`, or an event on a current-protocol `subscriptions/listen`
stream) is listed and registered as a Reconnect would, coalescing bursts."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.model import ConnectionInfo, ServerConfig, ToolRegistration
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.repository import SqlToolRepository
from shared.contract import Ok
from shared.errors import Unavailable
from tests.unit.mcp_bridge.conftest import BridgeFactory, RepositorySink, raw_config

SCHEMA = {"type": "object"}


def has_tool(name: str) -> Callable[[ConnectionInfo], bool]:
    return lambda info: name in info.tool_names


def offer(inventory: Path, *names: str) -> None:
    """Make the raw server's inventory file list these tools (read at start and on `reload`)."""
    inventory.write_text(
        json.dumps([{"name": n, "description": "v", "inputSchema": SCHEMA} for n in names])
    )


def announcing(name: str, inventory: Path) -> ServerConfig:
    """The raw server with `inventory`, announcing changes, as connection `name`."""
    return raw_config(name, "--inventory", str(inventory), "--announce-changes")


async def settled(
    bridge: object, name: str, done: Callable[[ConnectionInfo], bool], timeout: float = 20.0
) -> ConnectionInfo:
    """The connection's info once `done` holds for it (polling; a test fails past timeout)."""
    async with asyncio.timeout(timeout):
        while True:
            info = {c.server.name: c for c in bridge.list_connections()}[name]  # type: ignore[attr-defined]
            if done(info):
                return info
            await asyncio.sleep(0.05)


async def test_an_announced_change_is_registered_once_for_a_burst_and_pins_changed_tools(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    alpha = {"name": "alpha", "description": "first", "inputSchema": SCHEMA}
    inventory.write_text(json.dumps([alpha, {**alpha, "name": "beta"}]))
    bridge = make_bridge(tools_changed_delay_s=0.3)
    first = await bridge.connect(announcing("inv", inventory))
    assert {"mcp_inv_alpha", "mcp_inv_beta", "mcp_inv_reload"} <= set(first.tool_names)
    before = await settled(bridge, "inv", lambda c: c.state == "connected")
    assert before.tool_list_changes == 0 and before.last_tool_change is None

    # The server changes alpha's schema, drops beta, adds gamma, and says so five times.
    changed = {**alpha, "inputSchema": {"type": "object", "required": ["x"]}, "version": 2}
    inventory.write_text(json.dumps([changed, {**alpha, "name": "gamma"}]))
    answer = await bridge.call_tool("inv", "reload", {"times": 5})
    assert answer.envelope == Ok(data="reloaded 2 tools")

    info = await settled(bridge, "inv", lambda c: c.tool_list_changes > 0)
    await asyncio.sleep(0.8)  # any second listing of the same burst would be done by now
    info = await settled(bridge, "inv", lambda c: True)
    assert info.tool_list_changes == 1
    report = info.last_tool_change
    assert report is not None
    assert report.added == ["mcp_inv_gamma"]
    assert report.removed == ["mcp_inv_beta"]
    assert report.changed == ["mcp_inv_alpha"] == report.held
    assert "mcp_inv_gamma" in info.tool_names and "mcp_inv_beta" not in info.tool_names

    repo = SqlToolRepository(sqlite_sessions)
    assert (repo.get("mcp_inv_alpha") or ...).status == "testing"  # type: ignore[union-attr]
    assert (repo.get("mcp_inv_gamma") or ...).status == "approved"  # type: ignore[union-attr]
    assert (repo.get("mcp_inv_beta") or ...).deleted_at is not None  # type: ignore[union-attr]
    assert (await bridge.call_tool("inv", "gamma", {})).envelope == Ok(data="gamma v1")


async def test_a_current_protocol_server_announces_new_tools_on_its_listen_stream(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session]
) -> None:
    bridge = make_bridge(tools_changed_delay_s=0.05)
    config = ServerConfig(
        name="changing",
        transport="stdio",
        command=sys.executable,
        args=("-m", "tests.mcp_servers.changing_server"),
    )
    first = await bridge.connect(config)
    assert first.tool_names == ["mcp_changing_grow"]
    for added in ("extra", "more"):
        answer = await bridge.call_tool("changing", "grow", {"name": added})
        assert answer.envelope == Ok(data={"result": f"added {added}"})
        info = await settled(bridge, "changing", has_tool(f"mcp_changing_{added}"))
        assert info.protocol_version >= "2026-07-28"
    assert info.last_tool_change is not None and info.last_tool_change.added == [
        "mcp_changing_more"
    ]
    repo = SqlToolRepository(sqlite_sessions)
    assert (repo.get("mcp_changing_extra") or ...).description.startswith("[MCP: changing]")  # type: ignore[union-attr]
    assert (await bridge.call_tool("changing", "more", {})).envelope == Ok(
        data={"result": "more here"}
    )


async def test_a_change_announced_during_disconnect_does_not_bring_the_tools_back(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    offer(inventory, "alpha")
    bridge = make_bridge(tools_changed_delay_s=0.2)
    await bridge.connect(announcing("inv", inventory))
    await bridge.call_tool("inv", "reload", {})
    await bridge.disconnect("inv")  # before the announced change is listed
    await asyncio.sleep(0.5)
    repo = SqlToolRepository(sqlite_sessions)
    for name in ("mcp_inv_alpha", "mcp_inv_echo"):
        assert (repo.get(name) or ...).deleted_at is not None  # type: ignore[union-attr]
    assert bridge.list_connections() == []


async def test_a_server_announcing_without_end_is_listed_at_most_once_per_interval(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a0")
    bridge = make_bridge(tools_changed_delay_s=0.05, tools_changed_min_interval_s=1.5)
    await bridge.connect(announcing("spam", inventory))
    started = asyncio.get_running_loop().time()
    for i in range(1, 9):  # eight announcements over ~0.8 s, each with a new inventory
        offer(inventory, *(f"a{j}" for j in range(i + 1)))
        await bridge.call_tool("spam", "reload", {"times": 20})
        await asyncio.sleep(0.1)
    # The first listing comes at once, the next not before the interval: the last inventory
    # is registered, in two listings.
    info = await settled(bridge, "spam", has_tool("mcp_spam_a8"))
    assert asyncio.get_running_loop().time() - started >= 1.5
    await asyncio.sleep(0.5)
    assert (await settled(bridge, "spam", lambda c: True)).tool_list_changes == 2
    assert info.last_tool_change is not None and "mcp_spam_a8" in info.last_tool_change.added


class FlakySink(RepositorySink):
    """The registry, unavailable for its first `failures` upserts after `armed` is set."""

    def __init__(self, repo: SqlToolRepository, failures: int) -> None:
        super().__init__(repo)
        self.failures = failures
        self.armed = False

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        if self.armed and self.failures > 0:
            self.failures -= 1
            raise Unavailable("registry unavailable (test)")
        await super().upsert(tools)


async def test_a_change_the_registry_could_not_take_is_registered_once_it_can(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    sink = FlakySink(SqlToolRepository(sqlite_sessions), failures=2)
    bridge = McpBridge(
        SqlConnectionStore(sqlite_sessions),
        sink,
        tools_changed_delay_s=0.05,
        tools_changed_min_interval_s=0.2,
    )
    try:
        await bridge.connect(
            raw_config("flaky", "--inventory", str(inventory), "--announce-changes")
        )
        tools = [{"name": n, "description": "v", "inputSchema": SCHEMA} for n in ("a", "b")]
        inventory.write_text(json.dumps(tools))
        sink.armed = True
        await bridge.call_tool("flaky", "reload", {})
        # Two failed tries (0.2 s, then 0.4 s apart), then the registration.
        info = await settled(bridge, "flaky", lambda c: c.tool_list_changes == 1)
        assert sink.failures == 0
        assert "mcp_flaky_b" in info.tool_names
        assert (SqlToolRepository(sqlite_sessions).get("mcp_flaky_b") or ...).deleted_at is None  # type: ignore[union-attr]
    finally:
        await bridge.stop()


async def test_a_server_slow_to_list_its_changed_tools_does_not_hold_up_a_disconnect(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    bridge = make_bridge(tools_changed_delay_s=0.05)
    await bridge.connect(announcing("slow", inventory))
    offer(inventory, "b")
    await bridge.call_tool("slow", "reload", {"slow_list": 60})
    await asyncio.sleep(0.5)  # the re-listing is waiting for the server's answer
    started = asyncio.get_running_loop().time()
    await bridge.disconnect("slow")
    assert asyncio.get_running_loop().time() - started < 5
    await asyncio.sleep(0.5)
    repo = SqlToolRepository(sqlite_sessions)
    assert (repo.get("mcp_slow_a") or ...).deleted_at is not None  # type: ignore[union-attr]
    assert repo.get("mcp_slow_b") is None
