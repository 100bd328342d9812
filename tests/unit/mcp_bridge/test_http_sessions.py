"""A streamable HTTP server that forgets the bridge's session — it restarted, or expired it —
answers a request carrying the old `Mcp-Session-Id` with 404 (the MCP spec: the client must
open a new session) or, on older SDKs, 400 with an error about the session. The bridge opens a
new session and sends the refused call again, once: the call succeeds and runs once. Against
tests/mcp_servers/session_http_server.py, a real process over TCP."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.mcp_bridge import connection
from services.mcp_bridge.model import ServerConfig
from shared.contract import Err, Ok
from shared.errors import FailedPrecondition, Unavailable
from tests.unit.mcp_bridge.conftest import BridgeFactory

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def session_server(
    port: int,
    forget_status: int = 404,
    token: str = "",
    get_status: int = 405,
    echo_description: str = "",
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.mcp_servers.session_http_server",
            "--forget-status",
            str(forget_status),
            "--token",
            token,
            "--get-status",
            str(get_status),
            "--echo-description",
            echo_description,
            str(port),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "the session server exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the session server did not listen"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def http_config(port: int, **headers: str) -> ServerConfig:
    return ServerConfig(
        name="sess",
        transport="streamable_http",
        url=f"http://127.0.0.1:{port}/mcp",
        headers=headers,
    )


@pytest.mark.parametrize("forget_status", [404, 400])
async def test_a_forgotten_session_is_reopened_and_the_refused_call_sent_again_once(
    make_bridge: BridgeFactory, forget_status: int
) -> None:
    port = free_port()
    bridge = make_bridge()
    with session_server(port, forget_status):
        await bridge.connect(http_config(port))
        first = await bridge.call_tool("sess", "echo", {"text": "a"})
        assert first.envelope == Ok(data="a #1")
        assert (await bridge.call_tool("sess", "forget", {})).envelope == Ok(data="forgotten")
        # Refused on the old session, sent again on a new one: it ran once (#2, not #3).
        again = await bridge.call_tool("sess", "echo", {"text": "b"})
        assert again.envelope == Ok(data="b #2")
        [info] = bridge.list_connections()
        assert (info.state, info.restarts) == ("connected", 1)


async def test_a_restarted_server_is_met_with_a_new_session(make_bridge: BridgeFactory) -> None:
    port = free_port()
    bridge = make_bridge()
    with session_server(port, 404):
        await bridge.connect(http_config(port))
        assert (await bridge.call_tool("sess", "echo", {"text": "a"})).envelope == Ok(data="a #1")
    with session_server(port, 404):  # the same address, a new process: no session known
        after = await bridge.call_tool("sess", "echo", {"text": "b"})
        assert after.envelope == Ok(data="b #1")
        assert (await bridge.call_tool("sess", "echo", {"text": "c"})).envelope == Ok(data="c #2")


async def test_a_server_back_with_a_changed_tool_does_not_get_the_refused_call_again(
    make_bridge: BridgeFactory,
) -> None:
    """Pinning: the call was approved against the old definition; the new one is held, so the
    refused call is answered, not sent again."""
    port = free_port()
    bridge = make_bridge()
    with session_server(port):
        await bridge.connect(http_config(port))
        assert (await bridge.call_tool("sess", "echo", {"text": "a"})).envelope == Ok(data="a #1")
    with session_server(port, echo_description="Echo, but changed."):
        refused = (await bridge.call_tool("sess", "echo", {"text": "b"})).envelope
        assert isinstance(refused, Err) and refused.err_kind == "tool_changed"
        assert "held for an administrator's approval" in refused.message
        [info] = bridge.list_connections()
        assert info.state == "connected"
        # It did not run: the new server's first echo is the next one.
        assert (await bridge.call_tool("sess", "echo", {"text": "c"})).envelope == Ok(data="c #1")


async def test_a_server_that_keeps_forgetting_gets_the_usual_backoff(
    make_bridge: BridgeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Say, a load balancer without sticky sessions: the second forgetting within
    FORGOTTEN_AGAIN_S waits the restart backoff instead of reconnecting in a tight loop."""
    monkeypatch.setattr(connection, "FORGOTTEN_AGAIN_S", 60.0)
    port = free_port()
    bridge = make_bridge(backoff_s=1.5, backoff_max_s=1.5)
    with session_server(port, 404):
        await bridge.connect(http_config(port))
        await bridge.call_tool("sess", "forget", {})
        assert (await bridge.call_tool("sess", "echo", {"text": "a"})).envelope == Ok(data="a #1")
        await bridge.call_tool("sess", "forget", {})
        started = time.monotonic()
        again = await bridge.call_tool("sess", "echo", {"text": "b"})
        assert again.envelope == Ok(data="b #2")
        assert time.monotonic() - started >= 1.4
        assert bridge.list_connections()[0].restarts == 2


async def test_refused_credentials_are_named_with_their_status_and_what_to_do(
    make_bridge: BridgeFactory,
) -> None:
    """The SDK reports an HTTP error whose body is not JSON-RPC as "Server returned an error
    response"; the bridge says which status it was, what the server said, and what to do."""
    port = free_port()
    bridge = make_bridge()
    with session_server(port, token="good"):
        with pytest.raises(FailedPrecondition) as refused:
            await bridge.connect(http_config(port, Authorization="Bearer stale"))
        message = refused.value.message
        assert "refused the handshake: HTTP 401 Unauthorized" in message
        assert "The access token expired" in message and "Reconnect" in message
        assert "Server returned an error response" not in message
        assert refused.value.metadata["http_status"] == "401"
        await bridge.connect(http_config(port, Authorization="Bearer good"))
        assert (await bridge.call_tool("sess", "revoke", {})).envelope == Ok(data="revoked")
        later = (await bridge.call_tool("sess", "echo", {"text": "a"})).envelope
        assert isinstance(later, Err) and later.err_kind == "mcp_error"
        assert "rejected the call to 'echo': HTTP 401 Unauthorized" in later.message
        assert "check the credentials" in later.message


async def test_a_404_to_the_optional_get_stream_does_not_make_the_session_look_lost(
    make_bridge: BridgeFactory,
) -> None:
    port = free_port()
    bridge = make_bridge()
    with session_server(port, get_status=404):
        await bridge.connect(http_config(port))
        for n in range(1, 4):
            out = await bridge.call_tool("sess", "echo", {"text": "a"})
            assert out.envelope == Ok(data=f"a #{n}")
            await asyncio.sleep(0.3)  # the supervisor watches every 0.2 s
        [info] = bridge.list_connections()
        assert (info.state, info.restarts) == ("connected", 0)


async def test_a_response_stream_that_ends_unanswered_is_unavailable_and_not_sent_again(
    make_bridge: BridgeFactory,
) -> None:
    """The server died mid-call (or a proxy cut the stream): the SDK answers the request itself
    ("SSE stream ended without a response"), which read as the server rejecting the call. It
    ran, or may have: UNAVAILABLE saying so, not sent again; the bridge reconnects."""
    port = free_port()
    bridge = make_bridge()
    with session_server(port):
        await bridge.connect(http_config(port))
        with pytest.raises(Unavailable) as lost:
            await bridge.call_tool("sess", "hang_up", {})
        message = lost.value.message
        assert "stopped answering during the call to 'hang_up'" in message
        assert "may or may not have run" in message and "reconnecting" in message
        assert "rejected" not in message
        # Not sent again (hang_up was call #1), and the next call is served.
        assert (await bridge.call_tool("sess", "echo", {"text": "a"})).envelope == Ok(data="a #2")
        [info] = bridge.list_connections()
        assert info.state == "connected"
