"""The Uniform Tool Contract ratchet: every system tool ships with a registered ToolSpec. The
tools without one ("deferred") must be a subset of tests/contract_deferred_baseline.json, and
that baseline is empty and must stay empty — a new tool cannot be added to it; it registers a
spec next to its handler (`migrate_tool(handler, name, is_tabular=...)` or `@uniform_contract`)."""

from __future__ import annotations

import json
from pathlib import Path

from services.registry.catalog import RETIRED_TOOLS, SYSTEM_TOOLS
from services.registry.core import resolve_handler
from shared.contract import get_spec, registered_specs

BASELINE = Path(__file__).resolve().parents[2] / "contract_deferred_baseline.json"


def deferred_tools() -> set[str]:
    """System tools with no registered spec, after importing every handler (which registers
    the specs, as the registry's handler auto-registration does)."""
    for tool in SYSTEM_TOOLS:
        resolve_handler(tool["handler_path"])
    return {tool["name"] for tool in SYSTEM_TOOLS if get_spec(tool["name"]) is None}


def baseline() -> list[str]:
    value = json.loads(BASELINE.read_text(encoding="utf-8"))
    assert isinstance(value, list) and all(isinstance(n, str) for n in value)
    return value


def test_tools_without_a_spec_are_within_the_deferred_baseline() -> None:
    missing = deferred_tools() - set(baseline())
    assert not missing, (
        f"system tools without a contract spec: {sorted(missing)}; register one next to the "
        "handler with migrate_tool(handler, name, is_tabular=...) or @uniform_contract"
    )


def test_the_deferred_baseline_is_empty_so_no_tool_can_be_deferred() -> None:
    assert baseline() == [], "new tools ship with a contract spec; the baseline stays empty"


def test_every_spec_belongs_to_a_system_tool_and_is_the_handler_the_registry_resolves() -> None:
    deferred_tools()  # imports every handler module
    tools = {tool["name"]: tool for tool in SYSTEM_TOOLS}
    for name, spec in registered_specs().items():
        if name.startswith("test_tool_"):
            continue  # throw-away specs of the contract tests
        assert name in tools or name in RETIRED_TOOLS, f"spec {name!r} names no system tool"
        if name in tools:
            assert resolve_handler(tools[name]["handler_path"]) is spec.handler, name


def test_describe_entry_is_source_decorated_and_the_rest_spec_only() -> None:
    deferred_tools()
    decorated = {
        t["name"] for t in SYSTEM_TOOLS if (s := get_spec(t["name"])) and s.source_decorated
    }
    assert decorated == {"describe_entry"}
