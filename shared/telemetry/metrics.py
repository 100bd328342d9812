"""OTLP metrics: tool-call, LLM and MCP durations, token usage, outcomes and cost. Attributes
are low-cardinality only — tool, tool type, outcome, tenant, model — never a conversation or
call id. Without a MeterProvider (metrics off) every record is a no-op.

Measurements are taken off the request path. A call appends (instrument, value, attributes) to
a queue (well under a microsecond); a daemon thread feeds the queue to the SDK's instruments
once a second or when it grows long, and the metric reader drains it before every collection,
so an export, a force_flush and the shutdown flush see every measurement taken before them. In
the SDK, one histogram record or counter add costs ~20 µs of attribute handling and locking,
which a tool call otherwise paid twice before its reply."""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import metrics

from shared.telemetry import semconv
from shared.telemetry.endpoints import HTTP_PROTOCOLS, grpc_insecure, http_url

if TYPE_CHECKING:
    from shared.config import Settings
    from shared.llm.client import Usage
    from shared.llm.config import ModelConfig

logger = logging.getLogger(__name__)
MetricReaderT = TypeVar("MetricReaderT")

METER_NAME = "toolmesh"
_provider: Any = None
_instruments: dict[str, Any] = {}

# Bucket boundaries (seconds) recommended by the GenAI semantic conventions for durations.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

# The queue is fed to the instruments at least this often (seconds), and as soon as it holds
# this many measurements.
DRAIN_INTERVAL_S = 1.0
DRAIN_AT = 1024


class _Pending:
    """Measurements taken but not yet given to the SDK. deque.append and popleft are atomic, so
    request paths append without a lock; draining is serialised by one lock."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[str, float, dict[str, Any]]] = collections.deque()
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="toolmesh-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.drain()

    def add(self, name: str, value: float, attrs: dict[str, Any]) -> None:
        self.queue.append((name, value, attrs))
        if len(self.queue) >= DRAIN_AT:
            self._wake.set()

    def drain(self) -> None:
        """Give the pending measurements to the SDK: histogram records one by one, counter
        additions summed per (counter, attributes) first, one SDK call per sum (the same
        totals, a fraction of the per-call cost: every call adds 1 to tool calls)."""
        with self._drain_lock:
            queue = self.queue
            sums: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Any]] = {}
            while _provider is not None:
                try:
                    name, value, attrs = queue.popleft()
                except IndexError:
                    break
                if name in _COUNTERS and type(value) in (int, float):
                    try:
                        key = (name, tuple(sorted(attrs.items())))
                    except TypeError:  # an unorderable attribute value: add it on its own
                        self._give(name, value, attrs)
                        continue
                    entry = sums.get(key)
                    if entry is None:
                        sums[key] = [value, attrs]
                    else:
                        entry[0] += value
                    continue
                self._give(name, value, attrs)
            for (name, _), (total, attrs) in sums.items():
                self._give(name, total, attrs)

    @staticmethod
    def _give(name: str, value: float, attrs: dict[str, Any]) -> None:
        try:
            made = _instrument(name)
            if name in _COUNTERS:
                made.add(value, attrs)
            else:
                made.record(value, attrs)
        except Exception:
            logger.exception("dropped the measurement %s=%r", name, value)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(DRAIN_INTERVAL_S)
            self._wake.clear()
            self.drain()


_COUNTERS = frozenset({semconv.METRIC_TOOL_CALLS, semconv.METRIC_COST})
_pending = _Pending()


def _record(name: str, value: float, attrs: dict[str, Any]) -> None:
    if _provider is not None:
        _pending.add(name, value, attrs)


def setup_metrics(service: str, settings: Settings) -> None:
    """Install an OTLP MeterProvider when tracing is on and an endpoint is set. The export
    interval follows the standard OTEL_METRIC_EXPORT_INTERVAL (milliseconds); the standard
    OTEL_METRICS_EXPORTER=none turns metrics off while spans are still exported."""
    if _provider is not None or not settings.tracing or not settings.otlp_endpoint:
        return
    if os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() == "none":
        return
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = draining(PeriodicExportingMetricReader)(metric_exporter(settings))
    install(service, reader)


def metric_exporter(settings: Settings) -> Any:
    """OTLP over gRPC (default) or HTTP/protobuf, as OTEL_EXPORTER_OTLP_METRICS_PROTOCOL (or
    OTEL_EXPORTER_OTLP_PROTOCOL) says, to OTEL_EXPORTER_OTLP_ENDPOINT; TLS as for spans
    (shared.telemetry.endpoints: https:// or OTEL_EXPORTER_OTLP_INSECURE=false is TLS with the
    standard certificate variables, http:// or a bare host:port is plaintext)."""
    endpoint = settings.otlp_endpoint
    if settings.otlp_metrics_protocol.lower() in HTTP_PROTOCOLS:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        return HttpMetricExporter(endpoint=http_url(endpoint, "metrics"))
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=endpoint, insecure=grpc_insecure(endpoint, "metrics"))


def draining(reader_type: type[MetricReaderT]) -> type[MetricReaderT]:
    """A subclass of a MetricReader type that feeds the pending measurements to the
    instruments before each of its collections (periodic, force_flush or on demand)."""

    class Draining(reader_type):  # type: ignore[valid-type,misc]
        def collect(self, timeout_millis: float = 10_000) -> None:
            _pending.drain()
            super().collect(timeout_millis=timeout_millis)

    Draining.__name__ = Draining.__qualname__ = f"Draining{reader_type.__name__}"
    return Draining


def install(service: str, reader: Any, *, set_global: bool = True) -> None:
    """Make `reader` (built with `draining`) the process's metric reader, with the bucket
    views of the GenAI conventions, and start feeding it."""
    global _provider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.resources import Resource

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
    if set_global:
        metrics.set_meter_provider(_provider)
    _instruments.clear()
    _pending.start()


def shutdown_metrics() -> None:
    global _provider
    if _provider is not None:
        _pending.stop()
        _provider.force_flush(timeout_millis=5000)
        _provider.shutdown()
        _provider = None
        _instruments.clear()


def _instrument(name: str) -> Any:
    found = _instruments.get(name)
    if found is not None:
        return found
    meter = _provider.get_meter(METER_NAME)
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
    _record(semconv.METRIC_EXECUTE_TOOL_DURATION, duration_s, attrs)
    _record(
        semconv.METRIC_TOOL_CALLS, 1, {semconv.GEN_AI_TOOL_NAME: tool, "toolmesh.outcome": outcome}
    )


def record_cost(tenant_id: str, tool: str, amount_usd: float) -> None:
    if amount_usd > 0:
        _record(
            semconv.METRIC_COST,
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
    _record(semconv.METRIC_CLIENT_OPERATION_DURATION, duration_s, attrs)
    if usage is not None:
        token_usage = semconv.METRIC_CLIENT_TOKEN_USAGE
        _record(token_usage, usage.input_tokens, {**attrs, semconv.GEN_AI_TOKEN_TYPE: "input"})
        _record(token_usage, usage.output_tokens, {**attrs, semconv.GEN_AI_TOKEN_TYPE: "output"})


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
    _record(semconv.METRIC_MCP_CLIENT_OPERATION_DURATION, duration_s, attrs)
