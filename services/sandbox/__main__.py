"""Entry point of the sandbox service: `python -m services.sandbox [--port N]`.

The worker pool's zygote is started first — a fresh interpreter inside bubblewrap with a clean
environment — and only then the gRPC server, so no worker is ever forked from a process that
runs gRPC threads or holds the service's environment."""

from __future__ import annotations

import asyncio

from services.sandbox.core import LimitCaps, Sandbox
from services.sandbox.host import WorkerPool
from services.sandbox.pipeline import JobPipeline, JobWorkers
from services.sandbox.repository import SqlSandboxRepository
from services.sandbox.servicer import SandboxServicer
from shared.config import Settings
from shared.db.engine import make_engine, session_factory, upgrade
from shared.llm import client as llm_client
from shared.llm.client import LlmClientCache
from shared.llm.config import ModelConfigStore
from shared.server import ServiceBinding, install_stop_signals, mesh_auth
from shared.service_lifecycle import serve_service
from shared.service_main import service_main
from shared.telemetry.tracing import setup_tracing
from shared.telemetry.usage import SqlUsageLog
from toolmesh.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc

SERVICE = "sandbox"


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    pool = WorkerPool(
        size=settings.sandbox_pool_size,
        uid=settings.sandbox_uid,
        gid=settings.sandbox_gid,
        max_concurrent=settings.sandbox_max_concurrent,
        tenant_max_concurrent=settings.sandbox_tenant_max_concurrent,
        slot_wait_s=settings.sandbox_slot_wait_s,
        tmp_bytes=settings.sandbox_tmp_mb * 1024 * 1024,
    )
    await pool.start()  # before the gRPC server and its threads exist
    setup_tracing(SERVICE, settings)
    await asyncio.to_thread(upgrade, settings.database_url)
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    repo = SqlSandboxRepository(sessions)
    caps = LimitCaps(
        wall_seconds=settings.sandbox_wall_s,
        cpu_seconds=settings.sandbox_cpu_s,
        memory_bytes=settings.sandbox_memory_mb * 1024 * 1024,
        output_bytes=settings.sandbox_output_bytes,
        max_tool_calls=settings.sandbox_max_tool_calls,
    )
    core = Sandbox(pool, caps=caps)
    llm_clients = LlmClientCache(
        ModelConfigStore(sessions),
        timeout_s=settings.llm_timeout_s,
        deadline_s=settings.llm_deadline_s,
        max_retries=settings.llm_max_retries,
    )
    pipeline = JobPipeline(
        repo,
        core,
        llm_clients.for_role,
        lease_s=settings.sandbox_job_lease_s,
        max_attempts=settings.sandbox_job_max_attempts,
        usage=SqlUsageLog(sessions),
    )
    workers = JobWorkers(pipeline, count=settings.sandbox_job_workers)
    # Execute is the registry's (an admin key); the tool and job RPCs scope tenants in the
    # servicer itself, with the same keys.
    auth = mesh_auth(settings.api_keys_file, admin_methods=("Execute",), scoped=False)
    servicer = SandboxServicer(
        core,
        repo,
        registry_address=settings.address("registry"),
        tracing=settings.tracing,
        on_job_submitted=workers.wake,
        auth=auth.keys if auth is not None else None,
        db_wait_s=settings.db_wait_s,
    )

    async def on_bound(_port: int) -> None:
        workers.start()
        llm_client.warm_up()  # a background import: readiness does not wait for it

    async def on_stop() -> None:
        await workers.stop()
        await llm_clients.aclose()
        await pool.close()
        engine.dispose()

    await serve_service(
        SERVICE,
        settings,
        port,
        ServiceBinding(
            sandbox_pb2_grpc.add_SandboxServiceServicer_to_server,
            servicer,
            sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"].full_name,
        ),
        stop=stop,
        on_stop=on_stop,
        on_bound=on_bound,
        auth=auth,
    )


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
