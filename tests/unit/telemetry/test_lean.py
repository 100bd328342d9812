"""Lean spans export exactly what the SDK's spans export: the same script of span operations run
on an SDK TracerProvider and on a LeanTracerProvider (same ids, same limits, same sampler) gives
the same ExportTraceServiceRequest through both the library's OTLP encoder and ours — names,
kinds, parents and remote flags, trace flags and state, attributes of every type with their
limits and dropped counts, events, exceptions, links, statuses — and the same sampling
decisions; other scopes keep the SDK's tracer; a disabled scope records nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider, _TracerConfig
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio, Sampler, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.telemetry import otlp
from shared.telemetry.lean import LeanSpan, LeanTracer, LeanTracerProvider

SCOPE = "toolmesh"


class CountingIds(IdGenerator):
    """Deterministic ids: both providers get the same sequence."""

    def __init__(self) -> None:
        self.n = 0

    def is_trace_id_random(self) -> bool:
        return True  # root spans get W3C's random-trace-id flag, and their children inherit it

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (self.n * 0x9E3779B97F4A7C15) % (1 << 128) or 1


def provider_pair(
    limits: SpanLimits | None = None, sampler: Sampler | None = None
) -> Iterator[tuple[Any, InMemorySpanExporter]]:
    for cls in (TracerProvider, LeanTracerProvider):
        kwargs: dict[str, Any] = {"lean_scopes": [SCOPE]} if cls is LeanTracerProvider else {}
        provider = cls(
            resource=Resource.create({"service.name": "toolmesh-test"}),
            id_generator=CountingIds(),
            span_limits=limits or SpanLimits(),
            sampler=sampler,
            shutdown_on_exit=False,
            **kwargs,
        )
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        yield provider, exporter


def normalised(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """Timestamps zeroed; an exception's stack trace cut to its last line (the SDK's
    generator-based context manager adds its own frames to the traceback)."""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.start_time_unix_nano = span.end_time_unix_nano = 0
                for event in span.events:
                    event.time_unix_nano = 0
                    for kv in event.attributes:
                        if kv.key == "exception.stacktrace":
                            kv.value.string_value = kv.value.string_value.strip().splitlines()[-1]
    return request


def exported(
    script: Callable[[trace.Tracer], None], **pair: Any
) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    """The spans the script makes on the SDK and on the lean provider, both encodings checked
    equal."""
    results = []
    for provider, exporter in provider_pair(**pair):
        tracer = provider.get_tracer(SCOPE)
        script(tracer)
        provider.force_flush()
        results.append(list(exporter.get_finished_spans()))
    sdk, lean = results
    assert all(isinstance(s, LeanSpan) for s in lean)
    assert not any(isinstance(s, LeanSpan) for s in sdk)
    for encode in (
        lambda spans: ExportTraceServiceRequest.FromString(otlp.encode_spans(spans)),
        library_encode,
    ):
        assert normalised(encode(lean)) == normalised(encode(sdk))
    # What OTLP leaves out but propagation sends on: the W3C flags and trace state.
    assert [(s.context, s.parent) for s in lean] == [(s.context, s.parent) for s in sdk]
    assert [s.context.trace_flags for s in lean] == [s.context.trace_flags for s in sdk]
    return sdk, lean


ATTRIBUTES: dict[str, Any] = {
    "s": "text é漢🙂",
    "b": True,
    "i": -(2**63),
    "f": 1.5,
    "raw": b"\x00\xff",
    "none": None,
    "ints": [1, 2, 3],
    "strs": ("a", "b"),
    "mixed": [1, "a"],
    "map": {"k": "v", "n": {"x": 1}},
    "obj": Exception("cast to its text"),
}


def full_script(tracer: trace.Tracer) -> None:
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER, attributes=ATTRIBUTES) as root:
        root.set_attribute("later", 7)
        root.set_attribute("s", "moved to the end")
        root.set_attribute("", "an empty key is dropped")
        root.set_attributes({"a1": 1, "a2": [1.5, 2.5]})
        root.add_event("plain")
        root.add_event("with attributes", {"k": "v", "n": 3}, timestamp=123)
        root.update_name("root renamed")
        root.add_link(SpanContext(7, 8, is_remote=True), {"why": "batch"})
        with tracer.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(Status(StatusCode.OK))
            child.set_status(Status(StatusCode.ERROR, "ignored: OK is final"))
        try:
            with tracer.start_as_current_span("raises"):
                raise ValueError("boom")
        except ValueError:
            pass
        try:
            with tracer.start_as_current_span(
                "raises quietly", record_exception=False, set_status_on_exception=False
            ):
                raise KeyError("quiet")
        except KeyError:
            pass
        try:
            with tracer.start_as_current_span("cancelled"):
                raise asyncio.CancelledError  # a BaseException: not an error of the span
        except asyncio.CancelledError:
            pass
        span = tracer.start_span(
            "linked",
            links=[
                Link(SpanContext(9, 10, is_remote=False), {"n": 1}),
                Link(trace.INVALID_SPAN_CONTEXT),
            ],
        )
        span.set_status(StatusCode.ERROR, "by code")
        span.record_exception(RuntimeError("recorded"), {"extra": 1}, escaped=True)
        span.end()
        span.set_attribute("after end", 1)  # ignored
        span.end()  # a second end is ignored
    # A remote parent (sampled, with a trace state) and a root span made outside any context.
    carrier = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03",
        "tracestate": "vendor=1,other=two",
    }
    remote = TraceContextTextMapPropagator().extract(carrier)
    with (
        tracer.start_as_current_span("from remote", context=remote, kind=SpanKind.SERVER),
        tracer.start_as_current_span("nested"),
    ):
        pass
    tracer.start_span("root again", start_time=5).end(end_time=9)


def test_every_span_operation_exports_as_the_sdks_spans_do() -> None:
    sdk, lean = exported(full_script)
    assert [s.name for s in lean] == [s.name for s in sdk]
    assert len(lean) == 9
    root = next(s for s in lean if s.name == "root renamed")
    assert root.attributes["obj"] == "cast to its text" and root.dropped_attributes == 1
    assert list(root.attributes)[-1] == "a2" and "s" in root.attributes
    assert [s.parent.is_remote for s in lean if s.name == "from remote"] == [True]


def test_limits_drop_and_cut_as_the_sdk_does() -> None:
    limits = SpanLimits(
        max_span_attributes=3,
        max_events=2,
        max_span_attribute_length=4,
        max_attribute_length=4,
        max_event_attributes=1,
        max_links=1,
    )

    def script(tracer: trace.Tracer) -> None:
        span = tracer.start_span(
            "limited",
            attributes={"a": "long value", "b": 1, "c": 2, "d": 3},
            links=[Link(SpanContext(1, 2, False)), Link(SpanContext(3, 4, False))],
        )
        span.set_attribute("e", ["long value", "x"])
        span.set_attributes({"f": "fff", 5: "a non-string key"})
        for i in range(4):
            span.add_event(f"e{i}", {"x": 1, "y": 2})
        span.add_link(SpanContext(5, 6, False))
        span.end()
        tracer.start_span("none kept", attributes={"a": 1}).end()

    sdk, lean = exported(script, limits=limits)
    assert lean[0].dropped_attributes == sdk[0].dropped_attributes > 0
    assert lean[0].dropped_events == 2 and lean[0].dropped_links == 2


def test_no_attribute_limit_and_a_zero_limit() -> None:
    def script(tracer: trace.Tracer) -> None:
        span = tracer.start_span("many", attributes={f"k{i}": i for i in range(300)})
        span.set_attributes({f"j{i}": "v" * 100 for i in range(10)})
        span.end()

    exported(script, limits=SpanLimits(max_span_attributes=1000))
    exported(script, limits=SpanLimits(max_span_attributes=0))


@pytest.mark.parametrize(
    "sampler", [TraceIdRatioBased(0.5), ParentBasedTraceIdRatio(0.5)], ids=["ratio", "parentbased"]
)
def test_other_samplers_decide_as_in_the_sdk(sampler: Sampler) -> None:
    def script(tracer: trace.Tracer) -> None:
        for i in range(40):
            with (
                tracer.start_as_current_span(f"root{i}"),
                tracer.start_as_current_span(f"child{i}"),
            ):
                pass

    _, lean = exported(script, sampler=sampler)
    assert 0 < len(lean) < 80


def test_an_unsampled_parent_makes_no_span() -> None:
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}

    def script(tracer: trace.Tracer) -> None:
        ctx = TraceContextTextMapPropagator().extract(carrier)
        with tracer.start_as_current_span("dropped", context=ctx) as span:
            assert not span.is_recording()
            assert not span.get_span_context().trace_flags.sampled
            with tracer.start_as_current_span("dropped too") as inner:
                assert not inner.is_recording()
        with tracer.start_as_current_span("kept"):
            pass

    _, lean = exported(script)
    assert [s.name for s in lean] == ["kept"]


def test_the_current_span_and_context_are_restored() -> None:
    provider = LeanTracerProvider(lean_scopes=[SCOPE], shutdown_on_exit=False)
    tracer = provider.get_tracer(SCOPE)
    assert isinstance(tracer, LeanTracer)
    before = otel_context.get_current()
    with tracer.start_as_current_span("outer") as outer:
        assert trace.get_current_span() is outer
        with tracer.start_as_current_span("inner", end_on_exit=False) as inner:
            assert trace.get_current_span() is inner
            assert inner.parent == outer.get_span_context()
        assert trace.get_current_span() is outer
        assert inner.is_recording()  # not ended on exit
        inner.end()
    assert otel_context.get_current() == before
    assert not outer.is_recording()


def test_other_scopes_keep_the_sdks_tracer_and_a_disabled_scope_records_nothing() -> None:
    provider = LeanTracerProvider(lean_scopes=[SCOPE], shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    other = provider.get_tracer("some.library")
    assert not isinstance(other, LeanTracer)
    assert provider.get_tracer(SCOPE) is provider.get_tracer(SCOPE)
    provider._set_tracer_configurator(tracer_configurator=lambda scope: _TracerConfig(False))
    with provider.get_tracer(SCOPE).start_as_current_span("off") as span:
        assert not span.is_recording()
    assert exporter.get_finished_spans() == ()
