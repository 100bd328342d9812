"""The registry core without a network: catalog for the LLM, validation, routing, handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from services.registry.core import Registry, inject_reasoning
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from shared.contract import Err, Hint, HintException, Ok, ToolResult, to_envelope
from shared.errors import FailedPrecondition, NotFound


class InProcessCaller:
    """Composition straight into the same Registry (the service goes over gRPC)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def call_tool(
        self, name: str, inputs: Mapping[str, Any], context: ToolContext
    ) -> ToolResult:
        nested = ToolContext(
            tool_name=name,
            tenant_id=context.tenant_id,
            conversation_id=context.conversation_id,
            depth=context.depth + 1,
        )
        return (await self.registry.execute(name, dict(inputs), nested)).result


@pytest.fixture
def registry(sessions: sessionmaker[Session]) -> Registry:
    repo = SqlToolRepository(sessions)
    reg = Registry(repo, cache_ttl_s=0.0)
    caller = InProcessCaller(reg)

    def defaults(ctx: ToolContext) -> None:
        ctx.caller = caller

    reg._context_defaults = defaults
    reg.seed_system_tools()
    assert reg.auto_register_handlers() == {}
    return reg


def ctx(tenant: str = "t1", **kw: Any) -> ToolContext:
    return ToolContext(tool_name="", tenant_id=tenant, conversation_id="c1", **kw)


def custom(name: str, tenant: str = "t1", **kw: Any) -> ToolDef:
    defaults: dict[str, Any] = {
        "description": f"custom {name}",
        "input_schema": {"type": "object"},
        "tool_type": "custom",
        "implementation": "result = 1",
        "tenant_id": tenant,
        "created_by": "u1",
        "status": "approved",
    }
    defaults.update(kw)
    return ToolDef(name=name, **defaults)


def test_the_llm_catalog_hides_internal_unapproved_disabled_deleted_and_foreign_tools(
    registry: Registry,
) -> None:
    registry.repo.upsert(
        [
            custom("mine"),
            custom("theirs", tenant="t2"),
            custom("drafty", status="draft"),
            custom("off", enabled=False),
            custom("gone"),
        ]
    )
    registry.repo.soft_delete(["gone"], "")
    names = [t.name for t in registry.tools_for_llm("t1")]
    assert "mine" in names and "load_dataset" in names
    assert not {"theirs", "drafty", "off", "gone", "ping", "compose_ping"} & set(names)
    assert names.index("load_dataset") < names.index("query")  # prompt order


def test_every_llm_schema_requires_reasoning_except_plan() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    injected = inject_reasoning("query", schema)
    assert injected["required"] == ["a", "reasoning"]
    assert injected["properties"]["reasoning"]["type"] == "string"
    assert "reasoning" not in schema["properties"]  # the stored schema is not mutated
    assert "reasoning" not in inject_reasoning("plan", schema).get("properties", {})


