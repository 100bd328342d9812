"""The raw grpc.aio baseline for benchmarks: a chain of plain servers on 127.0.0.1, no
interceptors, no generated code. Hop i forwards the request bytes to hop i+1 over one shared
channel; the last hop echoes. A benchmark of the mesh divides its figures by this chain's.

    python -m bench.echo_chain [--hops 2]   # prints p50/p99/throughput of the chain
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench.measure import measure_latency, measure_throughput

logger = logging.getLogger(__name__)

SERVICE = "toolmesh.bench.Echo"
METHOD = f"/{SERVICE}/Call"
_HOST = "127.0.0.1"
_STOP_GRACE_S = 1.0


def _identity(data: bytes) -> bytes:
    return data


class _Forwarder:
    """Hop handler: pass the request to the next hop, or echo it at the end of the chain."""

    def __init__(self, next_call: Any | None) -> None:
        self._next_call = next_call

    # A method, not __call__: grpc.aio only awaits handlers that are coroutine functions.
    async def handle(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if self._next_call is None:
            return request
        response: bytes = await self._next_call(request)
        return response


def _unary_bytes(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        METHOD, request_serializer=_identity, response_deserializer=_identity
    )


@dataclass
class EchoChain:
    """A running chain: `address` is the first hop; `call` goes through every hop."""

    address: str
    _servers: list[grpc.aio.Server] = field(default_factory=list, repr=False)
    _channels: list[grpc.aio.Channel] = field(default_factory=list, repr=False)
    _client_call: Any = field(default=None, repr=False)

    async def call(self, payload: bytes) -> bytes:
        response: bytes = await self._client_call(payload)
        return response

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await asyncio.gather(*(server.stop(_STOP_GRACE_S) for server in self._servers))
        self._servers.clear()


async def _start_hop(next_call: Any | None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.unary_unary_rpc_method_handler(
        _Forwarder(next_call).handle, request_deserializer=_identity, response_serializer=_identity
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Call": handler}),)
    )
    port: int = server.add_insecure_port(f"{_HOST}:0")
    await server.start()
    return server, port


async def start_echo_chain(hops: int) -> EchoChain:
    """Start `hops` servers, last one first, each holding one channel to the next."""
    if hops < 1:
        raise ValueError("an echo chain needs at least one hop")
    chain = EchoChain(address="")
    try:
        next_call: Any | None = None
        for _ in range(hops):
            server, port = await _start_hop(next_call)
            chain._servers.append(server)
            chain.address = f"{_HOST}:{port}"
            channel = grpc.aio.insecure_channel(chain.address)
            chain._channels.append(channel)
            next_call = _unary_bytes(channel)
        # The channel to the first hop is the shared client channel.
        chain._client_call = next_call
        await asyncio.wait_for(chain._channels[-1].channel_ready(), timeout=5)
    except BaseException:
        await chain.stop()
        raise
    logger.debug("echo chain of %d hop(s) at %s", hops, chain.address)
    return chain


async def _main(hops: int, n: int, warmup: int, concurrency: int, duration_s: float) -> None:
    chain = await start_echo_chain(hops)
    try:
        payload = b"x" * 256

        async def one_call() -> bytes:
            return await chain.call(payload)

        assert await one_call() == payload
        latency = await measure_latency(one_call, n=n, warmup=warmup)
        throughput = await measure_throughput(
            one_call, concurrency=concurrency, duration_s=duration_s
        )
    finally:
        await chain.stop()
    print(f"echo chain, {hops} hop(s), 256-byte payload, loopback")
    print(f"  latency    p50 {latency.p50_ms:.3f} ms  p99 {latency.p99_ms:.3f} ms  (n={n})")
    print(f"  throughput {throughput:.0f} calls/s at concurrency {concurrency}")


async def _serve_hop(next_address: str) -> None:
    """One hop in its own process (for a baseline with the mesh's process layout): forwards to
    `next_address`, or echoes when it is empty; announces readiness like a mesh service."""
    import signal

    from shared.service_main import announce_ready

    channel = grpc.aio.insecure_channel(next_address) if next_address else None
    server, port = await _start_hop(_unary_bytes(channel) if channel is not None else None)
    announce_ready("echo_hop", f"{_HOST}:{port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(_STOP_GRACE_S)
    if channel is not None:
        await channel.close()


class ProcessEchoChain:
    """An echo chain whose every hop is a separate process, like the mesh's services."""

    def __init__(self, hops: int) -> None:
        from shared.launcher import ServiceProcess, service_env, start_process

        self.processes: list[ServiceProcess] = []
        next_address = ""
        try:
            for _ in range(hops):
                proc = start_process(
                    "echo_hop",
                    ["-m", "bench.echo_chain", "--serve-hop", "--next", next_address],
                    env=service_env(),
                )
                self.processes.append(proc)
                next_address = proc.address
        except BaseException:
            self.stop()
            raise
        self.address = next_address
        self._channel = grpc.aio.insecure_channel(self.address)
        self._call = _unary_bytes(self._channel)

    async def call(self, payload: bytes) -> bytes:
        response: bytes = await self._call(payload)
        return response

    async def close(self) -> None:
        await self._channel.close()

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve-hop", action="store_true", help="run one hop (internal)")
    parser.add_argument("--next", default="", help="with --serve-hop: the next hop's address")
    parser.add_argument("--hops", type=int, default=2)
    parser.add_argument("--n", type=int, default=2000, help="sequential calls for latency")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=2.0, help="throughput seconds")
    args = parser.parse_args()
    if args.serve_hop:
        asyncio.run(_serve_hop(args.next))
        return
    asyncio.run(_main(args.hops, args.n, args.warmup, args.concurrency, args.duration))


if __name__ == "__main__":
    main()
