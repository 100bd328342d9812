"""Spans for the mesh's own tracer at a fraction of the SDK's cost per span.

Every tool call makes four spans on its hot path (the dispatcher's SERVER and CLIENT spans,
the registry's SERVER and execute_tool spans). The SDK's span costs ~30 µs of the event loop
to start, fill and end in isolation here, and ~45 µs in the services under load: a
BoundedAttributes (an OrderedDict, a lock, every value checked through four calls) per span,
a BoundedList with its own lock for events that most spans never have, a sampler and a
SamplingResult per span, a generator-based context manager, and a second object — a copy of
the span's fields — made at end for the processors. Measured in the mesh at 64 calls in flight,
spans were the largest part of tracing's cost, which kept issue 2's targets out of reach.

`LeanTracerProvider` is the SDK's TracerProvider (sampler, resource, id generator, span
limits, tracer configurator, span processors, exporters and their OTEL_* settings all its own)
whose tracers for the scopes named in `lean_scopes` make `LeanSpan`s instead. A LeanSpan *is*
an SDK Span (every method the SDK has — events, exceptions, links, status — is the SDK's own)
with the expensive parts replaced by equivalents:

- attributes in a plain dict with the same limits (the oldest evicted past the count limit,
  dropped ones counted, strings cut to the length limit), plain values stored directly and any
  other value cleaned by the SDK's own `_clean_attribute`;
- events and links lists made on first use;
- the default sampler (parentbased_always_on) decided inline, any other configured sampler
  asked as the SDK asks it;
- the span itself handed to the processors at end (it is a ReadableSpan, and immutable once
  ended), instead of a copy;
- `start_as_current_span` a small class rather than a generator.

What reaches an exporter is what the SDK's spans give it, field for field
(tests/unit/telemetry/test_lean.py compares both through the OTLP encoders). Other
instrumentation scopes (libraries such as the MCP SDK) get the SDK's tracer unchanged.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from time import time_ns
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.attributes import _clean_attribute_value
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, Tracer, TracerProvider, sampling
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationInfo, InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

logger = logging.getLogger(__name__)

# Values BoundedAttributes stores as they are (strings too, within the length limit).
_PLAIN = frozenset((str, bool, int, float, bytes, type(None)))
_UNSET = Status(StatusCode.UNSET)
_FLAGS = {
    (sampled, random): TraceFlags(
        (TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        | (TraceFlags.RANDOM_TRACE_ID if random else 0)
    )
    for sampled in (False, True)
    for random in (False, True)
}


class LeanSpan(SdkSpan):
    """An SDK span with cheaper bookkeeping (see the module's docstring). Made only by
    LeanTracer."""

    # The SDK's __init__ is not called: every field it sets is set here (some lazily).
    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        tracer: LeanTracer,
        kind: SpanKind,
        attributes: types.Attributes,
        links: Sequence[trace_api.Link] | None,
        record_exception: bool,
        set_status_on_exception: bool,
        record_end_metrics: Callable[[], None] | None,
    ) -> None:
        # ReadableSpan's fields
        self._name = name
        self._context = context
        self._kind = kind
        self._instrumentation_info = tracer.instrumentation_info
        self._instrumentation_scope = tracer._instrumentation_scope
        self._parent = parent
        self._start_time: int | None = None
        self._end_time: int | None = None
        self._resource = tracer.resource
        self._status = _UNSET
        # Span's fields
        self._sampler = None
        self._trace_config = None
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._span_processor = tracer.span_processor
        self._limits = limits = tracer._span_limits
        self._lock = threading.Lock()
        self._record_end_metrics = record_end_metrics
        self._max_attributes = limits.max_span_attributes
        self._max_length = limits.max_span_attribute_length
        self._attributes: dict[str, Any] = {}
        self._dropped_attributes = 0
        self._events: Any = ()
        self._links: Any = self._new_links(links) if links else ()
        if attributes:
            self._set_all(attributes)

    # --- attributes: a plain dict with BoundedAttributes' rules ------------------------------

    def _store(self, key: str, value: Any) -> None:
        """Store a cleaned value under a valid key: a key set again moves to the end, and past
        the count limit the oldest goes (BoundedAttributes._setitem_locked)."""
        attrs = self._attributes
        if key in attrs:
            del attrs[key]
        limit = self._max_attributes
        if limit is not None:
            if limit == 0:
                self._dropped_attributes += 1
                return
            if len(attrs) >= limit:
                logger.warning("Attributes dict is full. Dropping the oldest key-value pair.")
                del attrs[next(iter(attrs))]
                self._dropped_attributes += 1
        attrs[key] = value

    def _set(self, key: str, value: Any) -> None:
        """BoundedAttributes.__setitem__: an empty or non-string key is dropped."""
        if type(key) is not str or not key:
            logger.warning("invalid key `%s`. must be non-empty string. Dropping key.", key)
            self._dropped_attributes += 1
            return
        kind = type(value)
        if kind is str:
            limit = self._max_length
            if limit is not None and len(value) > limit:
                value = _clean_attribute_value(value, limit)
        elif kind not in _PLAIN:
            value = _clean_attribute_value(value, self._max_length)
        self._store(key, value)

    def _set_all(self, attributes: Mapping[str, Any]) -> None:
        """BoundedAttributes._set_items: the mapping cleaned as a whole, keys too (a non-string
        key becomes its text where it has one), pair by pair here."""
        limit = self._max_length
        for key, value in attributes.items():
            if type(key) is str and key and type(value) in _PLAIN:
                if limit is not None and type(value) is str and len(value) > limit:
                    value = _clean_attribute_value(value, limit)
                self._store(key, value)
                continue
            cleaned: Mapping[str, Any] = _clean_attribute_value({key: value}, limit)
            if not cleaned:
                self._dropped_attributes += 1
            for k, v in cleaned.items():
                self._store(k, v)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self._end_time is not None:
            logger.warning("Setting attribute on ended span.")
            return
        self._set(key, value)

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self._end_time is not None:
            logger.warning("Setting attribute on ended span.")
            return
        self._set_all(attributes)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes

    # --- events and links: made on first use -------------------------------------------------

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        """The SDK's add_event; attributes that need no cleaning and fit the limits are kept
        in a plain dict rather than a BoundedAttributes."""
        limits = self._limits
        count, length = limits.max_event_attributes, limits.max_attribute_length
        if attributes is None or (
            (count is None or len(attributes) <= count)
            and all(
                type(k) is str
                and k
                and type(v) in _PLAIN
                and (length is None or type(v) is not str or len(v) <= length)
                for k, v in attributes.items()
            )
        ):
            self._add_event(Event(name, dict(attributes) if attributes else {}, timestamp))
            return
        super().add_event(name, attributes, timestamp)

    def _add_event(self, event: Any) -> None:
        with self._lock:
            if self._end_time is None:
                if not isinstance(self._events, BoundedList):
                    self._events = self._new_events()
                self._events.append(event)
                return
        logger.warning("Tried calling %s on an ended span.", "_add_event")

    def _add_link(self, link: trace_api.Link) -> None:
        with self._lock:
            if self._end_time is None:
                if not isinstance(self._links, BoundedList):
                    self._links = BoundedList.from_seq(self._limits.max_links, self._links)
                self._links.append(link)
                return
        logger.warning("Tried calling %s on an ended span.", "_add_link")

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, start_time: int | None = None, parent_context: Context | None = None) -> None:
        if self._start_time is not None:
            logger.warning("Calling start() on a started span.")
            return
        self._start_time = start_time if start_time is not None else time_ns()
        self._span_processor.on_start(self, parent_context=parent_context)

    def end(self, end_time: int | None = None) -> None:
        if self._start_time is None:
            raise RuntimeError("Calling end() on a not started span.")
        with self._lock:
            if self._end_time is not None:
                logger.warning("Calling end() on an ended span.")
                return
            self._end_time = end_time if end_time is not None else time_ns()
        if self._record_end_metrics is not None:
            self._record_end_metrics()
        processor = self._span_processor
        processor._on_ending(self)
        processor.on_end(self)  # ended, so read-only from here: no copy needed

    def _readable_span(self) -> LeanSpan:
        return self


class _CurrentSpan:
    """`start_as_current_span`'s context manager: `trace.use_span` as a class."""

    __slots__ = ("_end_on_exit", "_record", "_set_status", "_span", "_token")

    def __init__(
        self, span: trace_api.Span, end_on_exit: bool, record: bool, set_status: bool
    ) -> None:
        self._span = span
        self._end_on_exit = end_on_exit
        self._record = record
        self._set_status = set_status
        self._token: object = None

    def __enter__(self) -> trace_api.Span:
        self._token = context_api.attach(trace_api.set_span_in_context(self._span))
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            context_api.detach(self._token)  # type: ignore[arg-type]
            # As use_span: only Exception subclasses are errors (not GeneratorExit, say).
            if isinstance(exc, Exception) and span.is_recording():
                if self._record:
                    span.record_exception(exc)
                if self._set_status:
                    span.set_status(
                        Status(StatusCode.ERROR, description=f"{type(exc).__name__}: {exc}")
                    )
        finally:
            if self._end_on_exit:
                span.end()


class LeanTracer(Tracer):
    """The SDK's Tracer making LeanSpans."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._random_ids = self.id_generator.is_trace_id_random()
        self._count_spans = not isinstance(self._tracer_metrics, NoOpTracerMetrics)

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace_api.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        parent: SpanContext | None = trace_api.get_current_span(context).get_span_context()
        if parent is not None and not isinstance(parent, SpanContext):
            raise TypeError("parent_span_context must be a SpanContext or None.")
        if not self._is_enabled():
            return trace_api.NonRecordingSpan(context=parent)  # type: ignore[arg-type]
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = self.id_generator.generate_trace_id()
            random_id = self._random_ids
        else:
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
        if self.sampler is sampling.DEFAULT_ON:  # parentbased_always_on, decided inline
            sampled = parent is None or parent.trace_flags.sampled
            decision = sampling.Decision.RECORD_AND_SAMPLE if sampled else sampling.Decision.DROP
            trace_state = parent.trace_state if parent is not None else None
        else:
            result = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
            decision, trace_state = result.decision, result.trace_state
            sampled = decision.is_sampled()
            attributes = result.attributes
        span_context = SpanContext(
            trace_id,
            self.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=_FLAGS[sampled, random_id],
            trace_state=trace_state,
        )
        record_end_metrics: Callable[[], None] | None = (
            self._tracer_metrics.start_span(parent, decision) if self._count_spans else None
        )
        if not decision.is_recording():
            return trace_api.NonRecordingSpan(context=span_context)
        span = LeanSpan(
            name,
            span_context,
            parent,
            self,
            kind,
            attributes,
            links,
            record_exception,
            set_status_on_exception,
            record_end_metrics,
        )
        span.start(start_time=start_time, parent_context=context)
        return span

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace_api.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _CurrentSpan:
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        return _CurrentSpan(span, end_on_exit, record_exception, set_status_on_exception)


def _info(name: str, version: str, schema_url: str | None) -> InstrumentationInfo:
    """The deprecated InstrumentationInfo the SDK's tracers still carry (its warning hushed as
    the SDK hushes it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return InstrumentationInfo(name, version, schema_url)


class LeanTracerProvider(TracerProvider):
    """The SDK's TracerProvider; its tracers for `lean_scopes` make LeanSpans."""

    def __init__(self, *args: Any, lean_scopes: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean_scopes = frozenset(lean_scopes)

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace_api.Tracer:
        if self._disabled or instrumenting_module_name not in self._lean_scopes:
            return super().get_tracer(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
        version = instrumenting_library_version or ""
        scope = InstrumentationScope(instrumenting_module_name, version, schema_url, attributes)
        with self._tracers_lock:
            tracer = self._tracers.get(scope)
            if tracer is None:
                tracer = LeanTracer(
                    self.sampler,
                    self.resource,
                    self._active_span_processor,
                    self.id_generator,
                    _info(instrumenting_module_name, version, schema_url),
                    self._span_limits,
                    scope,
                    meter_provider=self._meter_provider,
                    _tracer_config=self._apply_tracer_configurator(scope),
                )
                self._tracers[scope] = tracer
        return tracer


__all__ = ["LeanSpan", "LeanTracer", "LeanTracerProvider"]
