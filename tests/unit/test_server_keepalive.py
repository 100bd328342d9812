"""Clients' keepalive pings are welcome: a client pinging as often as the server allows, with or
without calls in flight, keeps its connection and its idle streams. With gRPC's server defaults
such a client got GOAWAY too_many_pings after its third ping without data (the mesh's own
channels did, after two idle minutes of their call streams)."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.server import create_server, keepalive_options

PING_S = 1.0


async def test_frequent_keepalive_pings_keep_an_idle_stream_and_the_connection() -> None:
    server, port, _ = await create_server(
        [], host="127.0.0.1", port=0, tracing=False, min_ping_interval_s=PING_S
    )
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.keepalive_time_ms", int(PING_S * 1000 * 1.2)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await asyncio.wait_for(watch.read(), 10)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        # Five or so pings with no data on the connection: well past the two strikes.
        pending = asyncio.ensure_future(watch.read())
        done, _ = await asyncio.wait({pending}, timeout=PING_S * 1.2 * 5 + 1)
        assert not done, f"the idle stream ended: {pending.result() if done else ''}"
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        pending.cancel()
        watch.cancel()
    finally:
        await channel.close()
        await server.stop(None)


def test_the_server_pings_idle_clients_and_accepts_pings_without_calls() -> None:
    options = dict(keepalive_options(10.0))
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert 0 < options["grpc.keepalive_timeout_ms"] < options["grpc.keepalive_time_ms"]
