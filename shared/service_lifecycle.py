"""A service's life after its domain core is built, the same for every service: its gRPC server
started on the configured host (health, reflection, the handler wrapper, the in-flight limit),
readiness announced, served until signalled, drained, and its telemetry flushed last."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shared.auth import ApiKeys
from shared.config import Settings
from shared.server import MeshAuth, ServiceBinding, create_server, serve_until_signalled
from shared.service_main import announce_ready, freeze_startup_heap
from shared.telemetry.metrics import shutdown_metrics
from shared.telemetry.tracing import shutdown_tracing


async def serve_service(
    service: str,
    settings: Settings,
    port: int,
    binding: ServiceBinding,
    *,
    stop: asyncio.Event,
    on_stop: Callable[[], Awaitable[None]],
    auth: MeshAuth | None = None,
    stream_keys: ApiKeys | None = None,
    trust_baggage: bool = True,
    on_bound: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Serve `binding` on `settings.host:port` until `stop` is set (see
    shared.server.install_stop_signals). `on_bound(port)` runs once the server listens and
    before readiness is announced (work that needs the bound port, or that must not delay
    binding). `auth` checks every call's key; a service that checks them itself passes its
    `stream_keys` (see shared.server.create_server). After the drain, `on_stop` releases the
    service's own resources; tracing and metrics are flushed after it, so spans it ends are
    exported too."""
    server, bound, health = await create_server(
        [binding],
        host=settings.host,
        port=port,
        tracing=settings.tracing,
        max_in_flight=settings.max_in_flight,
        trust_baggage=trust_baggage,
        auth=auth,
        stream_keys=stream_keys,
    )
    if on_bound is not None:
        await on_bound(bound)
    freeze_startup_heap()
    announce_ready(service, f"{settings.host}:{bound}")

    async def stop_all() -> None:
        try:
            await on_stop()
        finally:
            shutdown_tracing()
            shutdown_metrics()

    await serve_until_signalled(server, health, stop, grace_s=settings.grace_s, on_stop=stop_all)
