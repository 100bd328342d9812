"""One trace per tool call with its cost, through real processes: dispatcher -> registry ->
a tool that composes another tool and makes LLM calls (the real `anthropic` SDK, pointed at a
loopback fake Messages API). Asserts on what a real OTLP receiver got: parent/child links
across processes, leaf costs summing to the rollup, exactly one execute_tool span per call,
baggage set by the dispatcher and never trusted from a client, and the OTLP metrics."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from shared.cli import stats as stats_cli
from shared.cli.render import print_trace
from shared.config import Settings
from shared.telemetry import semconv
from shared.telemetry.collector import (
    JsonlSpanSink,
    MemorySpanSink,
    ReceivedSpan,
)
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh
from tests.support.fake_anthropic import FakeAnthropic, Reply, overloaded, rate_limited
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

# claude-sonnet-4-5 defaults: $3 / $15 per million input / output tokens.
IN_PRICE, OUT_PRICE = 3.0, 15.0
CONVERSATION_CEILING = 0.05


def price(input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * IN_PRICE + output_tokens * OUT_PRICE) / 1e6


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def cost_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
    fake_llm: FakeAnthropic,
) -> Iterator[Mesh]:
    env = {
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": fake_llm.base_url,
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "TOOLMESH_CONVERSATION_BUDGET_USD": str(CONVERSATION_CEILING),
    }
    with backend_mesh(request, tmp_path_factory, collector, "cost", env) as mesh:
        yield mesh


def dispatch(
    mesh: Mesh,
    name: str,
    inputs: dict[str, object],
    *,
    tenant: str,
    conversation: str,
    tool_use_id: str,
    budget_usd: float = 0.0,
    metadata: tuple[tuple[str, str], ...] = (),
) -> dpb.DispatchToolCallResponse:
    return mesh.dispatcher.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(id=tool_use_id, name=name, input_json=json.dumps(inputs)),
            context=pb.CallContext(
                tenant_id=tenant,
                user_id="sre",
                conversation_id=conversation,
                budget=pb.Budget(limit_usd=budget_usd),
            ),
        ),
        metadata=metadata,
        timeout=60,
    )


def err_kind(response: dpb.DispatchToolCallResponse) -> str:
    env = response.result.envelope
    return env.err.err_kind if env.WhichOneof("kind") == "err" else str(env.WhichOneof("kind"))


def trace_of(sink: MemorySpanSink, tool_use_id: str, tool: str) -> list[ReceivedSpan]:
    """Every span of the call's trace, once the dispatcher's server span (the root, ended
    last) has arrived."""
    (root_tool,) = sink.wait_for_sync(
        lambda s: (
            s.name == f"execute_tool {tool}"
            and s.attributes.get(semconv.GEN_AI_TOOL_CALL_ID) == tool_use_id
        ),
        timeout=15,
    )
    sink.wait_for_sync(
        lambda s: (
            s.trace_id == root_tool.trace_id
            and s.name.endswith("DispatcherService/DispatchToolCall")
        ),
        timeout=15,
    )
    return sink.spans(root_tool.trace_id)


def ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[ReceivedSpan]:
    chain = []
    while span.parent_span_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain


def test_a_composing_tool_with_llm_calls_is_one_trace_with_costs_rolled_up(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    sink = cost_mesh.spans
    seen_requests = len(fake_llm.requests)
    fake_llm.script(
        Reply(text="nested answer", input_tokens=1000, output_tokens=200),
        Reply(text="own answer", input_tokens=2000, output_tokens=100),
    )
    response = dispatch(
        cost_mesh,
        "compose_llm",
        {"question": "what is up?"},
        tenant="tenant-cost",
        conversation="cost-trace",
        tool_use_id=f"toolu_cost_trace_{cost_mesh.backend}",
    )
    nested, own = price(1000, 200), price(2000, 100)
    assert err_kind(response) == "ok", response.result.content
    assert response.result.cost_usd == pytest.approx(nested + own)

    spans = trace_of(sink, f"toolu_cost_trace_{cost_mesh.backend}", "compose_llm")
    by_id = {s.span_id: s for s in spans}
    assert {s.service_name for s in spans} == {"toolmesh-dispatcher", "toolmesh-registry"}
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.service_name == "toolmesh-dispatcher" and root.kind == "SERVER"
    assert all(ancestors(s, by_id)[-1:] in ([root], []) for s in spans)  # one tree

    # Exactly one execute_tool span per call: the composing call and its two nested calls.
    tool_spans = [
        s
        for s in spans
        if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OPERATION_EXECUTE_TOOL
    ]
    assert sorted(s.name for s in tool_spans) == [
        "execute_tool call_llm",
        "execute_tool compose_llm",
        "execute_tool ping",
    ]
    compose = next(s for s in tool_spans if s.name == "execute_tool compose_llm")
    call_llm = next(s for s in tool_spans if s.name == "execute_tool call_llm")
    assert compose.attributes[semconv.GEN_AI_TOOL_TYPE] == "function"
    assert compose.attributes[semconv.GEN_AI_TOOL_DESCRIPTION].startswith("Composes ping")
    assert compose.attributes[semconv.TOOLMESH_ENVELOPE_KIND] == "ok"
    # The nested call runs in the registry again, over gRPC: client/server pair in between.
    assert [a.kind for a in ancestors(call_llm, by_id)[:3]] == ["SERVER", "CLIENT", "INTERNAL"]
    assert ancestors(call_llm, by_id)[2] is compose

    # Cost: on the two LLM leaves, summing to the rollup on the composing call's span.
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == 2
    for chat in chats:
        assert chat.kind == "CLIENT"
        assert chat.attributes[semconv.GEN_AI_PROVIDER_NAME] == "anthropic"
        assert chat.attributes[semconv.GEN_AI_REQUEST_MODEL] == "claude-sonnet-4-5"
        assert chat.attributes[semconv.GEN_AI_RESPONSE_MODEL] == "claude-sonnet-4-5"
        assert chat.attributes[semconv.GEN_AI_USAGE_COST_CURRENCY] == "USD"
    assert {c.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] for c in chats} == {1000, 2000}
    leaves = sum(
        s.attributes.get(semconv.GEN_AI_USAGE_COST_AMOUNT, 0.0) for s in spans
    )  # leaf attribute only: summing it over the trace never double counts
    assert leaves == pytest.approx(nested + own)
    assert compose.attributes[semconv.TOOLMESH_COST_ROLLUP_AMOUNT] == pytest.approx(leaves)
    assert call_llm.attributes[semconv.TOOLMESH_COST_ROLLUP_AMOUNT] == pytest.approx(nested)
    own_chat = next(c for c in chats if c.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 2000)
    assert by_id[own_chat.parent_span_id] is compose

    # Baggage set by the dispatcher is on every registry span; no payloads by default.
    for span in spans:
        if span.service_name == "toolmesh-registry":
            assert span.attributes.get(semconv.TOOLMESH_TENANT_ID) == "tenant-cost", span.name
            assert span.attributes[semconv.GEN_AI_CONVERSATION_ID] == "cost-trace", span.name
        assert "gen_ai.tool.call.arguments" not in span.attributes

    # Nothing of the mesh's trace context or baggage went to the LLM provider.
    for recorded in fake_llm.requests[seen_requests:]:
        assert "baggage" not in recorded.headers
        assert "traceparent" not in recorded.headers

    # usage_log, read back through the stats RPC, per tenant.
    stats = cost_mesh.registry.GetUsageStats(
        rpb.GetUsageStatsRequest(group_by="tenant", tenant_id="tenant-cost")
    )
    (row,) = stats.stats
    assert row.key == "tenant-cost"
    assert row.calls == 1 and row.errors == 0
    assert row.llm_calls == 2 and row.tokens == 3300
    assert row.cost_usd == pytest.approx(nested + own)
    by_tool = cost_mesh.registry.GetUsageStats(
        rpb.GetUsageStatsRequest(group_by="tool", tenant_id="tenant-cost")
    )
    costs = {s.key: s.cost_usd for s in by_tool.stats}
    assert costs["call_llm"] == pytest.approx(nested)
    assert costs["compose_llm"] == pytest.approx(own)


def test_a_per_call_budget_stops_the_handler_that_crosses_it(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    before = len(fake_llm.requests)
    fake_llm.script(Reply(text="pricey", input_tokens=1000, output_tokens=200))
    response = dispatch(
        cost_mesh,
        "compose_llm",
        {"question": "expensive?"},
        tenant="tenant-budget",
        conversation="budget-call",
        tool_use_id="toolu_budget",
        budget_usd=0.001,
    )
    assert err_kind(response) == "budget_exceeded"
    assert "budget" in response.result.content
    # The nested LLM call was made (and is paid for); the handler was stopped before its own.
    assert len(fake_llm.requests) == before + 1
    assert response.result.cost_usd == pytest.approx(price(1000, 200))


def test_a_conversation_over_its_ceiling_is_refused_before_running(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    fake_llm.script(Reply(text="very pricey", input_tokens=10000, output_tokens=2000))
    first = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "big"},
        tenant="tenant-ceiling",
        conversation="ceiling",
        tool_use_id="toolu_ceiling_1",
    )
    # Allowed to start (nothing spent yet), stopped on crossing the ceiling; still charged.
    assert err_kind(first) == "budget_exceeded"
    assert first.result.cost_usd == pytest.approx(price(10000, 2000))
    before = len(fake_llm.requests)
    second = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "again"},
        tenant="tenant-ceiling",
        conversation="ceiling",
        tool_use_id="toolu_ceiling_2",
    )
    assert err_kind(second) == "budget_exceeded"
    assert f"${CONVERSATION_CEILING:.6f}" in second.result.content
    assert len(fake_llm.requests) == before  # refused without calling anything
    # Another conversation of the same tenant is unaffected.
    third = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "small"},
        tenant="tenant-ceiling",
        conversation="ceiling-other",
        tool_use_id="toolu_ceiling_3",
    )
    assert err_kind(third) == "ok"


def test_client_baggage_is_dropped_at_the_dispatcher(cost_mesh: Mesh) -> None:
    response = dispatch(
        cost_mesh,
        "compose_ping",
        {"echo": 1},
        tenant="tenant-honest",
        conversation="baggage",
        tool_use_id=f"toolu_baggage_{cost_mesh.backend}",
        metadata=(
            (
                "baggage",
                "toolmesh.tenant.id=tenant-evil,gen_ai.conversation.id=stolen,secret=leak",
            ),
        ),
    )
    assert err_kind(response) == "ok"
    spans = trace_of(cost_mesh.spans, f"toolu_baggage_{cost_mesh.backend}", "compose_ping")
    registry_spans = [s for s in spans if s.service_name == "toolmesh-registry"]
    assert len(registry_spans) >= 4
    for span in spans:
        assert span.attributes.get(semconv.TOOLMESH_TENANT_ID) in (None, "tenant-honest")
        assert span.attributes.get(semconv.GEN_AI_CONVERSATION_ID) in (None, "baggage")
        assert "secret" not in span.attributes
    assert all(s.attributes[semconv.TOOLMESH_TENANT_ID] == "tenant-honest" for s in registry_spans)


def test_provider_errors_are_retried_then_reported(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    fake_llm.script(rate_limited(), Reply(text="after a 429"))
    ok = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "retry me"},
        tenant="tenant-retry",
        conversation="retry",
        tool_use_id="toolu_retry_ok",
    )
    assert err_kind(ok) == "ok"
    assert json.loads(ok.result.envelope.ok.data_json)["text"] == "after a 429"
    fake_llm.script(overloaded(), overloaded(), overloaded())
    failed = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "overloaded"},
        tenant="tenant-retry",
        conversation="retry",
        tool_use_id="toolu_retry_fail",
    )
    assert err_kind(failed) != "ok"
    assert "LLM_UNAVAILABLE" in failed.result.content and "529" in failed.result.content
    assert failed.result.cost_usd == 0


def test_metrics_arrive_over_otlp_with_low_cardinality_attributes(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    fake_llm.script(Reply(text="metered", input_tokens=100, output_tokens=10))
    dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "meter me"},
        tenant="tenant-metrics",
        conversation="metrics",
        tool_use_id="toolu_metrics",
    )
    sink = cost_mesh.spans

    def point(name: str, **attrs: object) -> bool:
        return any(
            all(p.attributes.get(k.replace("__", ".")) == v for k, v in attrs.items())
            for p in sink.points(name)
        )

    deadline = time.monotonic() + 15
    wanted = {
        semconv.METRIC_EXECUTE_TOOL_DURATION: {"gen_ai__tool__name": "call_llm"},
        semconv.METRIC_TOOL_CALLS: {"gen_ai__tool__name": "call_llm", "toolmesh__outcome": "ok"},
        semconv.METRIC_COST: {"toolmesh__tenant__id": "tenant-metrics"},
        semconv.METRIC_CLIENT_TOKEN_USAGE: {"gen_ai__token__type": "input"},
        semconv.METRIC_CLIENT_OPERATION_DURATION: {"gen_ai__provider__name": "anthropic"},
    }
    while time.monotonic() < deadline and not all(point(n, **a) for n, a in wanted.items()):
        time.sleep(0.1)
    missing = [n for n, a in wanted.items() if not point(n, **a)]
    assert not missing, f"metrics never received: {missing}"
    cost_points = [
        p
        for p in sink.points(semconv.METRIC_COST)
        if p.attributes.get(semconv.TOOLMESH_TENANT_ID) == "tenant-metrics"
    ]
    assert max(p.value for p in cost_points) == pytest.approx(price(100, 10))
    forbidden = {semconv.GEN_AI_CONVERSATION_ID, semconv.GEN_AI_TOOL_CALL_ID, "toolmesh.user.id"}
    for p in sink.points():
        assert not forbidden & set(p.attributes), (p.name, p.attributes)


def test_bad_input_to_call_llm_is_a_schema_hint_and_no_provider_call(
    cost_mesh: Mesh, fake_llm: FakeAnthropic
) -> None:
    before = len(fake_llm.requests)
    response = dispatch(
        cost_mesh,
        "call_llm",
        {"prompt": "x", "max_output_tokens": "lots"},
        tenant="tenant-x",
        conversation="bad-input",
        tool_use_id="toolu_bad",
    )
    assert response.result.envelope.WhichOneof("kind") == "hint"
    assert response.result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert "max_output_tokens" in response.result.content
    assert len(fake_llm.requests) == before


def test_toolmesh_trace_and_stats_show_the_call_and_its_cost(
    cost_mesh: Mesh,
    fake_llm: FakeAnthropic,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_llm.script(
        Reply(text="a", input_tokens=100, output_tokens=100),
        Reply(text="b", input_tokens=200, output_tokens=100),
    )
    response = dispatch(
        cost_mesh,
        "compose_llm",
        {"question": "show me"},
        tenant="tenant-cli",
        conversation="cli-trace",
        tool_use_id=f"toolu_cli_trace_{cost_mesh.backend}",
    )
    assert err_kind(response) == "ok"
    total = price(100, 100) + price(200, 100)
    spans = trace_of(cost_mesh.spans, f"toolu_cli_trace_{cost_mesh.backend}", "compose_llm")
    JsonlSpanSink(tmp_path / "spans.jsonl").add(spans)
    settings = Settings.from_env({"TOOLMESH_DATA_DIR": str(tmp_path)})

    assert print_trace(settings, spans[0].trace_id, last=False) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"trace {spans[0].trace_id}") and f"cost ${total:.6f}" in out[0]
    compose_line = next(line for line in out if "execute_tool compose_llm" in line)
    assert f"(call total ${total:.6f})" in compose_line
    chat_lines = [line for line in out if "chat claude-sonnet-4-5" in line]
    assert len(chat_lines) == 2 and any("200+100 tokens" in line for line in chat_lines)
    # Indentation follows the span tree: the own LLM call sits under compose_llm.
    indent = len(compose_line) - len(compose_line.lstrip())
    assert any(
        len(line) - len(line.lstrip()) == indent + 2 and f"${price(200, 100):.6f}" in line
        for line in chat_lines
    )

    args = argparse.Namespace(
        contract=False,
        by="tenant",
        since="1h",
        tool=None,
        tenant="tenant-cli",
        json=False,
        registry=cost_mesh.address("registry"),
        timeout=30,
    )
    assert stats_cli.cmd_stats(args, settings) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["tenant", "calls", "errors"]
    row = lines[2].split()
    assert row[0] == "tenant-cli" and row[1] == "1" and row[2] == "0"
    assert row[-1] == f"{total:.6f}" and row[-3] == "2"  # two LLM calls
    assert lines[-1] == f"total cost ${total:.6f}"


def test_query_telemetry_answers_for_the_callers_tenant_only(cost_mesh: Mesh) -> None:
    for i in range(3):
        dispatch(
            cost_mesh,
            "ping",
            {"echo": i, "fail": "error" if i == 2 else ""},
            tenant="tenant-q",
            conversation=f"q{i}",
            tool_use_id=f"toolu_q{i}",
        )
    response = dispatch(
        cost_mesh,
        "query_telemetry",
        {"group_by": "tool", "since_hours": 1},
        tenant="tenant-q",
        conversation="q-ask",
        tool_use_id="toolu_q_ask",
    )
    assert err_kind(response) == "ok", response.result.content
    table = pa.ipc.open_stream(response.result.envelope.ok.table.arrow_ipc).read_all().to_pandas()
    ping = table.set_index("tool").loc["ping"]
    assert (ping["calls"], ping["errors"]) == (3, 1)
    assert ping["error_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert "ping" in response.result.content and "error_rate" in response.result.content
    refused = dispatch(
        cost_mesh,
        "query_telemetry",
        {"tenant": "tenant-cost"},
        tenant="tenant-q",
        conversation="q-ask",
        tool_use_id="toolu_q_other",
    )
    assert err_kind(refused) != "ok" and "telemetry_admin" in refused.result.content
