"""Draining a server's calls (HandlerWrapper.drain, run on SIGTERM before the server stops):
new calls are refused UNAVAILABLE with reason SHUTTING_DOWN, which clients retry elsewhere,
while the running ones finish; health and reflection are not held or refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from shared.rpc_errors import from_rpc_error
from shared.server import HandlerWrapper

SERVICE = "test.Drain"


def _ident(b: bytes) -> bytes:
    return b


class Slow:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def slow(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        await self.release.wait()
        return b"finished"

    async def quick(self, request: bytes, context: Any) -> bytes:
        return b"quick"


@pytest.fixture
async def served() -> AsyncIterator[tuple[HandlerWrapper, Slow, grpc.aio.Channel]]:
    wrapper, handlers = HandlerWrapper(False), Slow()
    table = {
        name: wrapper.wrap(
            f"/{SERVICE}/{name}",
            grpc.unary_unary_rpc_method_handler(getattr(handlers, name), _ident, _ident),
        )
        for name in ("slow", "quick")
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, table),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield wrapper, handlers, channel
    await channel.close()
    await server.stop(None)


def method(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/{SERVICE}/{name}", _ident, _ident)


async def test_a_drain_refuses_new_calls_and_waits_for_the_running_ones(
    served: tuple[HandlerWrapper, Slow, grpc.aio.Channel],
) -> None:
    wrapper, handlers, channel = served
    running = asyncio.ensure_future(method(channel, "slow")(b""))
    await asyncio.wait_for(handlers.started.wait(), 10)
    drained = asyncio.ensure_future(wrapper.drain(30))
    await asyncio.sleep(0)  # the drain has begun
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await method(channel, "quick")(b"")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert from_rpc_error(refused.value).reason == "SHUTTING_DOWN"
    assert not drained.done()
    handlers.release.set()
    assert await asyncio.wait_for(running, 10) == b"finished"
    assert await asyncio.wait_for(drained, 10) is True


async def test_a_drain_gives_up_at_its_timeout(
    served: tuple[HandlerWrapper, Slow, grpc.aio.Channel],
) -> None:
    wrapper, handlers, channel = served
    running = asyncio.ensure_future(method(channel, "slow")(b""))
    await asyncio.wait_for(handlers.started.wait(), 10)
    assert await wrapper.drain(0.05) is False
    handlers.release.set()
    await asyncio.wait_for(running, 10)


async def test_an_idle_server_drains_at_once(
    served: tuple[HandlerWrapper, Slow, grpc.aio.Channel],
) -> None:
    wrapper, _, channel = served
    assert await method(channel, "quick")(b"") == b"quick"
    assert await wrapper.drain(30) is True
