"""A service's limit of calls at once (TOOLMESH_MAX_IN_FLIGHT, HandlerWrapper): past it a new
call is answered RESOURCE_EXHAUSTED with reason OVERLOADED at once, without running, instead of
queueing without bound; health and reflection never count or get refused, and the slot comes
back when a call ends, however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from shared.config import Settings
from shared.rpc_errors import from_rpc_error
from shared.server import HandlerWrapper

SERVICE = "test.Overload"
HEALTH = "grpc.health.v1.Health"


def _ident(b: bytes) -> bytes:
    return b


class Handlers:
    def __init__(self) -> None:
        self.running = 0
        self.ran = 0
        self.release = asyncio.Event()
        self.changed = asyncio.Event()  # set whenever `running` changes

    async def slow(self, request: bytes, context: Any) -> bytes:
        self.running += 1
        self.ran += 1
        self.changed.set()
        try:
            await self.release.wait()
            if request == b"fail":
                raise RuntimeError("handler failed")
            return b"finished"
        finally:
            self.running -= 1
            self.changed.set()

    async def quick(self, request: bytes, context: Any) -> bytes:
        self.ran += 1
        return b"quick"


@pytest.fixture
async def served() -> AsyncIterator[tuple[Handlers, grpc.aio.Channel]]:
    wrapper, handlers = HandlerWrapper(False, max_in_flight=2), Handlers()
    server = grpc.aio.server()
    for service in (SERVICE, HEALTH):
        table = {
            name: wrapper.wrap(
                f"/{service}/{name}",
                grpc.unary_unary_rpc_method_handler(getattr(handlers, name), _ident, _ident),
            )
            for name in ("slow", "quick")
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, table),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield handlers, channel
    await channel.close()
    await server.stop(None)


def method(channel: grpc.aio.Channel, name: str, service: str = SERVICE) -> Any:
    return channel.unary_unary(f"/{service}/{name}", _ident, _ident)


async def until(handlers: Handlers, holds: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not holds():
            handlers.changed.clear()
            await handlers.changed.wait()


async def test_a_call_past_the_limit_is_refused_overloaded_without_running(
    served: tuple[Handlers, grpc.aio.Channel],
) -> None:
    handlers, channel = served
    first = asyncio.ensure_future(method(channel, "slow")(b""))
    second = asyncio.ensure_future(method(channel, "slow")(b"fail"))
    await until(handlers, lambda: handlers.running == 2)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await method(channel, "quick")(b"", timeout=10)

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    error = from_rpc_error(refused.value)
    assert error.reason == "OVERLOADED" and "TOOLMESH_MAX_IN_FLIGHT" in error.message
    assert handlers.ran == 2  # the refused call never ran
    # Health is not held by the limit (a probe of a busy replica must not fail).
    assert await method(channel, "quick", HEALTH)(b"", timeout=10) == b"quick"

    handlers.release.set()
    assert await first == b"finished"
    with pytest.raises(grpc.aio.AioRpcError):
        await second  # a call that failed gives its slot back too
    assert [await method(channel, "quick")(b"", timeout=10) for _ in range(3)] == [b"quick"] * 3


async def test_a_cancelled_call_gives_its_slot_back(
    served: tuple[Handlers, grpc.aio.Channel],
) -> None:
    handlers, channel = served
    calls = [method(channel, "slow")(b"") for _ in range(2)]
    await until(handlers, lambda: handlers.running == 2)
    for call in calls:
        call.cancel()
    await until(handlers, lambda: handlers.running == 0)
    assert await method(channel, "quick")(b"", timeout=10) == b"quick"


def test_the_limit_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).max_in_flight == 4096
    assert Settings.from_env({"TOOLMESH_MAX_IN_FLIGHT": "0"}).max_in_flight == 0
    assert Settings.from_env({"TOOLMESH_MAX_IN_FLIGHT": "64"}).max_in_flight == 64
