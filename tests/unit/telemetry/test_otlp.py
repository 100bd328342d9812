"""The fast OTLP span encoder writes exactly the library encoder's message: compared field for
field (as parsed messages) on generated spans of every attribute type, with events, links,
statuses, remote and local parents, several resources and scopes."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from shared.telemetry import otlp


def _text(rng: random.Random, n: int = 12) -> str:
    alphabet = string.ascii_letters + string.digits + " ._-/é漢🙂"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 2 else 7)
    if kind == 0:
        return rng.random() < 0.5
    if kind == 1:
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == 2:
        return rng.randint(0, 300)
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return _text(rng, 200)
    if kind == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
    if kind == 6:
        return rng.choice(["grpc", "bench", "ping", ""])  # repeated: exercises the memo
    if kind == 7:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    return {_text(rng, 6) or "k": _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _attrs(rng: random.Random, n: int) -> dict[str, Any]:
    keys = ["rpc.system", "rpc.service", "gen_ai.tool.name", "toolmesh.tenant.id"]
    return {
        (rng.choice(keys) if rng.random() < 0.5 else _text(rng, 20) or "x"): _value(rng)
        for _ in range(rng.randint(0, n))
    }


def _context(rng: random.Random, remote: bool) -> SpanContext:
    state = TraceState([("vendor", "v1"), ("other", "x")]) if rng.random() < 0.2 else None
    return SpanContext(
        trace_id=rng.getrandbits(128) or 1,
        span_id=rng.getrandbits(64) or 1,
        is_remote=remote,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=state,
    )


def _span(rng: random.Random, resources: list[Resource], scopes: list[Any]) -> ReadableSpan:
    parent = None
    if rng.random() < 0.7:
        parent = _context(rng, remote=rng.random() < 0.5)
    status = rng.choice(
        [
            Status(StatusCode.UNSET),
            Status(StatusCode.OK),
            Status(StatusCode.ERROR, "boom: " + _text(rng)),
            Status(StatusCode.ERROR),
        ]
    )
    start = rng.randint(1, 2**63)
    return ReadableSpan(
        name=rng.choice(["execute_tool ping", "toolmesh.registry.v1.RegistryService/ExecuteTool"])
        + _text(rng, 3),
        context=_context(rng, remote=False),
        parent=parent,
        resource=rng.choice(resources),
        attributes=_attrs(rng, 14),
        events=[
            Event(_text(rng, 10) or "e", _attrs(rng, 4), timestamp=rng.randint(1, 2**63))
            for _ in range(rng.randint(0, 2))
        ],
        links=[
            Link(_context(rng, remote=rng.random() < 0.5), _attrs(rng, 3))
            for _ in range(rng.randint(0, 2))
        ],
        kind=rng.choice(list(SpanKind)),
        status=status,
        start_time=start,
        end_time=start + rng.randint(0, 10**9),
        instrumentation_scope=rng.choice(scopes),
    )


@pytest.mark.parametrize("seed", range(40))
def test_the_fast_encoding_is_the_library_encoding(seed: int) -> None:
    rng = random.Random(seed)
    resources = [
        Resource.create({"service.name": "toolmesh-registry", "service.namespace": "toolmesh"}),
        Resource({"service.name": "other", "n": 3}, schema_url="https://example.test/s"),
        # equal to the first but another object: grouped with it, as the library does
        Resource.create({"service.name": "toolmesh-registry", "service.namespace": "toolmesh"}),
    ]
    scopes = [
        InstrumentationScope("toolmesh"),
        InstrumentationScope("mcp", "2.1", "https://example.test/scope", {"a": 1}),
        None,
    ]
    spans = [_span(rng, resources, scopes) for _ in range(rng.randint(1, 30))]
    fast = ExportTraceServiceRequest.FromString(otlp.encode_spans(spans))
    assert fast == library_encode(spans)


def test_an_unencodable_attribute_is_dropped_like_the_library_drops_it() -> None:
    span = ReadableSpan(
        name="s",
        context=SpanContext(1, 2, is_remote=False),
        attributes={"ok": "yes", "surrogate": "\ud800", "big": 2**70},
        resource=Resource.create({}),
    )
    assert ExportTraceServiceRequest.FromString(otlp.encode_spans([span])) == library_encode([span])


def test_the_exporter_translates_with_the_fast_encoder() -> None:
    exporter = otlp.FastOTLPSpanExporter(endpoint="127.0.0.1:1", insecure=True)
    span = ReadableSpan(
        name="s", context=SpanContext(1, 2, is_remote=False), resource=Resource.create({})
    )
    try:
        assert exporter._translate_data([span]) == library_encode([span])
    finally:
        exporter.shutdown()
