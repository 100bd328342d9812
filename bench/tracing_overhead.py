"""Benchmark: the cost of tracing a tool call. The internal `ping` tool through the mesh
(client -> dispatcher -> registry -> handler) with tracing off, with every call sampled (spans
on both services, W3C trace context + baggage on the hop, OTLP export to a real receiver), and
with 10% of traces sampled (OTEL_TRACES_SAMPLER=parentbased_traceidratio). Configurations are
interleaved over rounds and each figure is the median over rounds, printed as a ratio against
tracing off measured in the same run.

    make bench            # or: python -m bench.tracing_overhead [--rounds 2] [--n 1500]

Target (issue 7): sampled p50 within 1.2x of tracing off.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
from pathlib import Path

import grpc

from bench.dispatch_overhead import measure
from bench.measure import LatencyStats, ratio_line
from bench.span_counter import SpanCounter
from shared.db.engine import upgrade
from shared.launcher import ServiceProcess, service_env, start_service
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

CONFIGS: dict[str, dict[str, str]] = {
    "off": {"TOOLMESH_TRACING": "0"},
    "sampled": {"TOOLMESH_TRACING": "1"},
    "10% sampled": {
        "TOOLMESH_TRACING": "1",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}


def start_mesh(tmp: Path, extra: dict[str, str], collector_port: int) -> list[ServiceProcess]:
    url = f"sqlite:///{tmp}/toolmesh.db"
    upgrade(url)
    tracing = extra.get("TOOLMESH_TRACING") == "1"
    env = service_env(
        TOOLMESH_DATA_DIR=str(tmp),
        TOOLMESH_DATABASE_URL=url,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector_port}" if tracing else "",
        TOOLMESH_LOG_LEVEL="WARNING",
    )
    env.update(extra)
    env.pop("TOOLMESH_REGISTRY_ADDR", None)
    registry = start_service("registry", env=env, port=0)
    env["TOOLMESH_REGISTRY_ADDR"] = registry.address
    return [registry, start_service("dispatcher", env=env, port=0)]


async def bench_config(
    extra: dict[str, str], port: int, n: int, duration: float, concurrency: int
) -> tuple[LatencyStats, float]:
    with tempfile.TemporaryDirectory(prefix="toolmesh-bench-") as tmp:
        processes = start_mesh(Path(tmp), extra, port)
        try:
            channel = grpc.aio.insecure_channel(processes[1].address)
            stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)
            context = pb.CallContext(tenant_id="bench", conversation_id="bench")
            counter = itertools.count()

            async def call() -> None:
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


async def main_async(rounds: int, n: int, duration: float, concurrency: int) -> None:
    p50: dict[str, list[float]] = {name: [] for name in CONFIGS}
    p99: dict[str, list[float]] = {name: [] for name in CONFIGS}
    tput: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with SpanCounter() as sink:
        for _ in range(rounds):
            for name, extra in CONFIGS.items():
                lat, tp = await bench_config(extra, sink.port, n, duration, concurrency)
                p50[name].append(lat.p50_ms)
                p99[name].append(lat.p99_ms)
                tput[name].append(tp)
    med = statistics.median
    print(f"tracing overhead: ping through dispatcher -> registry, median of {rounds} round(s)")
    print(
        f"  baseline, tracing off: p50 {med(p50['off']):.2f} ms, p99 {med(p99['off']):.2f} ms, "
        f"{med(tput['off']):.0f} calls/s at {concurrency} in flight"
    )
    for name in ("sampled", "10% sampled"):
        target = "   (target <= 1.2x)" if name == "sampled" else ""
        print(f"  {name}:")
        print("    " + ratio_line("p50", med(p50[name]), med(p50["off"]), "ms") + target)
        print("    " + ratio_line("p99", med(p99[name]), med(p99["off"]), "ms"))
        print(
            "    "
            + ratio_line(f"throughput@{concurrency}", med(tput[name]), med(tput["off"]), "calls/s")
        )
    print(f"  ({sink.count} spans exported to the OTLP receiver)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=1500, help="sequential calls for latency")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main_async(args.rounds, args.n, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
