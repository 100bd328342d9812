"""The system tool catalog: per-category schema modules composed into SYSTEM_TOOLS in the order
of _TOOL_ORDER. A name missing on either side raises KeyError at import, so a category edit can
never silently drop or hide a tool. Feature flags strip gated tools."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from services.registry.schemas import analysis, internal, llm, mcp_catalog, surface

logger = logging.getLogger(__name__)

CATEGORY_MODULES = (analysis, llm, surface, internal, mcp_catalog)

# The source of truth for prompt order and registry iteration order.
_TOOL_ORDER: tuple[str, ...] = (
    # analysis
    "load_dataset",
    "preview_data",
    "describe_entry",
    "query",
    # llm
    "call_llm",
    "query_telemetry",
    # surface
    "search_tools",
    # mcp
    "search_mcp_marketplace",
    "install_mcp_server",
    # internal
    "ping",
    "compose_ping",
    "compose_llm",
)

# Tools soft-deleted by seeding. Their schema and handler may stay in the code, dormant.
RETIRED_TOOLS: tuple[str, ...] = ("list_catalog",)

# Flag-gated tools: a tool is stripped when its flag is disabled (TOOLMESH_DISABLED_FLAGS).
# Every flag defaults to on; flags exist to switch a tool off per deployment.
FEATURE_FLAGS: Mapping[str, str] = {
    "query": "unified_query_enabled",
}

REQUIRED_KEYS = ("name", "description", "input_schema", "category", "handler_path")
OPTIONAL_KEYS = ("status_message", "large_output")


def _assemble(
    modules: Iterable[Any] = CATEGORY_MODULES, order: tuple[str, ...] = _TOOL_ORDER
) -> list[dict[str, Any]]:
    """Compose the category lists in `order`, cross-checking both directions."""
    by_name: dict[str, dict[str, Any]] = {}
    for module in modules:
        for schema in module.TOOLS:
            missing = [k for k in REQUIRED_KEYS if k not in schema]
            if missing:
                raise KeyError(f"{module.__name__}: tool {schema.get('name')!r} lacks {missing}")
            unknown = set(schema) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS)
            if unknown:
                raise KeyError(
                    f"{module.__name__}: tool {schema['name']!r} has unknown keys {sorted(unknown)}"
                )
            name = schema["name"]
            if name in by_name:
                raise KeyError(f"tool {name!r} is declared twice")
            by_name[name] = schema
    if len(set(order)) != len(order):
        raise KeyError("_TOOL_ORDER lists a name twice")
    not_declared = [n for n in order if n not in by_name]
    if not_declared:
        raise KeyError(f"_TOOL_ORDER names tools no category declares: {not_declared}")
    not_ordered = [n for n in by_name if n not in order]
    if not_ordered:
        raise KeyError(f"tools declared but missing from _TOOL_ORDER: {not_ordered}")
    return [by_name[n] for n in order]


def _apply_feature_flags(
    tools: list[dict[str, Any]], disabled_flags: frozenset[str]
) -> list[dict[str, Any]]:
    kept = [t for t in tools if FEATURE_FLAGS.get(t["name"]) not in disabled_flags]
    stripped = [t["name"] for t in tools if t not in kept]
    if stripped:
        logger.info("feature flags strip %s", stripped)
    return kept


def build_system_tools(disabled_flags: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    return _apply_feature_flags(_assemble(), disabled_flags)


ALL_SYSTEM_TOOLS: list[dict[str, Any]] = _assemble()
SYSTEM_TOOLS: list[dict[str, Any]] = build_system_tools()
TOOL_ORDER_INDEX: dict[str, int] = {name: i for i, name in enumerate(_TOOL_ORDER)}
