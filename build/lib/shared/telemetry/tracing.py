"""Tracing and logging setup. One TracerProvider per process, exporting over OTLP to the
endpoint of OTEL_EXPORTER_OTLP_ENDPOINT; W3C trace context propagates on gRPC metadata."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from shared.config import Settings

TRACER_NAME = "toolmesh"
_provider: TracerProvider | None = None


def setup_tracing(service: str, settings: Settings) -> TracerProvider | None:
    """Install the process's TracerProvider. With tracing off, spans are no-ops."""
    global _provider
    if not settings.tracing:
        return None
    if _provider is not None:
        return _provider
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": f"toolmesh-{service}", "service.namespace": "toolmesh"}
        )
    )
    if settings.otlp_endpoint:
        # Imported lazily: the exporter pulls in its own grpc channel machinery.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.removeprefix("http://").removeprefix("https://")
        # Batching is tuned by the standard OTEL_BSP_* variables (schedule delay, batch size).
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True))
        )
    trace.set_tracer_provider(provider)
    _provider = provider
    global _tracer
    _tracer = None  # re-resolve against the new provider
    return provider


def shutdown_tracing() -> None:
    """Flush and stop the exporter (called on graceful shutdown)."""
    global _provider
    if _provider is not None:
        _provider.force_flush(timeout_millis=5000)
        _provider.shutdown()
        _provider = None


_tracer: trace.Tracer | None = None


def tracer() -> trace.Tracer:
    """The process's tracer, looked up once after setup (get_tracer is not free per call)."""
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(TRACER_NAME)
    return _tracer


def current_trace_id() -> str:
    """The current span's trace id as 32 hex digits, or "" outside a recorded span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def extract_context(metadata: Mapping[str, str] | None) -> Context:
    return propagate.extract(carrier=dict(metadata or {}))


def inject_metadata(carrier: MutableMapping[str, str]) -> MutableMapping[str, str]:
    propagate.inject(carrier)
    return carrier


class _TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = current_trace_id() or "-"
        return True


def setup_logging(service: str, level: str = "INFO") -> None:
    """Log lines on stderr carry the service and the trace id of the call they belong to."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_TraceIdFilter())
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)s {service} %(name)s [trace=%(trace_id)s] %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def span_attributes(**attrs: Any) -> dict[str, Any]:
    """Drop empty values: OpenTelemetry rejects None and empty strings are noise."""
    return {k.replace("__", "."): v for k, v in attrs.items() if v not in (None, "")}
