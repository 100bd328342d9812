"""Benchmark: an MCP tool through the mesh (client -> dispatcher -> registry -> mcp_bridge ->
MCP server over stdio, tracing on, durable log) against the same server called directly with the
MCP SDK, and against a raw 3-hop grpc.aio echo chain (every hop its own process), all measured in
one run. Figures are ratios within the run: absolute numbers on a shared machine are noise.

    make bench            # or: python -m bench.mcp_overhead [--n 300] [--block 20]

The server is `@modelcontextprotocol/server-everything` (its `echo` tool) when node/npm are
available, else the repository's own raw stdio test server. Target: what the mesh adds over the
direct SDK call is at most 1.5x the raw 3-hop chain's p50.

Each hop's share is measured too, by calling each service directly: the bridge alone
(McpBridgeService.CallToolUnary, the RPC the registry uses when nobody listens for progress, and
the CallTool stream for comparison), the registry with the bridge (RegistryService.ExecuteTool)
and the whole mesh (DispatcherService.DispatchToolCall). A hop's added p50 is its figure minus
the one below it (the bridge's: minus the direct SDK call), compared with a raw 1-hop chain's.

Everything runs at once and the latencies are sampled in turns: `--block` sequential calls of
one kind (after a few unmeasured ones), then the next kind, the order reversed every round,
until each kind has `--n` calls.
On a shared machine the load moves more from one second to the next than from one kind of call
to the other, so every figure and every ratio sees the same load. Throughput (`--concurrency`
calls in flight for `--duration` seconds) is measured afterwards, in turns too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc

from bench.echo_chain import ProcessEchoChain
from bench.measure import (
    Call,
    machine_load,
    measure_interleaved,
    measure_throughput_interleaved,
    ratio_line,
)
from bench.span_counter import SpanCounter
from shared.db.engine import upgrade
from shared.launcher import ServiceProcess, service_env, start_service
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
# The kinds of call, in the order they are sampled.
RAW_3 = "raw 3-hop grpc.aio chain"
RAW_1 = "raw 1-hop grpc.aio chain"
DIRECT = "direct SDK call"
BRIDGE = "bridge (CallToolUnary)"
BRIDGE_STREAM = "bridge (CallTool stream)"
REGISTRY = "registry + bridge (ExecuteTool)"
MESH = "through the mesh"


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


@asynccontextmanager
async def running(command: list[str], collector_port: int) -> AsyncIterator[dict[str, Call]]:
    """Everything the benchmark calls, started, as a call per kind (see the constants)."""
    from mcp import Client, StdioServerParameters

    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolmesh-bench-mcp-")))
        processes = start_mesh(tmp, collector_port)
        stack.callback(lambda: [proc.stop() for proc in reversed(processes)])
        registry, dispatcher, bridge = processes
        chains = {}
        for hops in (3, 1):
            chain = ProcessEchoChain(hops=hops)
            stack.callback(chain.stop)
            stack.push_async_callback(chain.close)
            chains[hops] = chain
        params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
        client = await stack.enter_async_context(Client(params))
        channels = [
            await stack.enter_async_context(grpc.aio.insecure_channel(p.address))
            for p in (bridge, registry, dispatcher)
        ]
        bridge_stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channels[0])
        registry_stub = registry_pb2_grpc.RegistryServiceStub(channels[1])
        dispatcher_stub = dispatcher_pb2_grpc.DispatcherServiceStub(channels[2])
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
        context = pb.CallContext(tenant_id="bench", conversation_id="bench")
        counter = itertools.count()
        payload = b"x" * 64

        def arguments() -> str:
            # A distinct input per call: identical consecutive calls trip the loop guard.
            return f'{{"message": "m{next(counter)}"}}'

        async def raw_3() -> None:
            await chains[3].call(payload)

        async def raw_1() -> None:
            await chains[1].call(payload)

        async def direct() -> None:
            result = await client.call_tool("echo", {"message": f"m{next(counter)}"})
            if result.is_error:
                raise RuntimeError(str(result.content))

        async def call_bridge() -> None:
            request = mpb.CallToolUnaryRequest(
                connection="bench", tool="echo", arguments_json=arguments(), context=context
            )
            response = await bridge_stub.CallToolUnary(request)
            if response.result.error:
                raise RuntimeError(f"CallToolUnary failed: {response.result.error}")

        async def call_bridge_stream() -> None:
            request = mpb.CallToolRequest(
                connection="bench", tool="echo", arguments_json=arguments(), context=context
            )
            messages = [m async for m in bridge_stub.CallTool(request)]
            if not messages or messages[-1].result.error:
                raise RuntimeError(f"CallTool failed: {messages}")

        async def call_registry() -> None:
            request = rpb.ExecuteToolRequest(
                name="mcp_bench_echo", input_json=arguments(), context=context
            )
            response = await registry_stub.ExecuteTool(request)
            if response.result.error:
                raise RuntimeError(response.result.error)

        async def call_mesh() -> None:
            request = dpb.DispatchToolCallRequest(
                tool_use=pb.ToolUse(name="mcp_bench_echo", input_json=arguments()),
                context=context,
            )
            response = await dispatcher_stub.DispatchToolCall(request)
            if response.result.error:
                raise RuntimeError(response.result.error)

        yield {
            RAW_3: raw_3,
            RAW_1: raw_1,
            DIRECT: direct,
            BRIDGE: call_bridge,
            BRIDGE_STREAM: call_bridge_stream,
            REGISTRY: call_registry,
            MESH: call_mesh,
        }


async def main_async(n: int, block: int, duration: float, concurrency: int) -> None:
    command, label = server_command()
    with SpanCounter() as sink:
        async with running(command, sink.port) as calls:
            lat = await measure_interleaved(calls, n, block)
            throughput = await measure_throughput_interleaved(
                {name: calls[name] for name in (RAW_3, DIRECT, MESH)}, concurrency, duration
            )
    added = lat[MESH].p50_ms - lat[DIRECT].p50_ms
    raw_p50, hop_p50 = lat[RAW_3].p50_ms, lat[RAW_1].p50_ms
    print(f"MCP `echo` of {label} over stdio: through the mesh vs the MCP SDK directly")
    print(f"  (latency sampled in turns of {block} calls; {sink.count} spans exported)")
    for name in (RAW_3, DIRECT, MESH):
        print(f"  {name + ':':26}{lat[name]}; {throughput[name]:.0f} calls/s at {concurrency}")
    print("  " + ratio_line("mesh p50 vs direct", lat[MESH].p50_ms, lat[DIRECT].p50_ms, "ms"))
    print("  " + ratio_line("mesh p99 vs direct", lat[MESH].p99_ms, lat[DIRECT].p99_ms, "ms"))
    print(
        "  "
        + ratio_line("added p50 vs raw 3-hop p50", added, raw_p50, "ms")
        + "   (target <= 1.5x)"
    )
    print(
        "  "
        + ratio_line(
            f"throughput@{concurrency} vs direct", throughput[MESH], throughput[DIRECT], "calls/s"
        )
    )
    print("  each hop, its service called directly (added p50 = its p50 minus the one below it):")
    for name in (RAW_1, BRIDGE, BRIDGE_STREAM, REGISTRY):
        print(f"    {name + ':':33}{lat[name]}")
    hops = (
        ("dispatcher", lat[MESH].p50_ms - lat[REGISTRY].p50_ms),
        ("registry", lat[REGISTRY].p50_ms - lat[BRIDGE].p50_ms),
        ("bridge", lat[BRIDGE].p50_ms - lat[DIRECT].p50_ms),
        ("bridge over the stream", lat[BRIDGE_STREAM].p50_ms - lat[DIRECT].p50_ms),
    )
    for name, hop_added in hops:
        print("    " + ratio_line(f"{name} adds p50 vs raw 1-hop p50", hop_added, hop_p50, "ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=300, help="sequential calls for latency")
    parser.add_argument("--block", type=int, default=20, help="calls of one kind in a turn")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with machine_load():
        asyncio.run(main_async(args.n, args.block, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
