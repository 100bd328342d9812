"""The span relay: a packed and rebuilt span encodes to exactly the OTLP the SDK would have sent
for the original, and a real relay child delivers spans to a real OTLP receiver, flushes on
demand, comes back after it dies, and drops (and counts) spans beyond its queue."""

from __future__ import annotations

import os
import sys
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from shared.telemetry.collector import CollectorThread, MemorySpanSink
from shared.telemetry.relay import RelayedSpan, RelaySpanProcessor, pack_span

RESOURCE = Resource.create({"service.name": "toolmesh-relay-test", "deployment.env": "test"})


def _emit(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("toolmesh.tests", "1.2.3", schema_url="https://x/schema")
    with (
        tracer.start_as_current_span(
            "toolmesh.registry.v1.RegistryService/ExecuteTool",
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "attempt": 2, "ratio": 0.5, "cached": False},
        ) as parent,
        tracer.start_as_current_span(
            "execute_tool ping",
            attributes={"gen_ai.tool.name": "ping", "tags": ("a", "b"), "ids": (1, 2)},
            links=[Link(parent.get_span_context(), {"link.kind": "follows"})],
        ) as child,
    ):
        child.add_event("progress", {"fraction": 0.25, "message": "héllo ✓"})
        child.set_status(Status(StatusCode.ERROR, "boom"))


def test_a_relayed_span_encodes_exactly_like_the_original() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _emit(provider)
    originals = exporter.get_finished_spans()
    assert len(originals) == 2
    relayed = [RelayedSpan(pack_span(s), RESOURCE) for s in originals]
    assert encode_spans(relayed) == encode_spans(originals)


def _relay(endpoint: str, **kwargs: object) -> tuple[TracerProvider, RelaySpanProcessor]:
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    provider = TracerProvider(resource=RESOURCE)
    relay = RelaySpanProcessor(provider.resource, env=env, **kwargs)  # type: ignore[arg-type]
    provider.add_span_processor(relay)
    return provider, relay


def test_the_relay_child_delivers_spans_to_an_otlp_receiver() -> None:
    sink = MemorySpanSink()
    with CollectorThread(sink) as collector:
        provider, relay = _relay(collector.endpoint, schedule_delay_s=30.0)
        try:
            _emit(provider)
            assert relay.force_flush(20_000)  # well before the 30 s schedule
            spans = sink.spans()
            assert sorted(s.name for s in spans) == [
                "execute_tool ping",
                "toolmesh.registry.v1.RegistryService/ExecuteTool",
            ]
            parent = next(s for s in spans if s.kind == "SERVER")
            child = next(s for s in spans if s.kind == "INTERNAL")
            assert child.parent_span_id == parent.span_id
            assert child.trace_id == parent.trace_id
            assert child.service_name == "toolmesh-relay-test"
            assert child.status_code == "ERROR" and child.status_message == "boom"
            assert parent.attributes["attempt"] == 2 and parent.attributes["cached"] is False
            assert child.attributes["tags"] == ["a", "b"]
        finally:
            provider.shutdown()
        child_process = relay._child
        assert child_process is None  # shut down: the pipe closed and the child was reaped


def test_a_relay_child_that_dies_is_replaced() -> None:
    sink = MemorySpanSink()
    with CollectorThread(sink) as collector:
        provider, relay = _relay(collector.endpoint, schedule_delay_s=0.05)
        try:
            first = relay._child
            assert first is not None
            first.kill()
            first.wait(5)
            time.sleep(1.1)  # past the restart back-off
            _emit(provider)
            deadline = time.monotonic() + 20
            while len(sink.spans()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(sink.spans()) == 2
            assert relay._child is not first
        finally:
            provider.shutdown()


def test_spans_over_the_queue_limit_are_dropped_and_counted() -> None:
    # A relay child that never reads: the pipe fills, the writer blocks, the queue fills.
    stuck = [sys.executable, "-c", "import time; time.sleep(60)"]
    provider = TracerProvider(resource=RESOURCE)
    relay = RelaySpanProcessor(
        provider.resource, command=stuck, schedule_delay_s=0.01, max_queue_size=4
    )
    provider.add_span_processor(relay)
    tracer = provider.get_tracer("toolmesh.tests")
    try:
        for _ in range(40):
            with tracer.start_as_current_span("big", attributes={"payload": "x" * 20_000}):
                pass
            time.sleep(0.005)
        assert relay.dropped >= 20  # at most ~3 spans fit the pipe, 4 the queue
    finally:
        child = relay._child
        assert child is not None
        child.kill()
        provider.shutdown()
