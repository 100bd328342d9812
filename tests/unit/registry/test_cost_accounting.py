"""The registry's side of cost accounting, without a network: a paid tool's own cost is a
leaf (usage_log row + leaf span attribute), everything rolls up onto the execute_tool span and
the result, cost-rollup tools are not logged twice, an exhausted budget refuses the call, and
tool arguments/results go on spans only when opted in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.orm import Session, sessionmaker

from services.registry import core as registry_core
from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.repository import SqlToolRepository
from shared.contract import ToolResult
from shared.contract.spec import _TOOL_SPECS, ToolSpec
from shared.telemetry import semconv
from shared.telemetry.usage import UsageEntry


class ListUsage:
    def __init__(self) -> None:
        self.entries: list[UsageEntry] = []

    def record(self, entry: UsageEntry) -> None:
        self.entries.append(entry)

    def conversation_spent(self, tenant_id: str, conversation_id: str) -> float:
        return sum(e.cost_usd for e in self.entries)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(registry_core, "tracer", lambda: provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def make_registry(sessions: sessionmaker[Session], usage: ListUsage, **kw: Any) -> Registry:
    reg = Registry(SqlToolRepository(sessions), cache_ttl_s=0.0, **kw)

    def defaults(ctx: ToolContext) -> None:
        ctx.usage = usage

    reg._context_defaults = defaults
    reg.seed_system_tools()
    reg.auto_register_handlers()
    return reg


def tool_span(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == f"execute_tool {name}"]
    return span


async def test_a_paid_tools_own_cost_is_a_logged_leaf_and_the_rollup(
    sessions: sessionmaker[Session], spans: InMemorySpanExporter
) -> None:
    usage = ListUsage()
    reg = make_registry(sessions, usage)
    reg.register_handler("ping", lambda i, c: ToolResult(content="paid", cost=0.02))
    ctx = ToolContext(tool_name="", tenant_id="t1", conversation_id="c1", tool_use_id="tu1")

    result = (await reg.execute("ping", {}, ctx)).result

    assert result.cost == pytest.approx(0.02)
    (entry,) = usage.entries
    assert (entry.kind, entry.tool_name, entry.tenant_id, entry.tool_use_id) == (
        "tool",
        "ping",
        "t1",
        "tu1",
    )
    attrs = tool_span(spans, "ping").attributes or {}
    assert attrs[semconv.GEN_AI_USAGE_COST_AMOUNT] == pytest.approx(0.02)
    assert attrs[semconv.TOOLMESH_COST_ROLLUP_AMOUNT] == pytest.approx(0.02)
    assert "gen_ai.tool.call.arguments" not in attrs


async def test_a_cost_rollup_tool_is_not_logged_twice(
    sessions: sessionmaker[Session], spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = ListUsage()
    monkeypatch.setitem(
        _TOOL_SPECS,
        "ping",
        ToolSpec(name="ping", handler=None, is_tabular=False, is_cost_rollup=True),
    )
    reg = make_registry(sessions, usage)
    reg.register_handler("ping", lambda i, c: ToolResult(content="delegated", cost=0.5))

    result = (await reg.execute("ping", {}, ToolContext(tool_name="", tenant_id="t1"))).result

    assert usage.entries == []  # its sub-calls logged their own leaves
    attrs = tool_span(spans, "ping").attributes or {}
    assert semconv.GEN_AI_USAGE_COST_AMOUNT not in attrs  # not a leaf
    assert result.cost == pytest.approx(0.5)  # but its total is reported and rolled up
    assert attrs[semconv.TOOLMESH_COST_ROLLUP_AMOUNT] == pytest.approx(0.5)


async def test_an_exhausted_budget_refuses_without_running(
    sessions: sessionmaker[Session], spans: InMemorySpanExporter
) -> None:
    reg = make_registry(sessions, ListUsage())
    ran: list[bool] = []
    reg.register_handler("ping", lambda i, c: ran.append(True) or ToolResult(content="x"))
    ctx = ToolContext(tool_name="", tenant_id="t1", budget_limit=0.1, budget_spent=0.1)

    result = (await reg.execute("ping", {}, ctx)).result

    assert ran == []
    assert result.error is not None and "budget" in result.error
    attrs = tool_span(spans, "ping").attributes or {}
    assert attrs[semconv.ERROR_TYPE] == "budget_exceeded"


async def test_arguments_and_results_go_on_spans_only_when_opted_in(
    sessions: sessionmaker[Session], spans: InMemorySpanExporter
) -> None:
    reg = make_registry(sessions, ListUsage(), trace_payloads=True)
    await reg.execute("ping", {"echo": "x" * 10_000}, ToolContext(tool_name="", tenant_id="t"))
    attrs = tool_span(spans, "ping").attributes or {}
    arguments = str(attrs["gen_ai.tool.call.arguments"])
    assert arguments.startswith('{"echo": "xxx') and len(arguments) <= 4097
    assert "pong" in str(attrs["gen_ai.tool.call.result"])
