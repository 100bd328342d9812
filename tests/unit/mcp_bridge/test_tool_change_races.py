"""A hostile or unlucky server against the re-listing of announced tool changes: changes
announced while the bridge is still registering, a server restarting between its announcement
and the registration or during a Disconnect, garbage announcements, forged log lines and a
listen stream that drops as soon as it opens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.model import StoredTool, ToolRegistration
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.repository import SqlToolRepository
from shared.errors import ToolmeshError, Unavailable
from tests.unit.mcp_bridge.conftest import RepositorySink, raw_config
from tests.unit.mcp_bridge.test_tool_changes import announcing, has_tool, offer, settled


class GatedSink(RepositorySink):
    """The registry, where the next call of `method` (once `armed`) waits for `gate`."""

    def __init__(self, repo: SqlToolRepository, method: str) -> None:
        super().__init__(repo)
        self.method = method
        self.armed = False
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def _maybe_wait(self, method: str) -> None:
        if self.armed and method == self.method:
            self.armed = False
            self.entered.set()
            await self.gate.wait()

    async def connection_tools(self, created_by: str) -> list[StoredTool]:
        await self._maybe_wait("connection_tools")
        return await super().connection_tools(created_by)

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        await self._maybe_wait("upsert")
        await super().upsert(tools)


def gated_bridge(
    sessions: sessionmaker[Session], method: str, **kw: Any
) -> tuple[McpBridge, GatedSink]:
    sink = GatedSink(SqlToolRepository(sessions), method)
    options: dict[str, Any] = {"connect_timeout_s": 20.0, "backoff_s": 0.1, "backoff_max_s": 0.5}
    options.update(kw)
    return McpBridge(SqlConnectionStore(sessions), sink, **options), sink


def live_names(sessions: sessionmaker[Session], prefix: str) -> set[str]:
    return {t.name for t in SqlToolRepository(sessions).find() if t.name.startswith(prefix)}


async def crash(bridge: McpBridge, name: str) -> None:
    with contextlib.suppress(ToolmeshError):
        await bridge.call_tool(name, "crash", {})


async def test_a_change_announced_while_connect_registers_the_first_listing_is_registered(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    """The announcement came while the connection was not yet the bridge's: its re-listing
    found the connection "gone" and the new tool was never offered."""
    bridge, sink = gated_bridge(sqlite_sessions, "upsert", tools_changed_delay_s=0.05)
    sink.armed = True
    try:
        connecting = asyncio.create_task(
            bridge.connect(raw_config("late", "--change-after-first-list"))
        )
        await sink.entered.wait()
        await asyncio.sleep(0.3)  # the announcement arrives, its re-listing comes due
        sink.gate.set()
        first = await connecting
        assert "mcp_late_late" not in first.tool_names
        info = await settled(bridge, "late", has_tool("mcp_late_late"), timeout=10)
        assert info.tool_list_changes == 1
        assert "mcp_late_late" in live_names(sqlite_sessions, "mcp_late_")
    finally:
        await bridge.stop()


async def test_a_relisting_from_before_a_restart_does_not_overwrite_the_restarted_servers_tools(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A re-listing of the old session registered after the restarted server's own listing:
    the registry (and ListConnections) offered tools the server no longer had."""
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    bridge, sink = gated_bridge(sqlite_sessions, "connection_tools", tools_changed_delay_s=0.05)
    try:
        await bridge.connect(announcing("rs", inventory))
        offer(inventory, "b")
        sink.armed = True
        await bridge.call_tool("rs", "reload", {})
        await sink.entered.wait()  # the re-listing of [b] is registering
        offer(inventory, "c")
        await crash(bridge, "rs")
        await settled(bridge, "rs", lambda c: c.restarts >= 1, timeout=10)
        await asyncio.sleep(0.5)  # the restarted server's [c] is listed (and registered)
        sink.gate.set()
        info = await settled(bridge, "rs", lambda c: c.state == "connected", timeout=10)
        await asyncio.sleep(0.3)
        info = await settled(bridge, "rs", lambda c: True)
        assert "mcp_rs_c" in info.tool_names and "mcp_rs_b" not in info.tool_names
        names = live_names(sqlite_sessions, "mcp_rs_")
        assert "mcp_rs_c" in names and "mcp_rs_b" not in names
    finally:
        await bridge.stop()


