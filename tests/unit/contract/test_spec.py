"""The ToolSpec registry: migrate_tool registers a spec and hands the handler back untouched;
@uniform_contract registers the wrapper; a name cannot be claimed by two handlers."""

from __future__ import annotations

from typing import Any

import pytest

from shared.contract import (
    Envelope,
    Ok,
    ToolResult,
    get_spec,
    is_contract_wrapped,
    migrate_tool,
    registered_specs,
    uniform_contract,
)
from shared.contract.spec import ToolSpec


def legacy(inputs: dict[str, Any], context: Any) -> ToolResult:
    return ToolResult(content="legacy")


def test_migrate_tool_registers_a_spec_and_returns_the_handler_unchanged(tool_name: str) -> None:
    returned = migrate_tool(legacy, tool_name, is_tabular=False)

    assert returned is legacy
    assert legacy({}, None).content == "legacy"  # direct callers still get a ToolResult
    spec = get_spec(tool_name)
    assert spec == ToolSpec(tool_name, legacy, is_tabular=False)
    assert spec is not None and not spec.source_decorated
    assert registered_specs()[tool_name] is spec


def test_a_tool_without_a_spec_has_none() -> None:
    assert get_spec("no_such_tool_anywhere") is None


def test_registered_specs_is_a_read_only_snapshot(tool_name: str) -> None:
    snapshot = registered_specs()
    migrate_tool(legacy, tool_name, is_tabular=True)

    assert tool_name not in snapshot
    with pytest.raises(TypeError):
        snapshot[tool_name] = get_spec(tool_name)  # type: ignore[index]


def test_expected_envelopes_must_be_known_kinds(tool_name: str) -> None:
    migrate_tool(legacy, tool_name, is_tabular=False, expected_envelopes=["err", "ok"])
    spec = get_spec(tool_name)
    assert spec is not None and spec.expected_envelopes == frozenset({"ok", "err"})

    with pytest.raises(ValueError, match="subset"):
        migrate_tool(legacy, tool_name, is_tabular=False, expected_envelopes={"fine"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="subset"):
        migrate_tool(legacy, tool_name, is_tabular=False, expected_envelopes=set())
    with pytest.raises(TypeError):
        migrate_tool(legacy, tool_name, is_tabular=False, expected_envelopes="ok")  # type: ignore[arg-type]


def test_a_second_handler_cannot_claim_a_registered_name(tool_name: str) -> None:
    def other(inputs: dict[str, Any], context: Any) -> ToolResult:
        return ToolResult()

    migrate_tool(legacy, tool_name, is_tabular=False)
    migrate_tool(legacy, tool_name, is_tabular=True)  # the same handler again (a reload) is fine

    with pytest.raises(ValueError, match="already has a contract spec"):
        migrate_tool(other, tool_name, is_tabular=False)
    spec = get_spec(tool_name)
    assert spec is not None and spec.handler is legacy and spec.is_tabular


def test_uniform_contract_registers_the_wrapper_as_the_spec_handler(tool_name: str) -> None:
    @uniform_contract(name=tool_name, is_tabular=False, is_cost_rollup=True)
    def decorated(inputs: dict[str, Any], context: Any) -> Envelope:
        return Ok(data="hi")

    spec = get_spec(tool_name)
    assert spec is not None
    assert spec.handler is decorated and spec.source_decorated and spec.is_cost_rollup
    assert is_contract_wrapped(decorated)
    assert decorated.__name__ == "decorated"
