"""Entry point of the MCP bridge: `python -m services.mcp_bridge [--port N]`."""

from __future__ import annotations

import asyncio
import logging

from services.mcp_bridge import sdk
from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.servicer import McpBridgeServicer
from services.mcp_bridge.sink import GrpcToolSink
from services.mcp_bridge.store import SqlConnectionStore
from shared.clients import MeshClients
from shared.config import Settings
from shared.db.engine import make_engine, session_factory, upgrade
from shared.errors import FailedPrecondition
from shared.server import ServiceBinding, install_stop_signals, mesh_auth
from shared.service_lifecycle import serve_service
from shared.service_main import service_main
from shared.telemetry.metrics import setup_metrics
from shared.telemetry.tracing import setup_tracing
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2, mcp_bridge_pb2_grpc

SERVICE = "mcp_bridge"
logger = logging.getLogger(__name__)


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    provider = setup_tracing(SERVICE, settings)
    if provider is not None:
        sdk.disable_sdk_tracer(provider)
    setup_metrics(SERVICE, settings)
    if not settings.address("registry"):
        raise FailedPrecondition("the MCP bridge needs the registry: set TOOLMESH_REGISTRY_ADDR")
    await asyncio.to_thread(upgrade, settings.database_url)
    engine = make_engine(settings.database_url)
    clients = MeshClients(dict(settings.addresses))
    core = McpBridge(
        SqlConnectionStore(session_factory(engine)),
        GrpcToolSink(clients.registry(), tracing=settings.tracing),
        connect_timeout_s=settings.mcp_connect_timeout_s,
        call_timeout_s=settings.mcp_call_timeout_s,
        backoff_s=settings.mcp_restart_backoff_s,
        backoff_max_s=settings.mcp_restart_backoff_max_s,
        hold_changed=settings.mcp_hold_changed,
        export_dir=settings.data_dir / "exports" / "mcp",
        export_max_bytes=settings.mcp_export_max_bytes,
        destructive_capability=settings.mcp_destructive_capability,
        db_wait_s=settings.db_wait_s,
    )

    async def on_bound(_port: int) -> None:
        restored = await core.restore()
        if restored:
            logger.info("re-establishing %d stored MCP connections: %s", len(restored), restored)

    async def on_stop() -> None:
        await core.stop()
        await clients.close()
        engine.dispose()

    await serve_service(
        SERVICE,
        settings,
        port,
        ServiceBinding(
            mcp_bridge_pb2_grpc.add_McpBridgeServiceServicer_to_server,
            McpBridgeServicer(core),
            mcp_bridge_pb2.DESCRIPTOR.services_by_name["McpBridgeService"].full_name,
        ),
        stop=stop,
        on_stop=on_stop,
        on_bound=on_bound,
        # Connections run commands and reach URLs: only the mesh's own (admin) keys.
        auth=mesh_auth(settings.api_keys_file, admin_methods=("*",)),
    )


def main() -> None:
    # asyncio's own loop, whatever TOOLMESH_EVENT_LOOP says: on uvloop, a stdio MCP server
    # started right after another was disconnected sometimes lost its pipes during initialize
    # (the SDK closes the old server's subprocess transport after its pipes; measured: 2 in 10
    # runs of 25 connect/disconnect cycles failed on uvloop, 0 in 10 on asyncio's loop).
    service_main(SERVICE, serve, event_loop="asyncio")


if __name__ == "__main__":
    main()
