"""The bridge core against real MCP servers over stdio: registration, calls, timeouts,
cancellation, crashes and restarts, pinning, bad input, reaping, restore."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge import connection
from services.mcp_bridge.model import ServerConfig
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.repository import SqlToolRepository
from shared import convert
from shared.contract import Err, Ok
from shared.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from tests.unit.mcp_bridge.conftest import BridgeFactory, raw_config


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


async def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.05)


async def test_connect_registers_prefixed_sanitised_tools_and_reports_renames(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session]
) -> None:
    bridge = make_bridge()
    report = await bridge.connect(raw_config())
    assert "mcp_raw_echo" in report.tool_names
    assert len(report.tool_names) == len(set(report.tool_names))
    assert any(r.startswith("dup.name -> mcp_raw_dup_name_2") for r in report.renamed)
    long = [n for n in report.tool_names if n.startswith("mcp_raw_a_very_long")]
    assert len(long) == 1 and len(long[0]) == 64
    echo = SqlToolRepository(sqlite_sessions).get("mcp_raw_echo")
    assert echo is not None
    assert echo.tool_type == "mcp" and echo.status == "approved"
    assert echo.description == "[MCP: raw] Echo a message."
    assert echo.implementation == "mcp:raw:echo" and echo.created_by == "mcp:raw"
    assert echo.definition_hash and len(echo.definition_hash) == 64
    [info] = bridge.list_connections()
    assert info.state == "connected" and info.server_name == "raw-test-server"
    assert info.protocol_version


async def test_calls_map_text_errors_and_malformed_content_and_keep_serving(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config())
    ok = await bridge.call_tool("raw", "echo", {"message": "hi"})
    assert ok.envelope == Ok(data="Echo: hi")
    failed = await bridge.call_tool("raw", "fail", {})
    assert failed.envelope == Err("the widget is broken", "tool_error")
    for tool in ("malformed", "bad_base64"):
        bad = (await bridge.call_tool("raw", tool, {})).envelope
        assert isinstance(bad, Err) and bad.err_kind == "malformed_result", bad
        assert "raw" in bad.message and tool in bad.message
    image = (await bridge.call_tool("raw", "image", {})).envelope
    assert isinstance(image, Ok) and image.data == "a pixel"
    assert image.effects.cards[0]["type"] == "image"
    exported = Path(next(iter(image.effects.exports.values()))["path"])
    assert await asyncio.to_thread(exported.is_file)
    # The connection is still fine after all of that.
    assert (await bridge.call_tool("raw", "echo", {"message": "again"})).envelope == Ok(
        data="Echo: again"
    )


async def test_a_hung_call_times_out_and_is_cancelled_on_the_server(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw", "--marker-dir", str(tmp_path / "m")))
    outcome = await bridge.call_tool("raw", "hang", {}, timeout_s=0.5)
    assert isinstance(outcome.envelope, Err) and outcome.envelope.err_kind == "timeout"
    await wait_until(lambda: any((tmp_path / "m").glob("cancelled-*")))


async def test_a_cancelled_call_is_cancelled_on_the_mcp_session(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw", "--marker-dir", str(tmp_path / "m")))
    call = asyncio.ensure_future(bridge.call_tool("raw", "hang", {}))
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_until(lambda: any((tmp_path / "m").glob("cancelled-*")))
    assert (await bridge.call_tool("raw", "echo", {"message": "x"})).envelope == Ok(data="Echo: x")


async def test_a_crashed_server_answers_unavailable_then_is_restarted(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    before = set(children_of(os.getpid()))
    bridge = make_bridge()
    marker = tmp_path / "m"
    await bridge.connect(raw_config("raw", "--marker-dir", str(marker)))
    with pytest.raises(Unavailable) as caught:
        await bridge.call_tool("raw", "crash", {})
    assert caught.value.reason == "MCP_SERVER_UNAVAILABLE"
    await wait_until(
        lambda: (
            bridge.list_connections()[0].state == "connected"
            and bridge.list_connections()[0].restarts >= 1
        )
    )
    assert len(list(marker.glob("start-*"))) >= 2
    assert (await bridge.call_tool("raw", "echo", {"message": "back"})).envelope == Ok(
        data="Echo: back"
    )
    # The crashed process was reaped; only its replacement runs.
    assert len(set(children_of(os.getpid())) - before) == 1


async def test_the_restart_backoff_grows_for_a_crash_loop_and_resets_after_a_stable_session(
    make_bridge: BridgeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that crashes as soon as it is up waits longer each time; one whose session
    served a while (STABLE_SESSION_S) restarts after the first delay again — before, the delay
    only ever grew, so a server crashing once a day soon waited the longest backoff."""
    bridge = make_bridge(backoff_s=0.2, backoff_max_s=5.0)
    await bridge.connect(raw_config("raw"))
    live = bridge._connections["raw"]

    async def crash_and_wait_for_restart(restarts: int) -> float:
        with pytest.raises(Unavailable):
            await bridge.call_tool("raw", "crash", {})
        await wait_until(lambda: live.restarts == restarts and live.state == "connected")
        return live.last_backoff_s

    monkeypatch.setattr(connection, "STABLE_SESSION_S", 3600.0)  # every session short-lived
    assert [await crash_and_wait_for_restart(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    monkeypatch.setattr(connection, "STABLE_SESSION_S", 0.0)  # every session served long enough
    assert [await crash_and_wait_for_restart(n) for n in (4, 5)] == [0.2, 0.2]


async def test_connect_disconnect_cycles_leak_no_processes(make_bridge: BridgeFactory) -> None:
    before = set(children_of(os.getpid()))
    bridge = make_bridge()
    for _ in range(6):
        await bridge.connect(raw_config())
        assert len(set(children_of(os.getpid())) - before) == 1
        removed = await bridge.disconnect("raw")
        assert "mcp_raw_echo" in removed
    assert set(children_of(os.getpid())) - before == set()


async def test_disconnect_soft_deletes_the_tools_and_forgets_the_connection(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session]
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config())
    await bridge.disconnect("raw")
    repo = SqlToolRepository(sqlite_sessions)
    assert not [t for t in repo.find(created_by="mcp:raw")]
    assert repo.find(created_by="mcp:raw", include_deleted=True)
    assert SqlConnectionStore(sqlite_sessions).load() == []
    with pytest.raises(NotFound):
        await bridge.call_tool("raw", "echo", {"message": "x"})
    with pytest.raises(NotFound):
        await bridge.disconnect("raw")


async def test_a_tool_that_runs_only_as_a_task_is_skipped_saying_why(
    make_bridge: BridgeFactory, tmp_path: Path
) -> None:
    """MCP's task-augmented execution (`execution.taskSupport: "required"`): a plain call is
    refused by the server, so the model is not offered the tool; "optional" runs plainly."""
    inventory = tmp_path / "inventory.json"
    base = {"description": "d", "inputSchema": {"type": "object"}}
    inventory.write_text(
        json.dumps(
            [
                {**base, "name": "as_task", "execution": {"taskSupport": "required"}},
                {**base, "name": "either", "execution": {"taskSupport": "optional"}},
            ]
        )
    )
    bridge = make_bridge()
    report = await bridge.connect(raw_config("tasks", "--inventory", str(inventory)))
    assert "mcp_tasks_either" in report.tool_names
    assert "mcp_tasks_as_task" not in report.tool_names
    (skip,) = [s for s in report.skipped if s.startswith("as_task:")]
    assert 'execution.taskSupport "required"' in skip
    either = await bridge.call_tool("tasks", "either", {})
    assert either.envelope == Ok(data="either v1")


async def test_reconnect_reports_changes_and_holds_changed_definitions_until_approved(
    make_bridge: BridgeFactory, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    tool = {"name": "alpha", "description": "first", "inputSchema": {"type": "object"}}
    inventory.write_text(json.dumps([tool, {**tool, "name": "beta"}]))
    bridge = make_bridge(sessions)
    config = raw_config("inv", "--inventory", str(inventory))
    first = await bridge.connect(config)
    assert {"mcp_inv_alpha", "mcp_inv_beta"} <= set(first.tool_names)
    # The server changes alpha's schema, drops beta and adds gamma.
    changed = {**tool, "inputSchema": {"type": "object", "required": ["x"]}, "version": 2}
    inventory.write_text(json.dumps([changed, {**tool, "name": "gamma"}]))
    report = await bridge.reconnect("inv")
    assert report.added == ["mcp_inv_gamma"]
    assert report.removed == ["mcp_inv_beta"]
    assert report.changed == ["mcp_inv_alpha"] == report.held
    repo = SqlToolRepository(sessions)
    alpha = repo.get("mcp_inv_alpha")
    assert alpha is not None and alpha.status == "testing"
    # Reconnecting again does not release the hold; approval does, and then it sticks.
    assert (await bridge.reconnect("inv")).changed == []
    assert (repo.get("mcp_inv_alpha") or alpha).status == "testing"
    repo.set_status("mcp_inv_alpha", "approved", "", None)
    assert (await bridge.reconnect("inv")).changed == []
    assert (repo.get("mcp_inv_alpha") or alpha).status == "approved"
    # An admin's disable survives a reconnect too.
    repo.set_status("mcp_inv_gamma", None, "", False)
    await bridge.reconnect("inv")
    gamma = repo.get("mcp_inv_gamma")
    assert gamma is not None and not gamma.enabled
    assert (await bridge.call_tool("inv", "alpha", {})).envelope == Ok(data="alpha v2")


async def test_without_hold_a_changed_definition_stays_approved(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    schema = {"type": "object"}
    inventory.write_text(
        json.dumps([{"name": "alpha", "description": "v1", "inputSchema": schema}])
    )
    bridge = make_bridge(hold_changed=False)
    await bridge.connect(raw_config("inv", "--inventory", str(inventory)))
    inventory.write_text(
        json.dumps([{"name": "alpha", "description": "v2", "inputSchema": schema}])
    )
    report = await bridge.reconnect("inv")
    assert report.changed == ["mcp_inv_alpha"] and report.held == []
    alpha = SqlToolRepository(sqlite_sessions).get("mcp_inv_alpha")
    assert alpha is not None and alpha.status == "approved"


async def test_bad_servers_give_clear_errors_and_the_bridge_keeps_serving(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge(connect_timeout_s=1.5)
    await bridge.connect(raw_config("good"))
    with pytest.raises(FailedPrecondition) as missing:
        await bridge.connect(
            ServerConfig(name="missing", transport="stdio", command="no-such-mcp-server-xyz")
        )
    assert missing.value.reason == "MCP_COMMAND_NOT_FOUND"
    assert "no-such-mcp-server-xyz" in missing.value.message
    with pytest.raises(DeadlineExceeded) as never:
        await bridge.connect(raw_config("never", "--never-init"))
    assert never.value.reason == "MCP_INITIALIZE_TIMEOUT"
    with pytest.raises(Unavailable) as refused:
        await bridge.connect(
            ServerConfig(name="refused", transport="streamable_http", url="http://127.0.0.1:9/mcp")
        )
    assert refused.value.reason in {"MCP_SERVER_UNREACHABLE", "MCP_CONNECT_FAILED"}
    with pytest.raises(InvalidArgument):
        await bridge.connect(ServerConfig(name="bad name", transport="stdio", command="x"))
    with pytest.raises(InvalidArgument):
        await bridge.connect(ServerConfig(name="nourl", transport="streamable_http", url="ftp://x"))
    with pytest.raises(AlreadyExists):
        await bridge.connect(raw_config("good"))
    assert [c.name for c in (i.server for i in bridge.list_connections())] == ["good"]
    assert (await bridge.call_tool("good", "echo", {"message": "still"})).envelope == Ok(
        data="Echo: still"
    )


async def test_a_slow_starting_server_connects_within_the_timeout(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge(connect_timeout_s=20.0)
    report = await bridge.connect(raw_config("slow", "--slow-start", "1"))
    assert "mcp_slow_echo" in report.tool_names


async def test_stored_connections_are_restored_by_a_new_bridge(
    make_bridge: BridgeFactory, sqlite_sessions: sessionmaker[Session]
) -> None:
    before = set(children_of(os.getpid()))
    first = make_bridge()
    await first.connect(raw_config("keep", env={"SECRET_TOKEN": "s3cret"}))
    await first.stop()  # shutdown reaps the server but keeps the stored connection and tools
    assert set(children_of(os.getpid())) - before == set()
    assert SqlToolRepository(sqlite_sessions).get("mcp_keep_echo") is not None
    second = make_bridge()
    assert await second.restore() == ["keep"]
    await wait_until(lambda: second.list_connections()[0].state == "connected")
    [info] = second.list_connections()
    assert info.server.env == {"SECRET_TOKEN": "***"}
    assert (await second.call_tool("keep", "echo", {"message": "r"})).envelope == Ok(data="Echo: r")


async def test_mcp_server_time_over_stdio_returns_structured_content(
    make_bridge: BridgeFactory,
) -> None:
    command = str(Path(sys.executable).parent / "mcp-server-time")
    bridge = make_bridge()
    report = await bridge.connect(ServerConfig(name="time", transport="stdio", command=command))
    assert "mcp_time_get_current_time" in report.tool_names
    outcome = await bridge.call_tool("time", "get_current_time", {"timezone": "UTC"})
    assert isinstance(outcome.envelope, Ok)
    assert outcome.structured is not None and outcome.structured["timezone"] == "UTC"


async def test_without_the_mcp_sdk_connect_says_what_to_install(
    make_bridge: BridgeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    bridge = make_bridge()
    with pytest.raises(FailedPrecondition) as caught:
        await bridge.connect(raw_config())
    assert caught.value.reason == "MCP_SDK_MISSING"
    assert "pip install" in caught.value.message


async def test_a_servers_oversized_description_is_clipped_to_what_the_registry_takes(
    make_bridge: BridgeFactory, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.json"
    wordy = {"name": "wordy", "description": "w" * 100_000, "inputSchema": {"type": "object"}}
    inventory.write_text(json.dumps([wordy]))
    bridge = make_bridge(sessions)
    await bridge.connect(raw_config("inv", "--inventory", str(inventory)))
    tool = SqlToolRepository(sessions).get("mcp_inv_wordy")
    assert tool is not None
    assert len(tool.description) == convert.MAX_TOOL_DESCRIPTION_CHARS
    assert tool.description.startswith("[MCP: inv] www")
    assert tool.description.endswith("(clipped from 100011 characters)")
