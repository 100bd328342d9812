"""Span export off the service's process: the OTLP encoding and the export run in a child
process, so they never hold the service's GIL while its event loop serves calls.

Encoding a span for OTLP in the SDK's Python encoder costs more than creating it (measured
here: ~60-80 µs a span on the 2-core VM, in a thread that takes the GIL from the event loop for
whole batches). With the relay, the service's side of a finished span is a list append; a
writer thread packs a batch into plain tuples, `marshal`s it (C code) and writes it as one
length-prefixed frame on a pipe to `python -m shared.telemetry.relay`. The child rebuilds the
spans and hands them to the SDK's own OTLP exporter, configured by the same standard
OTEL_EXPORTER_OTLP_* variables, so what a collector receives is exactly what the in-process
BatchSpanProcessor would have sent.

Batching follows the standard OTEL_BSP_* variables (schedule delay, queue and batch sizes);
spans over the queue limit are dropped and counted, as the SDK's processor does. The child
ignores SIGINT/SIGTERM and exits when its pipe closes, so a service's shutdown (or death) is
always followed by the child exporting what it received and exiting. If the child dies, the
writer starts a new one.
"""

from __future__ import annotations

import logging
import marshal
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_MAX_FRAME = 64 * 1024 * 1024
FRAME_RESOURCE = 0
FRAME_SPANS = 1
FRAME_FLUSH = 2
_RESTART_BACKOFF_S = 1.0
_SHUTDOWN_FLUSH_MS = 5000

PackedSpan = tuple[Any, ...]


# --- packing: a finished span as marshal-able tuples ---------------------------------------------


def _context_tuple(ctx: SpanContext) -> tuple[int, int, bool, int, str]:
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return (ctx.trace_id, ctx.span_id, ctx.is_remote, int(ctx.trace_flags), state)


