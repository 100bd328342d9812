"""OTLP metrics: tool-call, LLM and MCP durations, token usage, outcomes and cost. Attributes
are low-cardinality only — tool, tool type, outcome, tenant, model — never a conversation or
call id. Without a MeterProvider (metrics off) every record is a no-op of the OTel API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from shared.telemetry import semconv

if TYPE_CHECKING:
    from shared.config import Settings
    from shared.llm.client import Usage
    from shared.llm.config import ModelConfig

METER_NAME = "toolmesh"
_provider: Any = None
_instruments: dict[str, Any] = {}

# Bucket boundaries (seconds) recommended by the GenAI semantic conventions for durations.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


def setup_metrics(service: str, settings: Settings) -> None:
    """Install an OTLP MeterProvider when tracing is on and an endpoint is set. The export
    interval follows the standard OTEL_METRIC_EXPORT_INTERVAL (milliseconds)."""
    global _provider
    if _provider is not None or not settings.tracing or not settings.otlp_endpoint:
        return
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.resources import Resource

    endpoint = settings.otlp_endpoint.removeprefix("http://").removeprefix("https://")
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, insecure=True))
    views = [
        View(
            instrument_name=name,
            aggregation=ExplicitBucketHistogramAggregation(DURATION_BUCKETS),
        )
        for name in (
            semconv.METRIC_EXECUTE_TOOL_DURATION,
            semconv.METRIC_CLIENT_OPERATION_DURATION,
            semconv.METRIC_MCP_CLIENT_OPERATION_DURATION,
        )
    ] + [
        View(
            instrument_name=semconv.METRIC_CLIENT_TOKEN_USAGE,
            aggregation=ExplicitBucketHistogramAggregation(TOKEN_BUCKETS),
        )
    ]
    _provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create(
            {"service.name": f"toolmesh-{service}", "service.namespace": "toolmesh"}
        ),
        views=views,
    )
    metrics.set_meter_provider(_provider)
    _instruments.clear()


def shutdown_metrics() -> None:
    global _provider
    if _provider is not None:
        _provider.force_flush(timeout_millis=5000)
        _provider.shutdown()
        _provider = None
        _instruments.clear()


def _instrument(name: str) -> Any:
    found = _instruments.get(name)
    if found is not None:
        return found
    meter = metrics.get_meter(METER_NAME)
    if name == semconv.METRIC_EXECUTE_TOOL_DURATION:
        made: Any = meter.create_histogram(name, unit="s", description="Tool execution duration")
    elif name == semconv.METRIC_CLIENT_OPERATION_DURATION:
        made = meter.create_histogram(name, unit="s", description="GenAI operation duration")
    elif name == semconv.METRIC_MCP_CLIENT_OPERATION_DURATION:
        made = meter.create_histogram(name, unit="s", description="MCP client operation duration")
    elif name == semconv.METRIC_CLIENT_TOKEN_USAGE:
        made = meter.create_histogram(name, unit="{token}", description="Tokens used")
    elif name == semconv.METRIC_TOOL_CALLS:
        made = meter.create_counter(name, unit="{call}", description="Tool calls by outcome")
    elif name == semconv.METRIC_COST:
        made = meter.create_counter(name, unit="{USD}", description="Cost of tool calls")
    else:  # pragma: no cover - a typo in this module
        raise KeyError(name)
    _instruments[name] = made
    return made


def record_tool_call(
    tool: str, tool_type: str, outcome: str, duration_s: float, *, error_type: str = ""
) -> None:
    """One finished tool call: its duration and its outcome (ok / hint / err)."""
    attrs = {
        semconv.GEN_AI_OPERATION_NAME: semconv.OPERATION_EXECUTE_TOOL,
        semconv.GEN_AI_TOOL_NAME: tool,
        semconv.GEN_AI_TOOL_TYPE: tool_type,
    }
    if error_type:
        attrs[semconv.ERROR_TYPE] = error_type
    _instrument(semconv.METRIC_EXECUTE_TOOL_DURATION).record(duration_s, attrs)
    _instrument(semconv.METRIC_TOOL_CALLS).add(
        1, {semconv.GEN_AI_TOOL_NAME: tool, "toolmesh.outcome": outcome}
    )


def record_cost(tenant_id: str, tool: str, amount_usd: float) -> None:
    if amount_usd > 0:
        _instrument(semconv.METRIC_COST).add(
            amount_usd,
            {
                semconv.TOOLMESH_TENANT_ID: tenant_id or "-",
                semconv.GEN_AI_TOOL_NAME: tool,
                semconv.GEN_AI_USAGE_COST_CURRENCY: semconv.COST_CURRENCY,
            },
        )


def record_llm_call(
    cfg: ModelConfig, duration_s: float, usage: Usage | None, *, error_type: str = ""
) -> None:
    attrs = {
        semconv.GEN_AI_OPERATION_NAME: semconv.OPERATION_CHAT,
        semconv.GEN_AI_PROVIDER_NAME: cfg.provider,
        semconv.GEN_AI_REQUEST_MODEL: cfg.model,
    }
    if error_type:
        attrs[semconv.ERROR_TYPE] = error_type
    _instrument(semconv.METRIC_CLIENT_OPERATION_DURATION).record(duration_s, attrs)
    if usage is not None:
        tokens = _instrument(semconv.METRIC_CLIENT_TOKEN_USAGE)
        tokens.record(usage.input_tokens, {**attrs, semconv.GEN_AI_TOKEN_TYPE: "input"})
        tokens.record(usage.output_tokens, {**attrs, semconv.GEN_AI_TOKEN_TYPE: "output"})


def record_mcp_operation(
    method: str, duration_s: float, *, tool: str = "", transport: str = "", error_type: str = ""
) -> None:
    attrs = {"mcp.method.name": method}
    if tool:
        attrs[semconv.GEN_AI_TOOL_NAME] = tool
    if transport:
        attrs["network.transport"] = transport
    if error_type:
        attrs[semconv.ERROR_TYPE] = error_type
    _instrument(semconv.METRIC_MCP_CLIENT_OPERATION_DURATION).record(duration_s, attrs)
