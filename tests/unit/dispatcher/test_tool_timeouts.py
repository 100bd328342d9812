"""The dispatcher's cache of per-tool timeouts stays bounded however many (tenant, tool) pairs
callers send, unknown tool names included: expired entries go as new ones come, and never more
than its bound are kept."""

from __future__ import annotations

import asyncio

from services.dispatcher.core import ToolTimeouts
from shared.errors import NotFound
from toolmesh.registry.v1 import registry_pb2 as rpb


class Registry:
    """Knows one tool, `slow`, with a timeout of its own; every other name is unknown."""

    def __init__(self) -> None:
        self.lookups = 0

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        raise NotImplementedError

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        self.lookups += 1
        if name == "slow":
            return 900.0
        raise NotFound(f"unknown tool {name!r}", reason="TOOL_NOT_FOUND")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_distinct_tenants_and_unknown_names_never_grow_it_past_its_bound() -> None:
    registry = Registry()
    timeouts = ToolTimeouts(registry, 300.0, ttl_s=30.0, clock=Clock(), max_entries=100)

    async def flood() -> None:
        for i in range(5000):
            assert await timeouts.get(f"nope_{i}", f"tenant-{i % 700}") == 300.0
            assert len(timeouts) <= 100
        assert await timeouts.get("slow", "tenant-a") == 900.0

    asyncio.run(flood())
    # The newest entries are the ones kept, and they answer without a lookup.
    before = registry.lookups
    assert timeouts.cached("slow", "tenant-a") == 900.0
    assert timeouts.cached("nope_4999", "tenant-99") == 300.0
    assert timeouts.cached("nope_0", "tenant-0") is None
    assert registry.lookups == before


def test_expired_entries_are_dropped_as_new_ones_come() -> None:
    clock = Clock()
    timeouts = ToolTimeouts(Registry(), 300.0, ttl_s=30.0, clock=clock, max_entries=10_000)

    async def two_waves() -> None:
        for i in range(50):
            await timeouts.get(f"early_{i}", "t")
        clock.now = 31.0  # every early entry has expired
        await timeouts.get("slow", "t")

    asyncio.run(two_waves())
    assert len(timeouts) == 1
    assert timeouts.cached("slow", "t") == 900.0
