"""The registry's caches stay bounded however many tools come and go. Compiled validators: one
entry per tool name (a re-registered tool's new version replaces the old one), the least
recently called names dropped past the bound, a deleted tool's entry dropped at once. Looked-up
definitions: only those of the last cache TTL, unknown names included."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.model import ToolDef
from services.registry.repository import ToolRepository
from shared.contract import Hint, Ok, ToolResult, envelope_to_tool_result
from shared.errors import NotFound


class DictRepository:
    """The little of ToolRepository that looking a tool up needs."""

    def __init__(self) -> None:
        self.tools: dict[str, ToolDef] = {}

    def get(self, name: str) -> ToolDef | None:
        return self.tools.get(name)

    def find(self, **_: Any) -> list[ToolDef]:
        return list(self.tools.values())


class Accepting:
    """The sandbox's place: runs nothing, answers Ok (what reaches it passed validation)."""

    async def execute(self, tool: ToolDef, inputs: dict[str, Any], context: Any) -> ToolResult:
        return envelope_to_tool_result(Ok(data=inputs))


def registry_of(repo: DictRepository) -> Registry:
    return Registry(
        cast(ToolRepository, repo),
        routes={"custom": Accepting()},
        cache_ttl_s=0.0,
        max_cached_validators=8,
    )


def patterned(name: str, version: int) -> ToolDef:
    """A custom tool whose input schema has a pattern of its own (one per name and version)."""
    return ToolDef(
        name=name,
        description="custom",
        input_schema={
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": f"^{name}_v{version}_[a-z]+$"}},
            "required": ["s"],
        },
        tool_type="custom",
        implementation="result = 1",
        tenant_id="t1",
        version=version,
    )


async def call(registry: Registry, name: str, value: str) -> Any:
    context = ToolContext(tool_name="", tenant_id="t1", conversation_id="c1")
    return (await registry.execute(name, {"s": value}, context)).result.envelope


def test_validators_of_tools_registered_reregistered_and_deleted_stay_bounded() -> None:
    repo = DictRepository()
    registry = registry_of(repo)

    async def churn() -> None:
        for i in range(40):
            name = f"tool_{i}"
            for version in (1, 2, 3):
                repo.tools[name] = patterned(name, version)
                refused = await call(registry, name, "nope")
                assert isinstance(refused, Hint) and refused.hint_kind == "schema"
                assert isinstance(await call(registry, name, f"{name}_v{version}_ok"), Ok)
            assert len(registry._validators_cache) <= 8
        # Re-registered: only the latest version of a name is kept.
        assert sorted(registry._validators_cache) == [f"tool_{i}" for i in range(32, 40)]
        del repo.tools["tool_39"]
        registry.invalidate("tool_39")
        assert "tool_39" not in registry._validators_cache

    asyncio.run(churn())
    registry.close()


def test_a_new_version_is_validated_against_its_own_schema() -> None:
    repo = DictRepository()
    registry = registry_of(repo)

    async def versions() -> tuple[Any, Any]:
        repo.tools["t"] = patterned("t", 1)
        await call(registry, "t", "t_v1_a")
        repo.tools["t"] = patterned("t", 2)
        return await call(registry, "t", "t_v1_a"), await call(registry, "t", "t_v2_a")

    old_value, new_value = asyncio.run(versions())
    registry.close()
    assert isinstance(old_value, Hint) and old_value.hint_kind == "schema"
    assert isinstance(new_value, Ok)


def test_looked_up_definitions_are_kept_for_their_ttl_only() -> None:
    repo = DictRepository()
    repo.tools["t"] = patterned("t", 1)
    now = [0.0]
    registry = Registry(cast(ToolRepository, repo), cache_ttl_s=2.0, clock=lambda: now[0])

    async def lookups() -> None:
        for i in range(3000):
            now[0] = i * 0.01  # 100 lookups a second: 200 within a TTL
            try:
                await registry.lookup(f"unknown_{i}", "t1")
            except NotFound:
                pass
            assert len(registry._cache) <= 201
        assert (await registry.lookup("t", "t1")).name == "t"

    asyncio.run(lookups())
    registry.close()
