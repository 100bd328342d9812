"""Benchmark: an MCP tool through the mesh (client -> dispatcher -> registry -> mcp_bridge ->
MCP server over stdio, tracing on, durable log) against the same server called directly with the
MCP SDK, and against a raw 3-hop grpc.aio echo chain (every hop its own process), all measured in
one run. Figures are ratios within the run: absolute numbers on a shared machine are noise.

    make bench            # or: python -m bench.mcp_overhead [--n 300] [--duration 2]

The server is `@modelcontextprotocol/server-everything` (its `echo` tool) when node/npm are
available, else the repository's own raw stdio test server. Target: what the mesh adds over the
direct SDK call is at most 1.5x the raw 3-hop chain's p50.

The bridge hop on its own is measured too: McpBridgeService.CallTool called directly (one gRPC
hop, server-streaming, tracing on) against a raw 1-hop chain, so the bridge's share of the added
time can be told apart from the dispatcher's and the registry's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.echo_chain import ProcessEchoChain
from bench.measure import Call, LatencyStats, measure_latency, measure_throughput, ratio_line
from bench.span_counter import SpanCounter
from shared.db.engine import upgrade
from shared.launcher import ServiceProcess, service_env, start_service
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def server_command() -> tuple[list[str], str]:
    """(command line, label) of the MCP server to measure."""
    try:
        from tests.mcp_servers.install import NotInstallable, server_everything
    except ImportError:
        return [sys.executable, "-m", "tests.mcp_servers.raw_server"], "raw test server"
    try:
        return [*server_everything(), "stdio"], "server-everything"
    except NotInstallable:
        return [sys.executable, "-m", "tests.mcp_servers.raw_server"], "raw test server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(
    call: Call, n: int, duration: float, concurrency: int
) -> tuple[LatencyStats, float]:
    latency = await measure_latency(call, n=n, warmup=min(50, n))
    throughput = await measure_throughput(call, concurrency=concurrency, duration_s=duration)
    return latency, throughput


async def bench_direct(
    command: list[str], n: int, duration: float, concurrency: int
) -> tuple[LatencyStats, float]:
    from mcp import Client, StdioServerParameters

    counter = itertools.count()
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
    async with Client(params) as client:

        async def call() -> None:
            result = await client.call_tool("echo", {"message": f"m{next(counter)}"})
            if result.is_error:
                raise RuntimeError(str(result.content))

        return await measure(call, n, duration, concurrency)


def start_mesh(tmp: Path, collector_port: int) -> list[ServiceProcess]:
    url = f"sqlite:///{tmp}/toolmesh.db"
    upgrade(url)
    bridge_port = free_port()
    env = service_env(
        TOOLMESH_DATA_DIR=str(tmp),
        TOOLMESH_DATABASE_URL=url,
        TOOLMESH_TRACING="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector_port}",
        TOOLMESH_LOG_LEVEL="WARNING",
        TOOLMESH_MCP_BRIDGE_ADDR=f"127.0.0.1:{bridge_port}",
        PYTHONPATH=str(ROOT),
    )
    env.pop("TOOLMESH_REGISTRY_ADDR", None)
    processes: list[ServiceProcess] = []
    try:
        processes.append(start_service("registry", env=env, port=0))
        env["TOOLMESH_REGISTRY_ADDR"] = processes[0].address
        processes.append(start_service("dispatcher", env=env, port=0))
        processes.append(start_service("mcp_bridge", env=env, port=bridge_port))
    except BaseException:
        for proc in reversed(processes):
            proc.stop()
        raise
    return processes


@dataclass
class MeshFigures:
    """The mesh measured end to end (DispatchToolCall) and its bridge hop alone (CallTool)."""

    mesh: LatencyStats
    mesh_throughput: float
    bridge: LatencyStats


async def bench_mesh(
    command: list[str], collector_port: int, n: int, duration: float, concurrency: int
) -> MeshFigures:
    with tempfile.TemporaryDirectory(prefix="toolmesh-bench-mcp-") as tmp:
        registry, dispatcher, bridge = start_mesh(Path(tmp), collector_port)
        try:
            context = pb.CallContext(tenant_id="bench", conversation_id="bench")
            counter = itertools.count()
            async with grpc.aio.insecure_channel(bridge.address) as channel:
                bridge_stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel)
                await bridge_stub.Connect(
                    mpb.ConnectRequest(
                        server=mpb.ServerConfig(
                            name="bench",
                            transport=mpb.TRANSPORT_STDIO,
                            command=command[0],
                            args=command[1:],
                        )
                    ),
                    timeout=120,
                )

                async def call_bridge() -> None:
                    request = mpb.CallToolRequest(
                        connection="bench",
                        tool="echo",
                        arguments_json=f'{{"message": "m{next(counter)}"}}',
                        context=context,
                    )
                    messages = [m async for m in bridge_stub.CallTool(request)]
                    if not messages or messages[-1].result.error:
                        raise RuntimeError(f"CallTool failed: {messages}")

                bridge_lat = await measure_latency(call_bridge, n=n, warmup=min(50, n))
            async with grpc.aio.insecure_channel(dispatcher.address) as channel:
                stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)

                async def call() -> None:
                    # A distinct input per call: identical consecutive calls trip the loop guard.
                    request = dpb.DispatchToolCallRequest(
                        tool_use=pb.ToolUse(
                            name="mcp_bench_echo", input_json=f'{{"message": "m{next(counter)}"}}'
                        ),
                        context=context,
                    )
                    response = await stub.DispatchToolCall(request)
                    if response.result.error:
                        raise RuntimeError(response.result.error)

                mesh_lat, mesh_tp = await measure(call, n, duration, concurrency)
                return MeshFigures(mesh_lat, mesh_tp, bridge_lat)
        finally:
            for proc in (bridge, dispatcher, registry):
                proc.stop()


async def bench_raw(
    n: int, duration: float, concurrency: int, hops: int = 3
) -> tuple[LatencyStats, float | None]:
    """A raw chain of `hops` processes; throughput only when `duration` is positive."""
    chain = ProcessEchoChain(hops=hops)
    try:
        payload = b"x" * 64

        async def call() -> None:
            await chain.call(payload)

        if duration > 0:
            latency, throughput = await measure(call, n, duration, concurrency)
        else:
            latency, throughput = await measure_latency(call, n=n, warmup=min(50, n)), None
        await chain.close()
        return latency, throughput
    finally:
        chain.stop()


async def main_async(n: int, duration: float, concurrency: int) -> None:
    command, label = server_command()
    with SpanCounter() as sink:
        raw_lat, raw_tp = await bench_raw(n, duration, concurrency)
        hop_lat, _ = await bench_raw(n, 0, concurrency, hops=1)
        direct_lat, direct_tp = await bench_direct(command, n, duration, concurrency)
        figures = await bench_mesh(command, sink.port, n, duration, concurrency)
    mesh_lat, mesh_tp = figures.mesh, figures.mesh_throughput
    added = mesh_lat.p50_ms - direct_lat.p50_ms
    bridge_added = figures.bridge.p50_ms - direct_lat.p50_ms
    print(f"MCP `echo` of {label} over stdio: through the mesh vs the MCP SDK directly")
    print(f"  raw 3-hop grpc.aio chain: {raw_lat}; {raw_tp or 0:.0f} calls/s at {concurrency}")
    print(f"  direct SDK call:          {direct_lat}; {direct_tp:.0f} calls/s")
    print(f"  through the mesh:         {mesh_lat}; {mesh_tp:.0f} calls/s ({sink.count} spans)")
    print("  " + ratio_line("mesh p50 vs direct", mesh_lat.p50_ms, direct_lat.p50_ms, "ms"))
    print("  " + ratio_line("mesh p99 vs direct", mesh_lat.p99_ms, direct_lat.p99_ms, "ms"))
    print(
        "  "
        + ratio_line("added p50 vs raw 3-hop p50", added, raw_lat.p50_ms, "ms")
        + "   (target <= 1.5x)"
    )
    print("  " + ratio_line(f"throughput@{concurrency} vs direct", mesh_tp, direct_tp, "calls/s"))
    print("  the bridge hop alone (CallTool called directly, no dispatcher or registry):")
    print(f"    raw 1-hop grpc.aio chain: {hop_lat}")
    print(f"    CallTool:                 {figures.bridge}")
    print("    " + ratio_line("added p50 vs raw 1-hop p50", bridge_added, hop_lat.p50_ms, "ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=300, help="sequential calls for latency")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main_async(args.n, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
