"""Composition of the tool array of one LLM call: the mode's resident part (floor or the
project-manager allowlist) and the conversation's working set, intersected with the live
catalog, capability-filtered (resident part only) and held to MAX_TOOL_SURFACE. Pure functions
over the catalog snapshot."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.registry.core import inject_reasoning
from shared.errors import ResourceExhausted

logger = logging.getLogger(__name__)

# Held below OpenAI's hard cap of 128 tools per request.
MAX_TOOL_SURFACE = 120

_PM_ALLOWED: tuple[str, ...] = (
    "plan",
    "delegate",
    "delegate_batch",
    "describe_entry",
    "search_catalog",
    "analyze_data",
    "preview_data",
    "display_map",
    "generate_document",
    "document_conversation",
    "export",
    "export_excel",
    "search_tools",
)
AGENTIC_ONLY: frozenset[str] = frozenset({"plan"})
DELEGATE_EXCLUDED: frozenset[str] = frozenset()
MODES = ("chat", "agentic", "delegate")

# What each provider's request layer actually delivers natively. The LLM client of this
# platform (shared/llm/client.py) attaches no native tool payload for Anthropic, so Anthropic
# delivers nothing natively here; OpenAI's Responses API carries web search.
PROVIDER_NATIVE_CAPABILITIES: Mapping[str, frozenset[str]] = {
    "anthropic": frozenset(),
    "openai_responses": frozenset({"web_search"}),
}


def provider_native_capabilities(provider: str) -> frozenset[str]:
    """Capabilities `provider` really delivers natively (empty for an unknown provider)."""
    return PROVIDER_NATIVE_CAPABILITIES.get(provider, frozenset())


class ToolSurfaceBudgetError(ResourceExhausted):
    """The composed surface is larger than MAX_TOOL_SURFACE: an invariant violation (search_tools
    enforces the budget when it pages tools in), never silently truncated."""

    default_reason = "TOOL_SURFACE_BUDGET"


@dataclass(frozen=True)
class CatalogTool:
    """A live tool as the surface needs it, with its provider renderings precomputed."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    tenant_id: str = "*"
    status: str = "approved"
    enabled: bool = True
    category: str = "general"
    required_capabilities: frozenset[str] = frozenset()
    replaced_by_model_capability: str | None = None
    id: int = 0
    version: int = 1
    anthropic_json: str = field(default="", compare=False)
    openai_json: str = field(default="", compare=False)

    def usable_by(self, tenant_id: str, capabilities: Collection[str]) -> bool:
        """Whether a caller may be offered this tool (the registry's get_tools_for_llm filter
        plus RBAC)."""
        return (
            self.enabled
            and self.status == "approved"
            and self.category != "internal"
            and self.tenant_id in ("*", tenant_id)
            and self.required_capabilities <= set(capabilities)
        )


def render(tool: CatalogTool) -> CatalogTool:
    """`tool` with its Anthropic and OpenAI tool JSON (reasoning field injected)."""
    schema = inject_reasoning(tool.name, tool.input_schema)
    anthropic = {"name": tool.name, "description": tool.description, "input_schema": schema}
    openai = {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": schema},
    }
    dumps = json.dumps
    return CatalogTool(
        **{
            **{k: getattr(tool, k) for k in tool.__dataclass_fields__},
            "anthropic_json": dumps(anthropic, ensure_ascii=False, separators=(",", ":")),
            "openai_json": dumps(openai, ensure_ascii=False, separators=(",", ":")),
        }
    )


def resident_names(mode: str, floor: Sequence[str]) -> list[str]:
    """The resident part of a mode: the floor (chat, delegate) or _PM_ALLOWED (agentic)."""
    if mode == "agentic":
        return list(_PM_ALLOWED)
    excluded = AGENTIC_ONLY | (DELEGATE_EXCLUDED if mode == "delegate" else frozenset())
    return [n for n in floor if n not in excluded]


def working_names(mode: str, working_set: Sequence[str]) -> list[str]:
    """The working-set part of a mode (agentic-only tools never reach chat or delegate)."""
    if mode == "agentic":
        return list(working_set)
    excluded = AGENTIC_ONLY | (DELEGATE_EXCLUDED if mode == "delegate" else frozenset())
    return [n for n in working_set if n not in excluded]


@dataclass
class Surface:
    """A composed surface: tools in order (resident first), and what was left out and why."""

    tools: list[tuple[CatalogTool, bool]]  # (tool, resident)
    skipped: list[str]
    filtered: list[str]

    @property
    def names(self) -> list[str]:
        return [t.name for t, _ in self.tools]


def compose(
    *,
    mode: str,
    floor: Sequence[str],
    working_set: Sequence[str],
    catalog: Mapping[str, CatalogTool],
    tenant_id: str,
    capabilities: Collection[str],
    model_capabilities: Collection[str] = (),
    provider: str = "",
    enforce_budget: bool = True,
) -> Surface:
    """The spec's composition: resident part ∪ working set, intersected with the live catalog
    (a missing or unusable name is skipped and logged), the resident part capability-filtered
    (double guard: the model claims the capability AND its provider delivers it), then checked
    against MAX_TOOL_SURFACE."""
    native = set(model_capabilities) & provider_native_capabilities(provider)
    seen: set[str] = set()
    tools: list[tuple[CatalogTool, bool]] = []
    skipped: list[str] = []
    filtered: list[str] = []
    for names, resident in (
        (resident_names(mode, floor), True),
        (working_names(mode, working_set), False),
    ):
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            tool = catalog.get(name)
            if tool is None or not tool.usable_by(tenant_id, capabilities):
                skipped.append(name)
                continue
            if resident and tool.replaced_by_model_capability in native:
                # Filtered from the resident part only: the working set may still bring it.
                seen.discard(name)
                filtered.append(name)
                continue
            tools.append((tool, resident))
    present = {t.name for t, _ in tools}
    filtered = [n for n in filtered if n not in present]
    if enforce_budget and len(tools) > MAX_TOOL_SURFACE:
        raise ToolSurfaceBudgetError(
            f"the composed tool surface has {len(tools)} tools, over the budget of "
            f"{MAX_TOOL_SURFACE}",
            metadata={"size": str(len(tools)), "budget": str(MAX_TOOL_SURFACE)},
        )
    return Surface(tools, skipped, filtered)