def _attrs(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    # Attribute values are str/bool/int/float or tuples of one of them (the SDK enforces it).
    return dict(attributes) if attributes else {}


def pack_span(span: ReadableSpan) -> PackedSpan:
    ctx = span.get_span_context()
    assert ctx is not None
    scope = span.instrumentation_scope
    status = span.status
    return (
        span.name,
        _context_tuple(ctx),
        _context_tuple(span.parent) if span.parent is not None else None,
        span.kind.value,
        span.start_time,
        span.end_time,
        status.status_code.value,
        status.description,
        _attrs(span.attributes),
        [(e.name, e.timestamp, _attrs(e.attributes)) for e in span.events],
        [(_context_tuple(link.context), _attrs(link.attributes)) for link in span.links],
        (scope.name, scope.version, scope.schema_url) if scope is not None else None,
        span.dropped_attributes,
        span.dropped_events,
        span.dropped_links,
    )


def _context(t: Sequence[Any]) -> SpanContext:
    trace_id, span_id, is_remote, flags, state = t
    return SpanContext(
        trace_id,
        span_id,
        is_remote=is_remote,
        trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else None,
    )


class RelayedSpan(ReadableSpan):
    """A span rebuilt from its packed form (keeping the original's dropped counts)."""

    def __init__(self, packed: PackedSpan, resource: Resource) -> None:
        (
            name,
            ctx,
            parent,
            kind,
            start,
            end,
            status_code,
            status_description,
            attributes,
            events,
            links,
            scope,
            self._relayed_dropped_attributes,
            self._relayed_dropped_events,
            self._relayed_dropped_links,
        ) = packed
        super().__init__(
            name=name,
            context=_context(ctx),
            parent=_context(parent) if parent is not None else None,
            resource=resource,
            attributes=attributes,
            events=[Event(n, a, timestamp=ts) for n, ts, a in events],
            links=[Link(_context(c), a) for c, a in links],
            kind=SpanKind(kind),
            status=Status(StatusCode(status_code), status_description),
            start_time=start,
            end_time=end,
            instrumentation_scope=InstrumentationScope(*scope) if scope is not None else None,
        )

    @property
    def dropped_attributes(self) -> int:
        return int(self._relayed_dropped_attributes)

    @property
    def dropped_events(self) -> int:
        return int(self._relayed_dropped_events)

    @property
    def dropped_links(self) -> int:
        return int(self._relayed_dropped_links)


def _frame(kind: int, body: Any) -> bytes:
    payload = marshal.dumps((kind, body))
    return _HEADER.pack(len(payload)) + payload


# --- the service's side -------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return default


class RelaySpanProcessor(SpanProcessor):
    """Queues finished spans; a writer thread ships them to the relay child in batches."""

    def __init__(
        self,
        resource: Resource,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        schedule_delay_s: float | None = None,
        max_queue_size: int | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        self._resource_frame = _frame(
            FRAME_RESOURCE, (dict(resource.attributes), resource.schema_url or "")
        )
        self._command = list(command or [sys.executable, "-m", "shared.telemetry.relay"])
        self._env = dict(os.environ if env is None else env)
        self._delay_s = (
            schedule_delay_s
            if schedule_delay_s is not None
            else _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        )
        self._max_queue = max_queue_size or _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self._max_batch = min(
            max_batch_size or _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), self._max_queue
        )
        self._lock = threading.Lock()
        self._queue: list[ReadableSpan] = []
        self.dropped = 0
        self._wake = threading.Event()
        self._stopping = False
        self._flush_lock = threading.Lock()
        self._flush_requested: int | None = None
        self._flush_seq = 0
        self._child: subprocess.Popen[bytes] | None = None
        self._child_started = 0.0
        self._start_child()
        self._writer = threading.Thread(target=self._run, name="span-relay-writer", daemon=True)
        self._writer.start()

    # SpanProcessor ------------------------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled or self._stopping:
            return
        with self._lock:
            if len(self._queue) >= self._max_queue:
                self.dropped += 1
                return
            self._queue.append(span)
            full = len(self._queue) >= self._max_batch
        if full:
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Ship everything queued and wait until the child has exported it."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._flush_lock:
            self._flush_seq += 1
            seq = self._flush_seq
            self._flush_requested = seq
            self._wake.set()
            return self._await_ack(seq, deadline)

    def shutdown(self) -> None:
        # Bounded: a collector that is down must not hold a stopping service for long (the
        # exporter's own retries run in the child; what it has not sent by then is lost).
        self.force_flush(_SHUTDOWN_FLUSH_MS)
        self._stopping = True
        self._wake.set()
        self._writer.join(timeout=5)
        child, self._child = self._child, None
        if child is not None:
            _close_quietly(child.stdin)
            try:
                child.wait(timeout=_SHUTDOWN_FLUSH_MS / 1000)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
            _close_quietly(child.stdout)
        if self.dropped:
            logger.warning("span relay dropped %d span(s): queue full", self.dropped)

    # internals ----------------------------------------------------------------------------------

    def _start_child(self) -> None:
        self._child_started = time.monotonic()
        child = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._env,
            close_fds=True,
        )
        assert child.stdin is not None
        child.stdin.write(self._resource_frame)
        child.stdin.flush()
        self._child = child

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._ship()

    def _ship(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        flush = self._flush_requested
        frames = [
            _frame(FRAME_SPANS, [pack_span(s) for s in batch[i : i + self._max_batch]])
            for i in range(0, len(batch), self._max_batch)
        ]
        if flush is not None:
            frames.append(_frame(FRAME_FLUSH, flush))
        if not frames:
            return
        if not self._write(b"".join(frames)):
            self.dropped += len(batch)

    def _write(self, data: bytes) -> bool:
        child = self._child
        if child is None or child.poll() is not None:
            if time.monotonic() - self._child_started < _RESTART_BACKOFF_S:
                return False
            logger.warning("span relay exited (%s); starting a new one", _exit(child))
            if child is not None:
                _close_quietly(child.stdin)
                _close_quietly(child.stdout)
            try:
                self._start_child()
            except OSError as exc:
                logger.warning("span relay could not start: %s", exc)
                return False
            child = self._child
        assert child is not None and child.stdin is not None
        try:
            child.stdin.write(data)
            child.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            logger.warning("span relay pipe failed: %s", exc)
            return False
        return True

    def _await_ack(self, seq: int, deadline: float) -> bool:
        child = self._child
        if child is None or child.stdout is None:
            return False
        fd = child.stdout.fileno()
        buffer = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return False
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if any(line.strip() == str(seq).encode() for line in lines):
                self._flush_requested = None
                return True


def _exit(child: subprocess.Popen[bytes] | None) -> str:
    return "not started" if child is None else f"exit code {child.returncode}"


def _close_quietly(stream: IO[bytes] | None) -> None:
    if stream is None:
        return
    try:
        stream.close()
    except (OSError, ValueError):
        pass


# --- the child ----------------------------------------------------------------------------------


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve(stdin: IO[bytes], stdout: IO[bytes], exporter: Any) -> None:
    """Read frames until the pipe closes: spans go to `exporter`, a flush is acknowledged
    (its sequence number on a line) once everything before it was exported."""
    resource = Resource.get_empty()
    while True:
        header = _read_exact(stdin, _HEADER.size)
        if header is None:
            return
        (size,) = _HEADER.unpack(header)
        if size > _MAX_FRAME:
            logger.error("span relay: frame of %d bytes refused; stopping", size)
            return
        payload = _read_exact(stdin, size)
        if payload is None:
            return
        kind, body = marshal.loads(payload)
        if kind == FRAME_RESOURCE:
            attributes, schema_url = body
            resource = Resource(attributes, schema_url or None)
        elif kind == FRAME_SPANS:
            try:
                exporter.export([RelayedSpan(packed, resource) for packed in body])
            except Exception:  # an export failure must not stop the relay
                logger.exception("span relay: export failed")
        elif kind == FRAME_FLUSH:
            stdout.write(f"{body}\n".encode())
            stdout.flush()


def main() -> None:
    # The service's own shutdown closes the pipe; a Ctrl-C or SIGTERM sent to the whole
    # process group must not kill the relay before the service's last spans reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s span-relay %(message)s"
    )
    from shared.config import Settings
    from shared.telemetry.tracing import span_exporter

    exporter = span_exporter(Settings.from_env())
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer, exporter)
    finally:
        exporter.shutdown()


if __name__ == "__main__":
    main()
