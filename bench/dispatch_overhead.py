"""Benchmark: the internal `ping` tool through the mesh (client -> dispatcher -> registry ->
handler, tracing on, logging durable) against a raw 2-hop grpc.aio echo chain with the same
process layout (client -> hop -> hop), measured in one run. Every figure is printed as a ratio
against the baseline, because absolute numbers on a shared machine are noise.

    make bench            # or: python -m bench.dispatch_overhead [--n 2000] [--duration 3]

Targets (issue 2): p50 within 1.6x the raw chain; throughput at least 50% of it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
from pathlib import Path

import grpc

from bench.echo_chain import ProcessEchoChain
from bench.measure import Call, LatencyStats, measure_latency, measure_throughput, ratio_line
from bench.span_counter import SpanCounter
from shared.db.engine import upgrade
from shared.launcher import ServiceProcess, service_env, start_service
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb


async def measure(
    call: Call, n: int, duration: float, concurrency: int
) -> tuple[LatencyStats, float]:
    latency = await measure_latency(call, n=n, warmup=min(300, n))
    throughput = await measure_throughput(call, concurrency=concurrency, duration_s=duration)
    return latency, throughput


def start_mesh(tmp: Path, tracing: bool, collector_port: int) -> list[ServiceProcess]:
    url = f"sqlite:///{tmp}/toolmesh.db"
    upgrade(url)
    env = service_env(
        TOOLMESH_DATA_DIR=str(tmp),
        TOOLMESH_DATABASE_URL=url,
        TOOLMESH_TRACING="1" if tracing else "0",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector_port}" if tracing else "",
        TOOLMESH_LOG_LEVEL="WARNING",
    )
    env.pop("TOOLMESH_REGISTRY_ADDR", None)
    registry = start_service("registry", env=env, port=0)
    env["TOOLMESH_REGISTRY_ADDR"] = registry.address
    dispatcher = start_service("dispatcher", env=env, port=0)
    return [registry, dispatcher]


async def bench_mesh(
    tracing: bool, collector_port: int, n: int, duration: float, concurrency: int
) -> tuple[LatencyStats, float]:
    with tempfile.TemporaryDirectory(prefix="toolmesh-bench-") as tmp:
        processes = start_mesh(Path(tmp), tracing, collector_port)
        try:
            channel = grpc.aio.insecure_channel(processes[1].address)
            stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)
            context = pb.CallContext(tenant_id="bench", conversation_id="bench")
            counter = itertools.count()

            async def call() -> None:
                # A distinct input per call: identical consecutive calls trip the loop guard.
                request = dpb.DispatchToolCallRequest(
                    tool_use=pb.ToolUse(name="ping", input_json=f'{{"echo": {next(counter)}}}'),
                    context=context,
                )
                response = await stub.DispatchToolCall(request)
                if response.result.error:
                    raise RuntimeError(response.result.error)

            result = await measure(call, n, duration, concurrency)
            await channel.close()
            return result
        finally:
            for proc in reversed(processes):
                proc.stop()


async def bench_raw(n: int, duration: float, concurrency: int) -> tuple[LatencyStats, float]:
    chain = ProcessEchoChain(hops=2)
    try:
        payload = b"x" * 64

        async def call() -> None:
            await chain.call(payload)

        result = await measure(call, n, duration, concurrency)
        await chain.close()
        return result
    finally:
        chain.stop()


async def main_async(n: int, duration: float, concurrency: int) -> None:
    with SpanCounter() as sink:
        port = sink.port
        raw_lat, raw_tp = await bench_raw(n, duration, concurrency)
        mesh_lat, mesh_tp = await bench_mesh(True, port, n, duration, concurrency)
        off_lat, off_tp = await bench_mesh(False, port, n, duration, concurrency)
    print(
        "ping through dispatcher -> registry (tracing on, durable log) vs raw 2-hop grpc.aio echo"
    )
    print(f"  baseline raw chain: {raw_lat}; {raw_tp:.0f} calls/s at {concurrency} in flight")
    print(f"  mesh, tracing on:   {mesh_lat}; {mesh_tp:.0f} calls/s ({sink.count} spans exported)")
    print("  " + ratio_line("p50", mesh_lat.p50_ms, raw_lat.p50_ms, "ms") + "   (target <= 1.6x)")
    print("  " + ratio_line("p99", mesh_lat.p99_ms, raw_lat.p99_ms, "ms"))
    print(
        "  "
        + ratio_line(f"throughput@{concurrency}", mesh_tp, raw_tp, "calls/s")
        + "   (target >= 0.50x)"
    )
    print("  tracing overhead (mesh on vs mesh off):")
    print("  " + ratio_line("p50", mesh_lat.p50_ms, off_lat.p50_ms, "ms"))
    print("  " + ratio_line(f"throughput@{concurrency}", mesh_tp, off_tp, "calls/s"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="sequential calls for latency")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main_async(args.n, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
