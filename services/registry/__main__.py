"""Entry point of the registry service: `python -m services.registry [--port N]`."""

from __future__ import annotations

import asyncio
import os

from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.datasets import SqlDatasetStore
from services.registry.mcp_route import McpRoute
from services.registry.repository import SqlToolRepository
from services.registry.sandbox_route import SandboxRoute
from services.registry.servicer import GrpcToolCaller, RegistryServicer
from shared.clients import MeshClients
from shared.config import Settings
from shared.db.engine import make_engine, session_factory, upgrade
from shared.llm import client as llm_client
from shared.llm.client import LlmClientCache
from shared.llm.config import ModelConfigStore
from shared.server import (
    ServiceBinding,
    create_server,
    install_stop_signals,
    mesh_auth,
    serve_until_signalled,
)
from shared.service_main import announce_ready, freeze_startup_heap, service_main
from shared.telemetry.metrics import setup_metrics, shutdown_metrics
from shared.telemetry.tracing import setup_tracing, shutdown_tracing
from shared.telemetry.usage import SqlUsageLog
from toolmesh.registry.v1 import registry_pb2, registry_pb2_grpc

SERVICE = "registry"


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    setup_tracing(SERVICE, settings)
    setup_metrics(SERVICE, settings)
    await asyncio.to_thread(upgrade, settings.database_url)
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    repo = SqlToolRepository(sessions)
    datasets = SqlDatasetStore(sessions)
    loop = asyncio.get_running_loop()
    caller_box: list[GrpcToolCaller] = []

    usage = SqlUsageLog(sessions)
    model_configs = ModelConfigStore(sessions)
    await asyncio.to_thread(model_configs.seed_defaults)
    llm_clients = LlmClientCache(model_configs)

    def context_defaults(ctx: ToolContext) -> None:
        ctx.settings = settings
        ctx.datasets = datasets
        ctx.caller = caller_box[0] if caller_box else None
        ctx.loop = loop
        ctx.usage = usage
        ctx.sessions = sessions
        ctx.llm_clients = llm_clients.for_role

    core = Registry(
        repo,
        context_defaults=context_defaults,
        routes={
            "custom": SandboxRoute(settings.address("sandbox"), tracing=settings.tracing)
            if settings.address("sandbox")
            else None,
            "mcp": McpRoute(
                settings.address("mcp_bridge"),
                tracing=settings.tracing,
                default_timeout_s=settings.mcp_call_timeout_s,
            )
            if settings.address("mcp_bridge")
            else None,
        },
        cache_ttl_s=settings.tool_cache_ttl_s,
        max_depth=settings.max_depth,
        handler_threads=settings.handler_threads,
        disabled_flags=settings.disabled_flags,
        trace_payloads=settings.trace_payloads,
    )
    await asyncio.to_thread(core.seed_system_tools)
    await asyncio.to_thread(core.auto_register_handlers)
    servicer = RegistryServicer(core, max_input_bytes=settings.max_input_bytes, sessions=sessions)
    server, bound, health = await create_server(
        [
            ServiceBinding(
                registry_pb2_grpc.add_RegistryServiceServicer_to_server,
                servicer,
                registry_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name,
            )
        ],
        host=settings.host,
        port=port,
        tracing=settings.tracing,
        max_in_flight=settings.max_in_flight,
        auth=mesh_auth(
            settings.api_keys_file,
            # ExecuteTool(Stream) too: a tool call from outside the mesh goes through the
            # dispatcher, whose policy rules, rate limits, budgets and log it would bypass.
            admin_methods=(
                "SeedSystemTools",
                "UpsertTools",
                "DeleteTools",
                "SetToolStatus",
                "ExecuteTool",
                "ExecuteToolStream",
            ),
        ),
    )
    # Composition re-enters the registry: an explicit address (e.g. a load balancer) wins,
    # otherwise this very process.
    self_address = os.environ.get("TOOLMESH_REGISTRY_ADDR") or f"{settings.host}:{bound}"
    clients = MeshClients({**settings.addresses, SERVICE: self_address})
    caller_box.append(GrpcToolCaller(clients.registry(), settings.tracing))
    freeze_startup_heap()
    announce_ready(SERVICE, f"{settings.host}:{bound}")
    llm_client.warm_up()

    async def on_stop() -> None:
        core.close()
        await clients.close()
        await llm_clients.aclose()
        engine.dispose()
        shutdown_tracing()
        shutdown_metrics()

    await serve_until_signalled(server, health, stop, grace_s=settings.grace_s, on_stop=on_stop)


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
