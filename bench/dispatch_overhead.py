"""Benchmark: the internal `ping` tool through the mesh (client -> dispatcher -> registry ->
handler, logging durable) against a raw 2-hop grpc.aio echo chain with the same process layout
(client -> hop -> hop), with tracing on and, for its overhead, off. Every figure is printed as a
ratio against the baseline, because absolute numbers on a shared machine are noise.

    make bench            # or: python -m bench.dispatch_overhead [--n 2000] [--duration 3]

The chain and both meshes run at once and are measured in turns (bench.measure): latency in
turns of `--block` sequential calls, throughput in windows of `--concurrency` calls in flight,
the order of the kinds reversed every round. Measured one after the other, a change in the
machine's load between the runs moved the ratios by up to a third here.

Targets (issue 2): p50 within 1.6x the raw chain; throughput at least 50% of it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator, Mapping
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
from toolmesh.type.v1 import types_pb2 as pb

RAW = "raw 2-hop chain"
MESH_ON = "mesh, tracing on"
MESH_OFF = "mesh, tracing off"
# The tracing-on mesh called as an agent back end does: every call named by its tool_use id (a
# retry would be answered from the log: the snapshot looks for an answer, the response is kept).
MESH_NAMED = "mesh, named calls"


def start_mesh(
    tmp: Path, tracing: bool, collector_port: int, extra: Mapping[str, str] | None = None
) -> list[ServiceProcess]:
    """Registry, then dispatcher (pointed at it), on a fresh SQLite database in `tmp`; `extra`
    is added to their environment."""
    url = f"sqlite:///{tmp}/toolmesh.db"
    upgrade(url)
    env = service_env(
        TOOLMESH_DATA_DIR=str(tmp),
        TOOLMESH_DATABASE_URL=url,
        TOOLMESH_TRACING="1" if tracing else "0",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector_port}" if tracing else "",
        TOOLMESH_LOG_LEVEL="WARNING",
    )
    env.update(extra or {})
    env.pop("TOOLMESH_REGISTRY_ADDR", None)
    registry = start_service("registry", env=env, port=0)
    env["TOOLMESH_REGISTRY_ADDR"] = registry.address
    try:
        return [registry, start_service("dispatcher", env=env, port=0)]
    except BaseException:
        registry.stop()
        raise


def ping_call(stub: dispatcher_pb2_grpc.DispatcherServiceStub, *, named: bool = False) -> Call:
    """`ping` through the dispatcher; `named`: with a tool_use id of the client's, as the
    Messages API gives (a call in a conversation of its own, so the two kinds do not meet)."""
    context = pb.CallContext(tenant_id="bench", conversation_id="named" if named else "bench")
    counter = itertools.count()

    async def call() -> None:
        # A distinct input per call: identical consecutive calls trip the loop guard.
        n = next(counter)
        request = dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(
                id=f"toolu_bench_{n:024x}" if named else "",
                name="ping",
                input_json=f'{{"echo": {n}}}',
            ),
            context=context,
        )
        response = await stub.DispatchToolCall(request)
        if response.result.error or response.replayed:
            raise RuntimeError(response.result.error or "a fresh call was replayed")

    return call


async def start_ping(
    stack: AsyncExitStack,
    tracing: bool,
    collector_port: int,
    extra: Mapping[str, str] | None = None,
) -> dispatcher_pb2_grpc.DispatcherServiceStub:
    """A mesh started on `stack` (stopped when it closes), as a stub of its dispatcher."""
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="toolmesh-bench-"))
    processes = start_mesh(Path(tmp), tracing, collector_port, extra)

    def stop() -> None:
        for process in reversed(processes):
            process.stop()

    stack.callback(stop)
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(processes[1].address))
    return dispatcher_pb2_grpc.DispatcherServiceStub(channel)


@asynccontextmanager
async def running(collector_port: int) -> AsyncIterator[dict[str, Call]]:
    """The raw chain and two meshes (tracing on, tracing off), all started, as a call each
    (the tracing-on mesh twice: with generated and with named tool_use ids)."""
    async with AsyncExitStack() as stack:
        chain = ProcessEchoChain(hops=2)
        stack.callback(chain.stop)
        stack.push_async_callback(chain.close)
        payload = b"x" * 64

        async def raw() -> None:
            await chain.call(payload)

        traced = await start_ping(stack, True, collector_port)
        yield {
            RAW: raw,
            MESH_ON: ping_call(traced),
            MESH_OFF: ping_call(await start_ping(stack, False, collector_port)),
            MESH_NAMED: ping_call(traced, named=True),
        }


async def main_async(n: int, block: int, duration: float, concurrency: int) -> None:
    with SpanCounter() as sink:
        async with running(sink.port) as calls:
            lat = await measure_interleaved(calls, n, block, warmup=300)
            tp = await measure_throughput_interleaved(calls, concurrency, duration)
    on, raw = lat[MESH_ON], lat[RAW]
    print(
        "ping through dispatcher -> registry (durable log) vs raw 2-hop grpc.aio echo "
        f"(latency in turns of {block} calls)"
    )
    print(f"  baseline raw chain: {raw}; {tp[RAW]:.0f} calls/s at {concurrency} in flight")
    print(f"  mesh, tracing on:   {on}; {tp[MESH_ON]:.0f} calls/s ({sink.count} spans exported)")
    print(f"  mesh, tracing off:  {lat[MESH_OFF]}; {tp[MESH_OFF]:.0f} calls/s")
    print("  " + ratio_line("p50", on.p50_ms, raw.p50_ms, "ms") + "   (target <= 1.6x)")
    print("  " + ratio_line("p99", on.p99_ms, raw.p99_ms, "ms"))
    print(
        "  "
        + ratio_line(f"throughput@{concurrency}", tp[MESH_ON], tp[RAW], "calls/s")
        + "   (target >= 0.50x)"
    )
    print("  tracing overhead (mesh on vs mesh off):")
    print("  " + ratio_line("p50", on.p50_ms, lat[MESH_OFF].p50_ms, "ms"))
    print("  " + ratio_line(f"throughput@{concurrency}", tp[MESH_ON], tp[MESH_OFF], "calls/s"))
    print(
        "  named calls (tool_use ids of the client's: a retry is answered from the log) vs "
        "generated ids:"
    )
    print("  " + ratio_line("p50", lat[MESH_NAMED].p50_ms, on.p50_ms, "ms"))
    print("  " + ratio_line(f"throughput@{concurrency}", tp[MESH_NAMED], tp[MESH_ON], "calls/s"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="sequential calls for latency")
    parser.add_argument("--block", type=int, default=50, help="calls of one kind in a turn")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with machine_load():
        asyncio.run(main_async(args.n, args.block, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
