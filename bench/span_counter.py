"""An OTLP receiver for benchmarks, in its own process: it accepts trace and metric exports
like a collector and only counts the spans, without turning them into Python objects.

The collector is not part of the system under test. Run inside the benchmark's own process (as
the test suite's in-memory collector is), decoding every span would take the client's CPU and
GIL and be charged to the mesh's latency; a real deployment exports to a collector elsewhere.

    with SpanCounter() as counter:      # counter.endpoint -> OTEL_EXPORTER_OTLP_ENDPOINT
        ...
    counter.count                       # spans received, read when the process stopped
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

_NAME = "span_counter"
_COUNT_EVENT = "span_count"
_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.count = 0

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.count += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return metrics_service_pb2.ExportMetricsServiceResponse()


async def _serve() -> None:
    from shared.service_main import announce_ready

    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]
    )
    traces = _Traces()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(traces, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    announce_ready(_NAME, f"127.0.0.1:{port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    sys.stdout.write(json.dumps({"event": _COUNT_EVENT, "count": traces.count}) + "\n")
    sys.stdout.flush()


class SpanCounter:
    """The counting receiver as a child process (a context manager)."""

    def __init__(self) -> None:
        self.count = 0
        self.endpoint = ""
        self.port = 0
        self._process: Any = None

    def __enter__(self) -> SpanCounter:
        from shared.launcher import service_env, start_process

        self._process = start_process(
            _NAME, ["-m", "bench.span_counter", "--serve"], env=service_env()
        )
        self.endpoint = self._process.address
        self.port = int(self.endpoint.rpartition(":")[2])
        return self

    def __exit__(self, *exc_info: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.stop()
        if process.pump is not None:
            process.pump.join(timeout=5)
        for line in process.output:
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == _COUNT_EVENT:
                    self.count = int(event["count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the receiver (internal)")
    args = parser.parse_args()
    if not args.serve:
        parser.error("run by the benchmarks: SpanCounter() starts it")
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
