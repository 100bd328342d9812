"""The MCP SDK seam: the SDK's own tracer turned off, so a tools/call is one span (the bridge's)
and the context the SDK injects into `_meta` is that span's."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.mcp_bridge.sdk import SDK_TRACER_SCOPE, disable_sdk_tracer


def test_the_sdk_tracer_records_nothing_and_injects_the_bridges_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    early = provider.get_tracer(SDK_TRACER_SCOPE)  # made before: updated too
    assert disable_sdk_tracer(provider)
    ours = provider.get_tracer("toolmesh")
    with ours.start_as_current_span("tools/call echo") as span:
        expected = span.get_span_context()
        for sdk_tracer in (early, provider.get_tracer(SDK_TRACER_SCOPE)):
            with sdk_tracer.start_as_current_span("MCP send tools/call echo") as sdk_span:
                assert not sdk_span.is_recording()
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
            _, trace_id, parent_id, _ = carrier["traceparent"].split("-")
            assert (trace_id, parent_id) == (
                f"{expected.trace_id:032x}",
                f"{expected.span_id:016x}",
            )
    with ours.start_as_current_span("another scope still records"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == [
        "tools/call echo",
        "another scope still records",
    ]
    provider.shutdown()


def test_without_an_sdk_tracer_provider_nothing_changes() -> None:
    assert not disable_sdk_tracer(trace.NoOpTracerProvider())
