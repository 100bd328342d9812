"""The system catalog: composition in _TOOL_ORDER, both-direction cross-checks, feature flags."""

from __future__ import annotations

import types

import pytest

from services.registry import catalog
from services.registry.catalog import _TOOL_ORDER, SYSTEM_TOOLS, _assemble, build_system_tools


def _module(*tools: dict[str, object]) -> types.SimpleNamespace:
    return types.SimpleNamespace(__name__="fake", TOOLS=list(tools))


def _schema(name: str) -> dict[str, object]:
    return {
        "name": name,
        "description": f"{name} tool",
        "input_schema": {"type": "object"},
        "category": "test",
        "handler_path": f"x.{name}",
    }


def test_system_tools_follow_the_tool_order_exactly() -> None:
    assert [t["name"] for t in SYSTEM_TOOLS] == list(_TOOL_ORDER)


def test_a_name_in_the_order_that_no_category_declares_raises_at_assembly() -> None:
    with pytest.raises(KeyError, match="no category declares"):
        _assemble([_module(_schema("a"))], ("a", "b"))


def test_a_declared_tool_missing_from_the_order_raises_at_assembly() -> None:
    with pytest.raises(KeyError, match="missing from _TOOL_ORDER"):
        _assemble([_module(_schema("a"), _schema("b"))], ("a",))


def test_a_schema_without_a_required_key_raises() -> None:
    broken = _schema("a")
    del broken["handler_path"]
    with pytest.raises(KeyError, match="handler_path"):
        _assemble([_module(broken)], ("a",))


def test_a_tool_declared_twice_raises() -> None:
    with pytest.raises(KeyError, match="twice"):
        _assemble([_module(_schema("a")), _module(_schema("a"))], ("a",))


def test_a_disabled_feature_flag_strips_its_tools_and_only_those() -> None:
    stripped = build_system_tools(frozenset({"unified_query_enabled"}))
    names = [t["name"] for t in stripped]
    assert "query" not in names
    assert len(names) == len(SYSTEM_TOOLS) - 1


def test_every_flag_gated_tool_exists() -> None:
    assert set(catalog.FEATURE_FLAGS) <= set(_TOOL_ORDER)


def test_every_system_schema_is_valid_json_schema_and_handler_resolves() -> None:
    import jsonschema

    from services.registry.core import resolve_handler

    for tool in SYSTEM_TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
        assert callable(resolve_handler(tool["handler_path"]))
        assert len(tool["description"]) >= 40, f"{tool['name']} needs a real description"
