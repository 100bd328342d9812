"""Tracing and logging setup. One TracerProvider per process, exporting over OTLP to the
endpoint of OTEL_EXPORTER_OTLP_ENDPOINT (plaintext or TLS as the standard OTEL_EXPORTER_OTLP_*
variables say); W3C trace context propagates on gRPC metadata."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.processor.baggage import BaggageSpanProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.config import Settings
from shared.telemetry import semconv
from shared.telemetry.endpoints import HTTP_PROTOCOLS, grpc_insecure, http_url
from shared.telemetry.lean import LeanTracerProvider

TRACER_NAME = "toolmesh"
_provider: TracerProvider | None = None


def setup_tracing(service: str, settings: Settings) -> TracerProvider | None:
    """Install the process's TracerProvider. With tracing off, spans are no-ops."""
    global _provider
    if not settings.tracing:
        return None
    if _provider is not None:
        return _provider
    # The mesh's own spans are lean spans (shared.telemetry.lean: the SDK's, cheaper per span);
    # every other instrumentation scope gets the SDK's tracer.
    provider = LeanTracerProvider(
        resource=Resource.create(
            {"service.name": f"toolmesh-{service}", "service.namespace": "toolmesh"}
        ),
        lean_scopes=[TRACER_NAME],
    )
    # Tenant and conversation travel as W3C baggage; only the allowlisted keys become span
    # attributes (on every span, in every service).
    provider.add_span_processor(BaggageSpanProcessor(semconv.BAGGAGE_ALLOWLIST.__contains__))
    if settings.otlp_endpoint:
        # Batching is tuned by the standard OTEL_BSP_* variables (schedule delay, batch size).
        provider.add_span_processor(BatchSpanProcessor(span_exporter(settings)))
    trace.set_tracer_provider(provider)
    _provider = provider
    global _tracer
    _tracer = None  # re-resolve against the new provider
    return provider


def span_exporter(settings: Settings) -> SpanExporter:
    """OTLP over gRPC (default; the library's exporter with the faster encoder of
    shared.telemetry.otlp) or HTTP/protobuf, as OTEL_EXPORTER_OTLP_PROTOCOL (or its
    traces-specific variant) says; the endpoint is OTEL_EXPORTER_OTLP_ENDPOINT. TLS follows the
    standard variables, applied by the exporter (shared.telemetry.endpoints): https:// (or
    OTEL_EXPORTER_OTLP_INSECURE=false) is TLS with OTEL_EXPORTER_OTLP_CERTIFICATE and the client
    certificate and key; http:// or a bare host:port is plaintext. Imported lazily: each
    exporter pulls in its own transport machinery."""
    if settings.otlp_protocol.lower() in HTTP_PROTOCOLS:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return HttpSpanExporter(endpoint=http_url(settings.otlp_endpoint, "traces"))
    from shared.telemetry.otlp import FastOTLPSpanExporter

    return FastOTLPSpanExporter(
        endpoint=settings.otlp_endpoint,
        insecure=grpc_insecure(settings.otlp_endpoint, "traces"),
    )


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


_TRACE_CONTEXT_ONLY = TraceContextTextMapPropagator()


_BAGGAGE_ONLY = W3CBaggagePropagator()
# The propagators are the default pair (W3C trace context and baggage) unless configured.
_DEFAULT_PROPAGATORS = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage").replace(
    " ", ""
) in ("tracecontext,baggage", "baggage,tracecontext")
_MAX_CACHED_BAGGAGE = 1024
# A baggage header -> a context holding only its parsed entries. Within the mesh the same few
# headers (tenant and conversation) arrive on every call of a conversation; parsing one costs
# more than the span, and setting its entries one by one copies the context each time.
_baggage_cache: dict[str, Context] = {}


def extract_context(metadata: Mapping[str, str] | None, *, trust_baggage: bool = True) -> Context:
    """The caller's trace context; its baggage too unless the caller is outside the mesh (the
    dispatcher, the mesh's edge, never trusts incoming baggage)."""
    carrier = dict(metadata or {})
    if not trust_baggage:
        return _TRACE_CONTEXT_ONLY.extract(carrier=carrier)
    if not _DEFAULT_PROPAGATORS:
        return propagate.extract(carrier=carrier)
    header = carrier.get("baggage")
    if not header:
        return _TRACE_CONTEXT_ONLY.extract(carrier=carrier)
    base = _baggage_cache.get(header)
    if base is None:
        base = _BAGGAGE_ONLY.extract({"baggage": header}, context=Context())
        if len(_baggage_cache) >= _MAX_CACHED_BAGGAGE:
            _baggage_cache.clear()
        _baggage_cache[header] = base
    return _TRACE_CONTEXT_ONLY.extract(carrier=carrier, context=base)


def with_call_baggage(tenant_id: str, conversation_id: str) -> Context:
    """The current context with the mesh's baggage set from a call the dispatcher serves."""
    ctx = baggage.set_baggage(semconv.BAGGAGE_TENANT_ID, tenant_id)
    if conversation_id:
        ctx = baggage.set_baggage(semconv.BAGGAGE_CONVERSATION_ID, conversation_id, context=ctx)
    else:
        ctx = baggage.remove_baggage(semconv.BAGGAGE_CONVERSATION_ID, context=ctx)
    return ctx


# The current baggage entries -> their header: the same few entries go out on every call.
_baggage_header_cache: dict[tuple[tuple[str, object], ...], str] = {}


def inject_metadata(carrier: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """The current trace context and baggage as outgoing metadata."""
    if not _DEFAULT_PROPAGATORS:
        propagate.inject(carrier)
        return carrier
    _TRACE_CONTEXT_ONLY.inject(carrier)
    entries = baggage.get_all()
    if not entries:
        return carrier
    try:
        key = tuple(entries.items())
        header = _baggage_header_cache.get(key)
    except TypeError:  # an unhashable value: encode it every time
        key, header = (), None
    if header is None:
        encoded: dict[str, str] = {}
        _BAGGAGE_ONLY.inject(encoded)
        header = encoded.get("baggage", "")
        if key:
            if len(_baggage_header_cache) >= _MAX_CACHED_BAGGAGE:
                _baggage_header_cache.clear()
            _baggage_header_cache[key] = header
    if header:
        carrier["baggage"] = header
    return carrier


class _TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = current_trace_id() or "-"
        return True


class _MigrationChatterFilter(logging.Filter):
    """Alembic's INFO lines on every start (its plugins set up, "Context impl SQLiteImpl.")
    say nothing; the ones naming a migration it applies ("Running upgrade a -> b") stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not super().filter(record):  # not one of alembic's loggers
            return True
        return record.levelno > logging.INFO or record.getMessage().startswith("Running ")


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
    if root.level > logging.DEBUG:
        handler.addFilter(_MigrationChatterFilter("alembic"))


def span_attributes(**attrs: Any) -> dict[str, Any]:
    """Drop empty values: OpenTelemetry rejects None and empty strings are noise."""
    return {k.replace("__", "."): v for k, v in attrs.items() if v not in (None, "")}
