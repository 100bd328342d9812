"""A local OTLP/gRPC trace receiver: the TraceService `Export` RPC turned into plain
`ReceivedSpan` records handed to a sink (in memory for tests, JSONL on disk for a running mesh).

It is a real collector endpoint: point any OTLP/gRPC exporter (OTEL_EXPORTER_OTLP_ENDPOINT) at
`start_collector(...)`'s port, or at a `CollectorThread` from synchronous code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

logger = logging.getLogger(__name__)

_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
_POLL_INTERVAL_S = 0.02


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received over OTLP, with ids as hex and attributes decoded to Python."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # 16 hex digits, "" for a root span
    name: str
    kind: str  # "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER" or "UNSPECIFIED"
    service_name: str  # the resource attribute service.name
    start_ns: int
    end_ns: int
    status_code: str  # "UNSET", "OK" or "ERROR"
    status_message: str
    attributes: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReceivedSpan:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class SpanSink(Protocol):
    """Where the collector hands received spans. Called from the collector's event loop."""

    def add(self, spans: Sequence[ReceivedSpan]) -> None: ...


# --- decoding ---------------------------------------------------------------------------------


def decode_any_value(value: Any) -> Any:
    """An OTLP AnyValue as str/bool/int/float/list/dict (bytes as hex, unset as None)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return bytes(value.bytes_value).hex()
    return getattr(value, which)


def decode_attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: decode_any_value(kv.value) for kv in key_values}


def _enum_suffix(enum_type: Any, number: int, prefix: str) -> str:
    try:
        name: str = enum_type.Name(number)
    except ValueError:
        return str(number)
    return name.removeprefix(prefix)


def spans_from_request(request: Any) -> list[ReceivedSpan]:
    """Every span of an ExportTraceServiceRequest, flattened."""
    received: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource_attrs = decode_attributes(resource_spans.resource.attributes)
        service_name = str(resource_attrs.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                received.append(
                    ReceivedSpan(
                        trace_id=bytes(span.trace_id).hex(),
                        span_id=bytes(span.span_id).hex(),
                        parent_span_id=bytes(span.parent_span_id).hex(),
                        name=span.name,
                        kind=_enum_suffix(trace_pb2.Span.SpanKind, span.kind, "SPAN_KIND_"),
                        service_name=service_name,
                        start_ns=int(span.start_time_unix_nano),
                        end_ns=int(span.end_time_unix_nano),
                        status_code=_enum_suffix(
                            trace_pb2.Status.StatusCode, span.status.code, "STATUS_CODE_"
                        ),
                        status_message=span.status.message,
                        attributes=decode_attributes(span.attributes),
                    )
                )
    return received


@dataclass(frozen=True)
class ReceivedPoint:
    """One metric data point as received over OTLP: a sum's value, or a histogram's count and
    sum (gauges as value)."""

    name: str
    service_name: str
    kind: str  # "sum", "gauge" or "histogram"
    attributes: dict[str, Any] = field(default_factory=dict, hash=False)
    value: float = 0.0
    count: int = 0
    sum: float = 0.0
    unit: str = ""


def points_from_request(request: Any) -> list[ReceivedPoint]:
    """Every data point of an ExportMetricsServiceRequest, flattened."""
    received: list[ReceivedPoint] = []
    for resource_metrics in request.resource_metrics:
        resource_attrs = decode_attributes(resource_metrics.resource.attributes)
        service_name = str(resource_attrs.get("service.name", ""))
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                which = metric.WhichOneof("data")
                if which in ("sum", "gauge"):
                    for dp in getattr(metric, which).data_points:
                        value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                        received.append(
                            ReceivedPoint(
                                name=metric.name,
                                service_name=service_name,
                                kind=which,
                                attributes=decode_attributes(dp.attributes),
                                value=float(value),
                                unit=metric.unit,
                            )
                        )
                elif which == "histogram":
                    for hp in metric.histogram.data_points:
                        received.append(
                            ReceivedPoint(
                                name=metric.name,
                                service_name=service_name,
                                kind="histogram",
                                attributes=decode_attributes(hp.attributes),
                                count=int(hp.count),
                                sum=float(hp.sum),
                                unit=metric.unit,
                            )
                        )
    return received


# --- sinks ------------------------------------------------------------------------------------


def _describe(spans: Sequence[ReceivedSpan], limit: int = 50) -> str:
    if not spans:
        return "no spans were received"
    lines = [
        f"  {s.service_name or '?'} {s.kind} {s.name!r} trace={s.trace_id} span={s.span_id} "
        f"parent={s.parent_span_id or '-'} status={s.status_code}"
        for s in spans[:limit]
    ]
    if len(spans) > limit:
        lines.append(f"  ... and {len(spans) - limit} more")
    return f"{len(spans)} span(s) received:\n" + "\n".join(lines)


class MemorySpanSink:
    """Keeps received spans in a list; thread-safe. `wait_for*` poll until enough match."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []

    def add(self, spans: Sequence[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def add_points(self, points: Sequence[ReceivedPoint]) -> None:
        with self._lock:
            self._points.extend(points)

    def points(self, name: str | None = None) -> list[ReceivedPoint]:
        """Metric data points received so far (cumulative exports: later points of a series
        carry the running totals)."""
        with self._lock:
            snapshot = list(self._points)
        return [p for p in snapshot if name is None or p.name == name]

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            snapshot = list(self._spans)
        return [s for s in snapshot if trace_id is None or s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def _matching(
        self, predicate: Callable[[ReceivedSpan], bool], count: int
    ) -> list[ReceivedSpan] | None:
        matched = [s for s in self.spans() if predicate(s)]
        return matched if len(matched) >= count else None

    def _timeout_error(self, timeout: float, count: int) -> TimeoutError:
        return TimeoutError(
            f"no {count} span(s) matching the predicate within {timeout:.1f}s; "
            + _describe(self.spans())
        )

    async def wait_for(
        self,
        predicate: Callable[[ReceivedSpan], bool],
        timeout: float = 5.0,
        *,
        count: int = 1,
    ) -> list[ReceivedSpan]:
        """Wait until at least `count` spans satisfy `predicate`; return all that do."""
        deadline = time.monotonic() + timeout
        while True:
            matched = self._matching(predicate, count)
            if matched is not None:
                return matched
            if time.monotonic() >= deadline:
                raise self._timeout_error(timeout, count)
            await asyncio.sleep(_POLL_INTERVAL_S)

    def wait_for_sync(
        self, predicate: Callable[[ReceivedSpan], bool], timeout: float = 5.0, *, count: int = 1
    ) -> list[ReceivedSpan]:
        """Blocking `wait_for`, for sync tests (the collector must run on another thread)."""
        deadline = time.monotonic() + timeout
        while True:
            matched = self._matching(predicate, count)
            if matched is not None:
                return matched
            if time.monotonic() >= deadline:
                raise self._timeout_error(timeout, count)
            time.sleep(_POLL_INTERVAL_S)


class JsonlSpanSink:
    """Appends one JSON object per span per line to `path` (created empty if missing).

    Each batch is written and flushed under a lock; safe for a single writing process.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self._lock = threading.Lock()

    def add(self, spans: Sequence[ReceivedSpan]) -> None:
        if not spans:
            return
        payload = "".join(span.to_json() + "\n" for span in spans)
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(payload)
            fh.flush()


def read_spans(path: str | Path, trace_id: str | None = None) -> list[ReceivedSpan]:
    """Spans from a JSONL span file, optionally of one trace.

    A malformed last line (a write in progress) is skipped; a malformed earlier line raises
    ValueError.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    spans: list[ReceivedSpan] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            span = ReceivedSpan.from_dict(data)
        except (json.JSONDecodeError, TypeError) as exc:
            if number == len(lines):
                logger.debug("skipping incomplete last line of %s", path)
                break
            raise ValueError(f"{path}:{number}: not a span record: {exc}") from exc
        if trace_id is None or span.trace_id == trace_id:
            spans.append(span)
    return spans


# --- the gRPC service -------------------------------------------------------------------------


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The OTLP TraceService: converts each Export request and hands the spans to the sink."""

    def __init__(self, sink: SpanSink) -> None:
        self._sink = sink

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        spans = spans_from_request(request)
        logger.debug("received %d span(s)", len(spans))
        self._sink.add(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """The OTLP MetricsService: data points go to the sink when it keeps them (the in-memory
    sink of tests); otherwise they are accepted and dropped, so exporters don't log errors."""

    def __init__(self, sink: SpanSink) -> None:
        self._add = getattr(sink, "add_points", None)

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self._add is not None:
            self._add(points_from_request(request))
        return metrics_service_pb2.ExportMetricsServiceResponse()


def _bind_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


async def start_collector(host: str, port: int, sink: SpanSink) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server serving the OTLP TraceService; port 0 picks a free port.

    Returns the started server (the caller stops it) and the bound port.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceReceiver(sink), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsReceiver(sink), server)
    address = _bind_address(host, port)
    try:
        bound: int = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc reports a failed bind as RuntimeError
        raise OSError(f"OTLP collector could not bind {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"OTLP collector could not bind {address}")
    await server.start()
    logger.info("OTLP trace collector listening on %s", _bind_address(host, bound))
    return server, bound


class CollectorThread:
    """The collector on its own event loop in a daemon thread, for synchronous code.

    `start()` returns the bound port; `stop()` stops the server and joins the thread. Also a
    context manager.
    """

    def __init__(self, sink: SpanSink, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sink = sink
        self.host = host
        self.port = port
        self._started: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> int:
        if self._thread is not None:
            raise RuntimeError("CollectorThread already started")
        self._thread = threading.Thread(target=self._run, name="otlp-collector", daemon=True)
        self._thread.start()
        self.port = self._started.result(timeout=timeout)
        return self.port

    @property
    def endpoint(self) -> str:
        """host:port for an OTLP exporter's `endpoint=` (insecure)."""
        return _bind_address(self.host, self.port)

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None and not loop.is_closed():
            # The loop may close between the check and the call if the thread is already ending.
            try:
                loop.call_soon_threadsafe(stop_event.set)
            except RuntimeError:
                logger.debug("collector loop already closed")
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"OTLP collector thread did not stop within {timeout:.1f}s")
        self._thread = None

    def __enter__(self) -> CollectorThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # thread top level: report to start(), never die silently
            if not self._started.done():
                self._started.set_exception(exc)
            else:
                logger.exception("OTLP collector thread failed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        server, port = await start_collector(self.host, self.port, self.sink)
        self._started.set_result(port)
        try:
            await self._stop_event.wait()
        finally:
            await server.stop(grace=1.0)
