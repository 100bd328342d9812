"""The mesh's propagation shortcuts (cached baggage headers and parsed baggage) give what the
standard propagators give: the same outgoing metadata, the same extracted context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from shared.telemetry import tracing

PARENTS = [
    SpanContext(0xABC, 0x123, is_remote=False, trace_flags=TraceFlags(1)),
    SpanContext(
        0xABCDEF,
        0x42,
        is_remote=True,
        trace_flags=TraceFlags(0),
        trace_state=TraceState([("vendor", "x1")]),
    ),
]
BAGGAGES = [
    {},
    {"toolmesh.tenant.id": "acme"},
    {"toolmesh.tenant.id": "a b,c=d;e", "gen_ai.conversation.id": "conv/1 ünï"},
]


@pytest.fixture(autouse=True)
def provider() -> Iterator[None]:
    tracing._baggage_cache.clear()
    tracing._baggage_header_cache.clear()
    yield


def _context(parent: SpanContext, entries: dict[str, str]) -> otel_context.Context:
    ctx = trace.set_span_in_context(NonRecordingSpan(parent))
    for key, value in entries.items():
        ctx = baggage.set_baggage(key, value, context=ctx)
    return ctx


@pytest.mark.parametrize("parent", PARENTS)
@pytest.mark.parametrize("entries", BAGGAGES)
def test_injected_metadata_is_the_standard_propagators(
    parent: SpanContext, entries: dict[str, str]
) -> None:
    token = otel_context.attach(_context(parent, entries))
    try:
        expected: dict[str, str] = {}
        propagate.inject(expected)
        assert tracing.inject_metadata({}) == expected
        assert tracing.inject_metadata({}) == expected  # the cached header too
    finally:
        otel_context.detach(token)


@pytest.mark.parametrize("parent", PARENTS)
@pytest.mark.parametrize("entries", BAGGAGES)
def test_an_extracted_context_is_the_standard_propagators(
    parent: SpanContext, entries: dict[str, str]
) -> None:
    token = otel_context.attach(_context(parent, entries))
    try:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    finally:
        otel_context.detach(token)
    expected = propagate.extract(carrier)
    for _ in range(2):  # parsed, then from the cache
        got = tracing.extract_context(carrier)
        assert trace.get_current_span(got).get_span_context() == (
            trace.get_current_span(expected).get_span_context()
        )
        assert baggage.get_all(got) == baggage.get_all(expected)
    untrusted = tracing.extract_context(carrier, trust_baggage=False)
    assert baggage.get_all(untrusted) == {}
    assert trace.get_current_span(untrusted).get_span_context().span_id == parent.span_id


def test_a_span_started_under_an_extracted_context_continues_the_trace() -> None:
    provider = TracerProvider()
    carrier = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "baggage": "toolmesh.tenant.id=acme",
    }
    with provider.get_tracer("t").start_as_current_span(
        "child", context=tracing.extract_context(carrier)
    ) as span:
        assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
        assert baggage.get_baggage("toolmesh.tenant.id") is None  # not attached by start
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
