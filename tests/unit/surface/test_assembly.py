"""Composition by mode, intersection with the live catalog, the capability double guard and the
surface budget backstop."""

from __future__ import annotations

import json

import pytest

from services.surface.assembly import (
    MAX_TOOL_SURFACE,
    CatalogTool,
    ToolSurfaceBudgetError,
    compose,
    provider_native_capabilities,
    render,
)


def catalog(*names: str, **extra: CatalogTool) -> dict[str, CatalogTool]:
    tools = {n: render(CatalogTool(n, f"{n} tool", {"type": "object"})) for n in names}
    tools.update(extra)
    return tools


FLOOR = ("search_tools", "plan", "query", "web_search", "retired_tool")


def names(surface) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.name for t, _ in surface.tools]


def test_chat_is_floor_and_working_set_minus_agentic_only() -> None:
    cat = catalog("search_tools", "plan", "query", "web_search", "slack")
    s = compose(
        mode="chat",
        floor=FLOOR,
        working_set=["slack", "plan"],
        catalog=cat,
        tenant_id="t",
        capabilities=(),
    )
    assert names(s) == ["search_tools", "query", "web_search", "slack"]
    assert s.skipped == ["retired_tool"]
    assert [r for _, r in s.tools] == [True, True, True, False]


def test_agentic_is_the_pm_allowlist_and_the_working_set() -> None:
    cat = catalog("search_tools", "plan", "query", "describe_entry", "slack")
    s = compose(
        mode="agentic",
        floor=FLOOR,
        working_set=["slack"],
        catalog=cat,
        tenant_id="t",
        capabilities=(),
    )
    assert names(s) == ["plan", "describe_entry", "search_tools", "slack"]
    assert "query" not in names(s)


def test_delegate_matches_chat_while_nothing_is_delegate_excluded() -> None:
    cat = catalog("search_tools", "plan", "query")
    args = dict(floor=FLOOR, working_set=[], catalog=cat, tenant_id="t", capabilities=())
    assert names(compose(mode="delegate", **args)) == names(compose(mode="chat", **args))  # type: ignore[arg-type]


def test_tools_of_other_tenants_internal_or_needing_capabilities_are_skipped() -> None:
    cat = catalog(
        "search_tools",
        query=CatalogTool("query", "", {}, tenant_id="other"),
        web_search=CatalogTool("web_search", "", {}, required_capabilities=frozenset({"net"})),
        plan=CatalogTool("plan", "", {}, category="internal"),
    )
    s = compose(
        mode="chat", floor=FLOOR, working_set=[], catalog=cat, tenant_id="t", capabilities=()
    )
    assert names(s) == ["search_tools"]
    with_cap = compose(
        mode="chat", floor=FLOOR, working_set=[], catalog=cat, tenant_id="t", capabilities={"net"}
    )
    assert "web_search" in names(with_cap)


def web_catalog() -> dict[str, CatalogTool]:
    return catalog(
        "search_tools",
        web_search=render(
            CatalogTool("web_search", "", {}, replaced_by_model_capability="web_search")
        ),
    )


def test_capability_filter_needs_both_the_model_and_the_provider() -> None:
    args = dict(
        mode="chat",
        floor=FLOOR,
        working_set=[],
        catalog=web_catalog(),
        tenant_id="t",
        capabilities=(),
    )
    both = compose(**args, model_capabilities={"web_search"}, provider="openai_responses")  # type: ignore[arg-type]
    assert "web_search" not in names(both) and both.filtered == ["web_search"]
    model_only = compose(**args, model_capabilities={"web_search"}, provider="anthropic")  # type: ignore[arg-type]
    assert "web_search" in names(model_only)
    provider_only = compose(**args, model_capabilities=(), provider="openai_responses")  # type: ignore[arg-type]
    assert "web_search" in names(provider_only)
    assert provider_native_capabilities("unknown") == frozenset()


def test_capability_filter_spares_the_working_set() -> None:
    s = compose(
        mode="chat",
        floor=FLOOR,
        working_set=["web_search"],
        catalog=web_catalog(),
        tenant_id="t",
        capabilities=(),
        model_capabilities={"web_search"},
        provider="openai_responses",
    )
    assert "web_search" in names(s) and s.filtered == []


def test_budget_violation_raises_rather_than_truncating() -> None:
    many = [f"t{i}" for i in range(MAX_TOOL_SURFACE + 1)]
    cat = catalog(*many)
    with pytest.raises(ToolSurfaceBudgetError) as info:
        compose(
            mode="chat", floor=(), working_set=many, catalog=cat, tenant_id="t", capabilities=()
        )
    assert info.value.code == "RESOURCE_EXHAUSTED" and info.value.reason == "TOOL_SURFACE_BUDGET"
    ok = compose(
        mode="chat", floor=(), working_set=many[:-1], catalog=cat, tenant_id="t", capabilities=()
    )
    assert len(ok.tools) == MAX_TOOL_SURFACE


def test_renderings_carry_the_reasoning_field_except_for_plan() -> None:
    tool = render(
        CatalogTool(
            "query",
            "Run SQL",
            {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
        )
    )
    anthropic, openai = json.loads(tool.anthropic_json), json.loads(tool.openai_json)
    assert anthropic["input_schema"]["required"] == ["sql", "reasoning"]
    assert openai["function"]["parameters"] == anthropic["input_schema"]
    plan = json.loads(render(CatalogTool("plan", "", {"type": "object"})).anthropic_json)
    assert "reasoning" not in plan["input_schema"].get("properties", {})