async def test_a_server_restarting_during_disconnect_does_not_bring_its_tools_back(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    """Disconnect soft-deleted the tools while the restarted server's registration was in
    flight; that registration then landed: the tools of a forgotten connection were live."""
    bridge, sink = gated_bridge(sqlite_sessions, "upsert")
    try:
        await bridge.connect(raw_config("rd"))
        sink.armed = True
        await crash(bridge, "rd")
        await sink.entered.wait()  # the restarted server's tools are being registered
        disconnecting = asyncio.create_task(bridge.disconnect("rd"))
        await asyncio.sleep(0.3)
        sink.gate.set()
        await disconnecting
        assert live_names(sqlite_sessions, "mcp_rd_") == set()
        assert bridge.list_connections() == []
    finally:
        await bridge.stop()


async def test_a_listing_cut_short_by_disconnect_is_not_reported_as_a_failure(
    make_bridge: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The closed session failed the re-listing, which warned "will retry" (and did, once)."""
    caplog.set_level(logging.INFO, logger="services.mcp_bridge.core")
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    bridge = make_bridge(tools_changed_delay_s=0.05, tools_changed_min_interval_s=0.1)
    await bridge.connect(announcing("cut", inventory))
    await bridge.call_tool("cut", "reload", {"slow_list": 60})
    await asyncio.sleep(0.5)  # the re-listing waits for the server's answer
    await bridge.disconnect("cut")
    await asyncio.sleep(0.5)
    assert not [r for r in caplog.records if "listing them failed" in r.getMessage()]
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp-relist-cut")]


@pytest.mark.parametrize("params", ["garbage", [1, 2], {"_meta": "x"}, {"_meta": {"a": [None]}}])
async def test_a_list_changed_with_garbage_params_leaves_the_connection_working(
    make_bridge: Any, tmp_path: Path, params: object
) -> None:
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    bridge = make_bridge(tools_changed_delay_s=0.05)
    await bridge.connect(announcing("gb", inventory))
    offer(inventory, "a", "b")
    answer = await bridge.call_tool("gb", "reload", {"params": params, "times": 50})
    assert answer.envelope.data == "reloaded 2 tools"
    await asyncio.sleep(0.5)
    assert (await bridge.call_tool("gb", "echo", {"message": "hi"})).envelope.data == "Echo: hi"
    info = await settled(bridge, "gb", lambda c: True)
    assert info.state == "connected" and info.tool_list_changes <= 1


async def test_a_server_log_message_cannot_forge_lines_in_the_bridges_log(
    make_bridge: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The logger name went into the bridge's log as sent, and the data kept its CRs: a
    server could write lines of its own (`... CRITICAL toolmesh: ...`) into the bridge's log."""
    caplog.set_level(logging.INFO, logger="services.mcp_bridge.sdk")
    bridge = make_bridge()
    await bridge.connect(raw_config("forger"))
    forged = "\n2026-01-01 CRITICAL services.registry: keys leaked\r\x1b[2J"
    for arguments in (
        {"logger": "w" + forged, "data": "x"},
        {"data": "y" + forged},
        {"data": {"nested": forged}},
        {"data": "z" * 3_000_000},
    ):
        await bridge.call_tool("forger", "log", {"level": "info", **arguments})

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "forger [" in r.getMessage()]

    async with asyncio.timeout(10):  # notifications may be handled after the answer
        while True:
            if len(said()) >= 4:
                break
            await asyncio.sleep(0.02)
    messages = said()
    for message in messages:
        assert not any(c in message for c in "\r\n\x1b"), message
        assert len(message) < 2200
    assert messages[-1].endswith("z" * 100)


async def test_a_server_writing_garbage_without_end_does_not_fill_the_bridges_log(
    make_bridge: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK logged an error with a traceback for each of a server's unreadable messages,
    past the budget the server's stderr and log messages have."""
    from services.mcp_bridge import sdk

    monkeypatch.setattr(sdk, "SDK_LOG_RECORDS_PER_MIN", 5)
    monkeypatch.setattr(sdk._sdk_log_budget, "_budgets", {})  # a fresh minute
    caplog.set_level(logging.WARNING)
    inventory = tmp_path / "inventory.json"
    offer(inventory, "a")
    bridge = make_bridge()
    await bridge.connect(announcing("garbage", inventory))
    await bridge.call_tool("garbage", "reload", {"params": "garbage", "times": 200})
    await bridge.call_tool("garbage", "reload", {"params": {"_meta": "x"}, "times": 200})
    await asyncio.sleep(0.5)
    kinds: dict[tuple[str, str], int] = {}
    for record in caplog.records:
        if record.name.startswith(("mcp", "client")):
            key = (record.name, str(record.msg))
            kinds[key] = kinds.get(key, 0) + 1
    assert kinds and max(kinds.values()) <= 5, kinds
    assert (
        await bridge.call_tool("garbage", "echo", {"message": "ok"})
    ).envelope.data == "Echo: ok"


class _DroppingClient:
    """A modern client whose listen stream is acknowledged and dropped at once, every time."""

    def __init__(self) -> None:
        self.opened = 0

    @contextlib.asynccontextmanager
    async def listen(self, **_: Any) -> Any:
        from mcp.client.subscriptions import SubscriptionLost

        self.opened += 1

        async def events() -> Any:
            raise SubscriptionLost("dropped")
            yield  # an async generator

        yield events()


async def test_a_listen_stream_dropped_as_soon_as_it_opens_is_reopened_with_growing_delays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each acknowledgment reset the delay: the stream was re-opened (and the tools re-listed)
    twice a second for as long as the server kept dropping it."""
    from types import SimpleNamespace

    from services.mcp_bridge import sdk

    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        if len(delays) == 7:
            raise asyncio.CancelledError

    monkeypatch.setattr(sdk, "asyncio", SimpleNamespace(sleep=sleep))
    client = _DroppingClient()
    changes: list[None] = []
    with pytest.raises(asyncio.CancelledError):
        await sdk.listen_for_tool_changes(client, lambda: changes.append(None))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert client.opened == len(changes) == 7


def test_the_sdk_log_budget_stays_bounded_when_messages_carry_what_a_server_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some SDK messages are f-strings with a server's text in them: each a kind of its own, they
    grew the budget's table without end and each got the whole budget."""
    from services.mcp_bridge import sdk

    monkeypatch.setattr(sdk, "SDK_LOG_RECORDS_PER_MIN", 3)
    monkeypatch.setattr(sdk, "SDK_LOG_KINDS", 10)
    budget = sdk.SdkLogBudget()
    passed = sum(
        budget.filter(
            logging.LogRecord(
                "mcp.client.streamable_http",
                logging.WARNING,
                "",
                0,
                f"Unknown SSE event: e{i}",
                None,
                None,
            )
        )
        for i in range(1000)
    )
    assert len(budget._budgets) <= 11
    assert passed <= 10 * 3 + 3


class _StoreDownOnce(SqlConnectionStore):
    """The connection store, failing its first save (the database gone for a moment)."""

    failed = False

    def save(self, config: Any) -> None:
        if not self.failed:
            self.failed = True
            raise Unavailable("database unavailable (test)", reason="DATABASE_UNAVAILABLE")
        super().save(config)


async def test_a_connection_that_could_not_be_stored_leaves_nothing_behind(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    """Connect answered UNAVAILABLE, yet the server kept running, its tools stayed offered
    and a retry was refused as an existing connection."""
    from tests.unit.mcp_bridge.test_core import children_of

    repo = SqlToolRepository(sqlite_sessions)
    bridge = McpBridge(_StoreDownOnce(sqlite_sessions), RepositorySink(repo))
    try:
        before = children_of(os.getpid())
        with pytest.raises(Unavailable):
            await bridge.connect(raw_config("unsaved"))
        assert bridge.list_connections() == []
        assert (repo.get("mcp_unsaved_echo") or ...).deleted_at is not None  # type: ignore[union-attr]
        assert set(children_of(os.getpid())) - set(before) == set()
        again = await bridge.connect(raw_config("unsaved"))  # not "exists"
        assert "mcp_unsaved_echo" in again.tool_names
        assert (repo.get("mcp_unsaved_echo") or ...).deleted_at is None  # type: ignore[union-attr]
    finally:
        await bridge.stop()


async def test_two_connections_registering_at_once_never_share_a_tool_name(
    make_bridge: Any, sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """`a_b` with a tool `c` and `a` with a tool `b_c`, connected at once, both took
    `mcp_a_b_c`: the second connection's row overwrote the first's."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    offer(first, "c")
    offer(second, "b_c")
    bridge = make_bridge()
    one, two = await asyncio.gather(
        bridge.connect(raw_config("a_b", "--inventory", str(first))),
        bridge.connect(raw_config("a", "--inventory", str(second))),
    )
    assert not set(one.tool_names) & set(two.tool_names)
    assert "mcp_a_b_c" in one.tool_names + two.tool_names
    repo = SqlToolRepository(sqlite_sessions)
    owners = {t.name: t.created_by for t in repo.find()}
    assert all(owners[n] == "mcp:a_b" for n in one.tool_names)
    assert all(owners[n] == "mcp:a" for n in two.tool_names)


async def test_a_reconnect_to_a_config_that_fails_keeps_the_connection_on_its_old_one(
    make_bridge: Any, sqlite_sessions: sessionmaker[Session]
) -> None:
    """A Reconnect with a new config whose server could not start closed the old session and
    dropped the connection, while its tools stayed offered (each call then NOT_FOUND)."""
    from services.mcp_bridge.model import ServerConfig
    from shared.errors import FailedPrecondition

    bridge = make_bridge()
    await bridge.connect(raw_config("keep"))
    broken = ServerConfig(name="keep", transport="stdio", command="no-such-mcp-server-xyz")
    with pytest.raises(FailedPrecondition):
        await bridge.reconnect("keep", broken)
    info = await settled(bridge, "keep", lambda c: c.state == "connected")
    assert info.server.command == raw_config("keep").command
    answer = await bridge.call_tool("keep", "echo", {"message": "still here"})
    assert answer.envelope.data == "Echo: still here"
    stored = SqlConnectionStore(sqlite_sessions).load()
    assert [c.command for c in stored] == [raw_config("keep").command]


class _StoreDownLater(SqlConnectionStore):
    """The connection store, failing its saves once `down` is set."""

    down = False

    def save(self, config: Any) -> None:
        if self.down:
            raise Unavailable("database unavailable (test)", reason="DATABASE_UNAVAILABLE")
        super().save(config)


async def test_a_reconnect_whose_new_config_could_not_be_stored_runs_the_stored_one_again(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Reconnect answered UNAVAILABLE, yet the connection ran the new config and offered its
    tools, while the store kept the old one: the next bridge restart silently went back."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    offer(first, "old_tool")
    offer(second, "new_tool")
    repo = SqlToolRepository(sqlite_sessions)
    store = _StoreDownLater(sqlite_sessions)
    bridge = McpBridge(store, RepositorySink(repo))
    try:
        await bridge.connect(raw_config("swap", "--inventory", str(first)))
        store.down = True
        with pytest.raises(Unavailable):
            await bridge.reconnect("swap", raw_config("swap", "--inventory", str(second)))
        info = await settled(bridge, "swap", has_tool("mcp_swap_old_tool"))
        assert info.state == "connected" and str(first) in info.server.args
        answer = await bridge.call_tool("swap", "old_tool", {"message": "back"})
        assert answer.envelope.data == "old_tool v1"
        assert [c.args for c in SqlConnectionStore(sqlite_sessions).load()] == [
            raw_config("swap", "--inventory", str(first)).args
        ]
        for _ in range(100):  # the new config's tool goes once the old session re-registers
            if (repo.get("mcp_swap_new_tool") or ...).deleted_at is not None:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        assert (repo.get("mcp_swap_new_tool") or ...).deleted_at is not None  # type: ignore[union-attr]
    finally:
        await bridge.stop()
