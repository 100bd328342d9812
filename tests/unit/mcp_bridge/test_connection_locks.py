"""The bridge keeps a connection name's lock only while someone holds or awaits it: connect /
disconnect cycles under ever new names, and Disconnect or Reconnect of names that never
existed, leave nothing behind, while calls on one name still run one at a time."""

from __future__ import annotations

import asyncio

import pytest

from shared.errors import NotFound
from tests.unit.mcp_bridge.conftest import BridgeFactory, raw_config


async def test_unknown_names_and_connect_cycles_leave_no_lock_behind(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge()
    for i in range(200):
        with pytest.raises(NotFound):
            await bridge.disconnect(f"never-{i}")
        with pytest.raises(NotFound):
            await bridge.reconnect(f"never-{i}")
    for i in range(2):
        await bridge.connect(raw_config(f"cycle{i}"))
        await bridge.disconnect(f"cycle{i}")
    assert bridge._locks == {}


async def test_a_names_lock_still_serialises_its_holders(make_bridge: BridgeFactory) -> None:
    bridge = make_bridge()
    inside: list[int] = []
    overlaps = 0

    async def hold(i: int) -> None:
        nonlocal overlaps
        async with bridge._lock("one"):
            inside.append(i)
            overlaps += len(inside) > 1
            await asyncio.sleep(0.01)
            inside.remove(i)

    await asyncio.gather(*(hold(i) for i in range(5)))
    assert overlaps == 0
    assert bridge._locks == {}

    # A waiter cancelled while it waits gives its place up too.
    async with bridge._lock("two"):
        waiter = asyncio.ensure_future(hold(9))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    assert bridge._locks == {}
