"""Benchmark: one hop's unary call over the mesh's call stream (shared.mux: the transport of
every call between toolmesh services) against the same call as a plain grpc.aio unary RPC, to
the same server process, in the same run. Figures are ratios against the plain unary call.

    python -m bench.call_stream [--n 2000] [--duration 3] [--concurrency 64]

Both kinds are sampled in turns (bench.measure), so a change in the machine's load falls on
both. At one call in flight the stream saves the per-call HTTP/2 stream and its completion
events; with many in flight it also batches the calls that queue up while a message is written.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable

import grpc

from bench.measure import (
    machine_load,
    measure_interleaved,
    measure_throughput_interleaved,
    ratio_line,
)
from shared.mux import MuxChannel, MuxServicer
from toolmesh.mux.v1 import mux_pb2_grpc

SERVICE = "bench.Echo"
METHOD = f"/{SERVICE}/Echo"
UNARY = "plain unary"
STREAM = "call stream"
PAYLOAD = b"x" * 256


def _identity(data: bytes) -> bytes:
    return data


async def _serve() -> None:
    from shared.service_main import announce_ready

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(echo, _identity, _identity)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),)
    )
    mux_pb2_grpc.add_MuxServiceServicer_to_server(MuxServicer({METHOD: handler}), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    announce_ready("call_stream_echo", f"127.0.0.1:{port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def _caller(channel: grpc.aio.Channel) -> Callable[[], Awaitable[bytes]]:
    method = channel.unary_unary(METHOD, _identity, _identity)

    async def call() -> bytes:
        answer: bytes = await method(PAYLOAD, timeout=30)
        if answer != PAYLOAD:
            raise RuntimeError("wrong echo")
        return answer

    return call


async def _main(n: int, block: int, concurrency: int, duration_s: float) -> None:
    from shared.launcher import service_env, start_process

    server = start_process(
        "call_stream_echo", ["-m", "bench.call_stream", "--serve"], env=service_env()
    )
    try:
        plain = grpc.aio.insecure_channel(server.address)
        streamed = MuxChannel(grpc.aio.insecure_channel(server.address))
        try:
            calls = {UNARY: _caller(plain), STREAM: _caller(streamed)}
            latency = await measure_interleaved(calls, n, block)
            throughput = await measure_throughput_interleaved(calls, concurrency, duration_s)
        finally:
            await streamed.close()
            await plain.close()
    finally:
        server.stop()
    print(f"one hop, {len(PAYLOAD)}-byte echo: call stream vs plain unary (same server, in turns)")
    for name in (UNARY, STREAM):
        print(
            f"  {name + ':':13s} {latency[name]}; {throughput[name]:.0f} calls/s at {concurrency}"
        )
    print("  " + ratio_line("p50", latency[STREAM].p50_ms, latency[UNARY].p50_ms, "ms"))
    print("  " + ratio_line("p99", latency[STREAM].p99_ms, latency[UNARY].p99_ms, "ms"))
    print(
        "  "
        + ratio_line(f"throughput@{concurrency}", throughput[STREAM], throughput[UNARY], "calls/s")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the echo server (internal)")
    parser.add_argument("--n", type=int, default=2000, help="sequential calls for latency")
    parser.add_argument("--block", type=int, default=50, help="calls of one kind in a turn")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    with machine_load():
        asyncio.run(_main(args.n, args.block, args.concurrency, args.duration))


if __name__ == "__main__":
    main()
