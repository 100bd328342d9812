"""The OTLP collector receives what a real OpenTelemetry SDK exports over gRPC: parent links,
service.name, kinds, status and typed attributes; the JSONL sink round-trips spans."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from shared.telemetry.collector import (
    CollectorThread,
    JsonlSpanSink,
    MemorySpanSink,
    ReceivedSpan,
    read_spans,
    start_collector,
)


def _emit_parent_and_child(provider: TracerProvider) -> tuple[str, str]:
    """Emit SERVER parent + CLIENT child; return (trace_id, parent_span_id) as hex."""
    tracer = provider.get_tracer("toolmesh.tests")
    with tracer.start_as_current_span(
        "registry.GetTool", kind=SpanKind.SERVER, attributes={"rpc.system": "grpc"}
    ) as parent:
        with tracer.start_as_current_span(
            "sandbox.Run",
            kind=SpanKind.CLIENT,
            attributes={
                "tool.name": "load_dataset",
                "attempt": 2,
                "ratio": 0.5,
                "cached": False,
                "tags": ["a", "b"],
            },
        ) as child:
            child.set_status(Status(StatusCode.ERROR, "tool failed"))
        ctx = parent.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _provider(endpoint: str, *, batch: bool) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "toolmesh-test"}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider


def _assert_parent_and_child(spans: list[ReceivedSpan], trace_id: str, parent_id: str) -> None:
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"registry.GetTool", "sandbox.Run"}
    parent, child = by_name["registry.GetTool"], by_name["sandbox.Run"]

    assert parent.trace_id == child.trace_id == trace_id
    assert parent.span_id == parent_id and len(parent.span_id) == 16
    assert parent.parent_span_id == ""
    assert child.parent_span_id == parent_id
    assert (parent.kind, child.kind) == ("SERVER", "CLIENT")
    assert parent.service_name == child.service_name == "toolmesh-test"
    assert parent.attributes == {"rpc.system": "grpc"}
    assert child.attributes == {
        "tool.name": "load_dataset",
        "attempt": 2,
        "ratio": 0.5,
        "cached": False,
        "tags": ["a", "b"],
    }
    assert (parent.status_code, child.status_code) == ("UNSET", "ERROR")
    assert child.status_message == "tool failed"
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns


@pytest.fixture
def collector() -> Iterator[tuple[CollectorThread, MemorySpanSink]]:
    sink = MemorySpanSink()
    with CollectorThread(sink) as thread:
        yield thread, sink


def test_collector_thread_receives_spans_from_the_sdk_exporter(
    collector: tuple[CollectorThread, MemorySpanSink],
) -> None:
    thread, sink = collector
    assert thread.port > 0
    provider = _provider(f"127.0.0.1:{thread.port}", batch=False)
    try:
        trace_id, parent_id = _emit_parent_and_child(provider)
    finally:
        provider.shutdown()

    spans = sink.wait_for_sync(lambda s: s.trace_id == trace_id, timeout=10, count=2)
    _assert_parent_and_child(spans, trace_id, parent_id)


async def test_async_collector_receives_a_batch_flushed_from_another_thread() -> None:
    sink = MemorySpanSink()
    server, port = await start_collector("127.0.0.1", 0, sink)
    try:
        provider = _provider(f"127.0.0.1:{port}", batch=True)
        try:
            trace_id, parent_id = _emit_parent_and_child(provider)
            # The exporter blocks; flush off the loop so the collector on this loop can answer.
            assert await asyncio.to_thread(provider.force_flush, 10_000)
        finally:
            await asyncio.to_thread(provider.shutdown)
        spans = await sink.wait_for(lambda s: s.trace_id == trace_id, timeout=10, count=2)
        _assert_parent_and_child(spans, trace_id, parent_id)
    finally:
        await server.stop(grace=None)


def test_collector_thread_start_fails_on_a_taken_port(
    collector: tuple[CollectorThread, MemorySpanSink],
) -> None:
    thread, sink = collector
    second = CollectorThread(sink, port=thread.port)
    with pytest.raises(OSError, match="could not bind"):
        second.start()
    second.stop()


def test_wait_for_sync_times_out_listing_what_was_received() -> None:
    sink = MemorySpanSink()
    sink.add([_span("a" * 32, "1" * 16, "only.span")])
    with pytest.raises(TimeoutError, match=r"1 span\(s\) received:[\s\S]*only\.span"):
        sink.wait_for_sync(lambda s: s.name == "missing", timeout=0.1)
    sink.clear()
    assert sink.spans() == []


def _span(trace_id: str, span_id: str, name: str, parent: str = "") -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind="INTERNAL",
        service_name="svc",
        start_ns=1,
        end_ns=2,
        status_code="OK",
        status_message="",
        attributes={"n": 1, "nested": {"k": [True, 1.5, "x"]}},
    )


def test_jsonl_sink_round_trips_and_filters_by_trace(tmp_path: Path) -> None:
    path = tmp_path / "spans" / "spans.jsonl"
    sink = JsonlSpanSink(path)
    assert read_spans(path) == []
    first = _span("a" * 32, "1" * 16, "root")
    second = _span("a" * 32, "2" * 16, "child", parent="1" * 16)
    other = _span("b" * 32, "3" * 16, "elsewhere")
    sink.add([first, second])
    sink.add([other])

    assert read_spans(path) == [first, second, other]
    assert read_spans(path, trace_id="a" * 32) == [first, second]


def test_read_spans_skips_only_a_malformed_last_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    span = _span("a" * 32, "1" * 16, "root")
    path.write_text(span.to_json() + "\n" + '{"trace_id": "ab', encoding="utf-8")
    assert read_spans(path) == [span]

    path.write_text("not json\n" + span.to_json() + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"spans\.jsonl:1"):
        read_spans(path)