async def test_reasoning_is_stripped_into_the_context(registry: Registry) -> None:
    seen: dict[str, Any] = {}

    def spy(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
        seen.update(inputs=dict(inputs), reasoning=context.reasoning)
        return ToolResult(content="done")

    registry.register_handler("ping", spy)
    await registry.execute("ping", {"echo": 1, "reasoning": "because"}, ctx())
    assert seen == {"inputs": {"echo": 1}, "reasoning": "because"}


async def test_an_unknown_tool_raises_not_found_with_suggestions(registry: Registry) -> None:
    with pytest.raises(NotFound) as caught:
        await registry.execute("qeury", {}, ctx())
    assert "query" in caught.value.metadata["suggestions"]


async def test_another_tenants_custom_tool_does_not_exist_for_the_caller(
    registry: Registry,
) -> None:
    registry.repo.upsert([custom("secret", tenant="t2")])
    with pytest.raises(NotFound):
        await registry.execute("secret", {}, ctx("t1"))


async def test_a_custom_tool_without_a_sandbox_is_a_failed_precondition(
    registry: Registry,
) -> None:
    registry.repo.upsert([custom("mine")])
    with pytest.raises(FailedPrecondition) as caught:
        await registry.execute("mine", {}, ctx())
    assert caught.value.reason == "SERVICE_NOT_CONFIGURED"
    assert caught.value.metadata["service"] == "sandbox"


async def test_custom_tools_route_to_the_configured_executor(registry: Registry) -> None:
    class Sandbox:
        async def execute(
            self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
        ) -> ToolResult:
            return ToolResult(content=f"ran {tool.name} with {inputs}")

    registry._routes["custom"] = Sandbox()
    registry.repo.upsert([custom("mine")])
    result = (await registry.execute("mine", {"a": 1}, ctx())).result
    assert "ran mine with {'a': 1}" in result.content


async def test_missing_capabilities_are_a_permission_denied_err(registry: Registry) -> None:
    registry.repo.upsert([custom("guarded", required_capabilities=["admin"])])
    result = (await registry.execute("guarded", {}, ctx())).result
    assert isinstance(result.envelope, Err)
    assert result.envelope.err_kind == "permission_denied"


async def test_unapproved_and_disabled_tools_refuse_with_an_err(registry: Registry) -> None:
    registry.repo.upsert([custom("drafty", status="draft"), custom("off", enabled=False)])
    drafty = (await registry.execute("drafty", {}, ctx())).result.envelope
    off = (await registry.execute("off", {}, ctx())).result.envelope
    assert isinstance(drafty, Err) and drafty.err_kind == "tool_not_approved"
    assert isinstance(off, Err) and off.err_kind == "tool_disabled"


async def test_schema_violations_name_the_field_and_the_expectation(registry: Registry) -> None:
    result = (await registry.execute("ping", {"delay_ms": -5}, ctx())).result
    assert isinstance(result.envelope, Hint)
    assert result.envelope.hint_kind == "schema"
    assert "delay_ms" in result.envelope.message
    result = (await registry.execute("preview_data", {}, ctx())).result
    assert isinstance(result.envelope, Hint)
    assert "missing required field 'name'" in result.envelope.message


async def test_sync_and_async_handlers_both_run_without_blocking_the_loop(
    registry: Registry,
) -> None:
    import threading
    import time

    main_thread = threading.get_ident()
    threads: list[int] = []

    def slow_sync(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
        threads.append(threading.get_ident())
        time.sleep(0.3)
        return ToolResult(content="sync")

    registry.register_handler("preview_data", slow_sync)
    started = time.monotonic()
    results = await asyncio.gather(
        registry.execute("preview_data", {"name": "x"}, ctx()),
        registry.execute("preview_data", {"name": "y"}, ctx()),
        registry.execute("ping", {"delay_ms": 300}, ctx()),
    )
    assert time.monotonic() - started < 0.85
    assert all(t != main_thread for t in threads)
    assert [r.result.error for r in results] == [None, None, None]


async def test_handler_returns_are_normalised_and_bad_returns_become_errs(
    registry: Registry,
) -> None:
    cases: list[tuple[Any, str]] = [
        ({"message": "legacy dict", "cards": [{"type": "chart"}]}, "ok"),
        ("plain text", "ok"),
        ({"message": "x", "error": "schema hint: no column foo"}, "hint"),
        ({"message": "x", "error": "fetch hint: add a filter"}, "hint"),
        (42, "invalid_result"),
        (ToolResult(datasets={"d": [1, 2]}), "invalid_dataset"),
        (ToolResult(cards=["not a dict"]), "invalid_card"),  # type: ignore[list-item]
    ]
    for value, expected in cases:
        registry.register_handler("ping", lambda i, c, v=value: v)
        env = to_envelope((await registry.execute("ping", {}, ctx())).result)
        if expected == "ok":
            assert isinstance(env, Ok), value
        elif expected == "hint":
            assert isinstance(env, Hint), value
        else:
            assert isinstance(env, Err) and env.err_kind == expected, value


async def test_a_hint_exception_becomes_a_hint(registry: Registry) -> None:
    def hinting(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
        raise HintException("ambiguous", "two matches", [{"label": "a", "score": 0.9}])

    registry.register_handler("ping", hinting)
    env = (await registry.execute("ping", {}, ctx())).result.envelope
    assert isinstance(env, Hint) and env.hint_kind == "ambiguous"
    assert env.alternatives[0].label == "a"


async def test_a_broken_handler_path_is_skipped_and_the_rest_serve(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    reg = Registry(repo)
    tools = [dict(t) for t in reg.system_tools]
    tools[0] = {**tools[0], "handler_path": "services.registry.tools.nope.missing"}
    reg.seed_system_tools(tools)
    failures = reg.auto_register_handlers()
    assert list(failures) == [tools[0]["name"]]
    result = (await reg.execute(tools[0]["name"], {"path": "x.csv"}, ctx())).result
    assert isinstance(result.envelope, Err) and result.envelope.err_kind == "handler_missing"
    assert (await reg.execute("ping", {}, ctx())).result.error is None


async def test_composition_re_enters_the_registry(registry: Registry) -> None:
    result = (await registry.execute("compose_ping", {"echo": "hi"}, ctx())).result
    assert isinstance(result.envelope, Ok)
    assert result.envelope.data["inner"] == {"pong": True, "echo": "hi"}


async def test_runaway_composition_stops_at_the_depth_limit(registry: Registry) -> None:
    async def recurse(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
        return await context.call_tool("ping", {})

    registry.register_handler("ping", recurse)
    result = (await registry.execute("ping", {}, ctx())).result
    assert isinstance(result.envelope, Err)
    assert result.envelope.err_kind == "max_depth_exceeded"


async def test_a_stored_schema_with_a_dangling_reference_answers_a_schema_hint(
    registry: Registry,
) -> None:
    # An MCP server's schema is stored as sent; a $ref it cannot resolve used to raise out of
    # validation on every call (INTERNAL).
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    registry.repo.upsert([custom("dangling", input_schema=schema, tool_type="mcp")])
    result = (await registry.execute("dangling", {"a": 1}, ctx())).result
    assert isinstance(result.envelope, Hint)
    assert result.envelope.hint_kind == "schema"
    assert "cannot be resolved" in result.envelope.message
