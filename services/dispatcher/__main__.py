"""Entry point of the dispatcher service: `python -m services.dispatcher [--port N]`."""

from __future__ import annotations

import asyncio

from services.dispatcher.core import Dispatcher
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.servicer import DispatcherServicer, GrpcRegistryGateway
from services.dispatcher.statestore import SqlGuardrailStore
from shared.clients import MeshClients
from shared.config import Settings
from shared.db.engine import make_engine, session_factory
from shared.server import (
    ServiceBinding,
    create_server,
    install_stop_signals,
    serve_until_signalled,
)
from shared.service_main import announce_ready, service_main
from shared.telemetry.tracing import setup_tracing, shutdown_tracing
from toolmesh.dispatcher.v1 import dispatcher_pb2, dispatcher_pb2_grpc

SERVICE = "dispatcher"


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    setup_tracing(SERVICE, settings)
    engine = make_engine(settings.database_url)
    log = SqlCallLog(session_factory(engine))
    clients = MeshClients(dict(settings.addresses))
    core = Dispatcher(
        GrpcRegistryGateway(clients.registry(), settings.tracing),
        log,
        SqlGuardrailStore(engine),
        timeout_s=settings.tool_timeout_s,
        max_input_bytes=settings.max_input_bytes,
    )
    server, bound, health = await create_server(
        [
            ServiceBinding(
                dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server,
                DispatcherServicer(core, log),
                dispatcher_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name,
            )
        ],
        host=settings.host,
        port=port,
        tracing=settings.tracing,
    )
    announce_ready(SERVICE, f"{settings.host}:{bound}")

    async def on_stop() -> None:
        await core.close()
        await clients.close()
        await asyncio.to_thread(log.close)
        engine.dispose()
        shutdown_tracing()

    await serve_until_signalled(server, health, stop, grace_s=settings.grace_s, on_stop=on_stop)


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
