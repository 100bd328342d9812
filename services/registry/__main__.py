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
from shared.server import ServiceBinding, install_stop_signals, mesh_auth
from shared.service_lifecycle import serve_service
from shared.service_main import service_main
from shared.telemetry.metrics import setup_metrics
from shared.telemetry.tracing import setup_tracing
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
    llm_clients = LlmClientCache(
        model_configs,
        timeout_s=settings.llm_timeout_s,
        deadline_s=settings.llm_deadline_s,
        max_retries=settings.llm_max_retries,
    )

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
        db_wait_s=settings.db_wait_s,
    )
    await asyncio.to_thread(core.seed_system_tools)
    await asyncio.to_thread(core.auto_register_handlers)
    servicer = RegistryServicer(core, max_input_bytes=settings.max_input_bytes, sessions=sessions)
    clients_box: list[MeshClients] = []

    async def on_bound(bound: int) -> None:
        # Composition re-enters the registry: an explicit address (e.g. a load balancer) wins,
        # otherwise this very process.
        self_address = os.environ.get("TOOLMESH_REGISTRY_ADDR") or f"{settings.host}:{bound}"
        clients = MeshClients({**settings.addresses, SERVICE: self_address})
        clients_box.append(clients)
        caller_box.append(GrpcToolCaller(clients.registry(), settings.tracing))
        llm_client.warm_up()  # a background import: readiness does not wait for it

    async def on_stop() -> None:
        core.close()
        for clients in clients_box:
            await clients.close()
        await llm_clients.aclose()
        engine.dispose()

    await serve_service(
        SERVICE,
        settings,
        port,
        ServiceBinding(
            registry_pb2_grpc.add_RegistryServiceServicer_to_server,
            servicer,
            registry_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name,
        ),
        stop=stop,
        on_stop=on_stop,
        on_bound=on_bound,
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


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
