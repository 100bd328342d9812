"""Entry point of the dispatcher service: `python -m services.dispatcher [--port N]`.

The dispatcher does not migrate the database (the registry, sandbox, mcp_bridge and surface do
on start, and `toolmesh db upgrade` does): started first on a fresh database, it waits, logging
why, until the schema is at this release's head, and only then serves."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from services.dispatcher.core import Dispatcher
from services.dispatcher.effects import ExportFiles, SqlEffectsStore
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.servicer import DispatcherServicer, GrpcRegistryGateway
from services.dispatcher.statestore import SqlGuardrailStore
from shared.auth import ApiKeys
from shared.clients import MeshClients
from shared.config import Settings
from shared.db.engine import alembic_config, first_line, make_engine, session_factory
from shared.db.inline import LoopConnection
from shared.server import (
    ServiceBinding,
    create_server,
    install_stop_signals,
    serve_until_signalled,
)
from shared.service_main import announce_ready, freeze_startup_heap, service_main
from shared.telemetry.metrics import setup_metrics, shutdown_metrics
from shared.telemetry.tracing import setup_tracing, shutdown_tracing
from shared.telemetry.usage import SqlUsageLog
from toolmesh.dispatcher.v1 import dispatcher_pb2, dispatcher_pb2_grpc

SERVICE = "dispatcher"
logger = logging.getLogger(__name__)

# While the schema is not there yet: how often it is checked, and how often the wait is logged.
SCHEMA_POLL_S = 1.0
SCHEMA_LOG_EVERY_S = 30.0


def schema_problem(engine: Engine) -> str | None:
    """Why the database is not ready for this release (None: its schema is at the head this
    code knows, or at a revision this code does not know — a newer release migrated it)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(alembic_config(engine.url.render_as_string(False)))
    heads = set(script.get_heads())
    try:
        with engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
    except (OperationalError, InterfaceError) as exc:
        return f"database unavailable: {first_line(exc)}"
    if current == heads:
        return None
    known = set()
    for revision in current:
        try:
            if script.get_revision(revision) is not None:
                known.add(revision)
        except CommandError:  # a revision of a newer release: not this code's to wait for
            pass
    if current and known != current:
        logger.warning(
            "the database schema is at %s, which this release does not know (a newer release "
            "migrated it); serving anyway",
            ", ".join(sorted(current)),
        )
        return None
    at = ", ".join(sorted(current)) if current else "no schema (a fresh database)"
    return f"schema at {at}, this release needs {', '.join(sorted(heads))}"


async def wait_for_schema(
    engine: Engine, stop: asyncio.Event, *, poll_s: float = SCHEMA_POLL_S
) -> bool:
    """Wait until the database is reachable and migrated to this release's head (the registry
    and the other services migrate it on start). Logs at once and every SCHEMA_LOG_EVERY_S
    while waiting. False when `stop` was set first."""
    if engine.url.get_backend_name() == "sqlite" and engine.url.database in (None, "", ":memory:"):
        return True  # a private in-memory database: no other process can migrate it
    logged_at: float | None = None
    while True:
        problem = await asyncio.to_thread(schema_problem, engine)
        if problem is None:
            if logged_at is not None:
                logger.info("database schema ready")
            return True
        now = time.monotonic()
        if logged_at is None or now - logged_at >= SCHEMA_LOG_EVERY_S:
            logger.warning(
                "waiting for the database schema (%s): the registry, sandbox, mcp_bridge and "
                "surface migrate it on start, or run `toolmesh db upgrade`; retrying every %gs",
                problem,
                poll_s,
            )
            logged_at = now
        try:
            await asyncio.wait_for(stop.wait(), timeout=poll_s)
            return False
        except TimeoutError:
            pass


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    setup_tracing(SERVICE, settings)
    setup_metrics(SERVICE, settings)
    engine = make_engine(settings.database_url)
    if not await wait_for_schema(engine, stop):
        engine.dispose()
        shutdown_tracing()
        shutdown_metrics()
        return
    sessions = session_factory(engine)
    loop_db = LoopConnection.for_engine(engine)  # the loop's reads and writes share its cache
    log = SqlCallLog(sessions, loop_db=loop_db)
    clients = MeshClients(dict(settings.addresses))
    effects_store = SqlEffectsStore(engine)
    core = Dispatcher(
        GrpcRegistryGateway(clients.registry(), settings.tracing),
        log,
        SqlGuardrailStore(engine, loop_db=loop_db),
        timeout_s=settings.tool_timeout_s,
        max_input_bytes=settings.max_input_bytes,
        usage=SqlUsageLog(sessions),
        conversation_budget_usd=settings.conversation_budget_usd,
        data_dir=settings.data_dir,
        effects_store=effects_store,
    )
    log.group_commits(core.coming_writes, settings.log_group_delay_ms / 1000)
    server, bound, health = await create_server(
        [
            ServiceBinding(
                dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server,
                DispatcherServicer(
                    core,
                    log,
                    ApiKeys.load(settings.api_keys_file) if settings.api_keys_file else None,
                    ExportFiles(effects_store, settings.data_dir),
                ),
                dispatcher_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name,
            )
        ],
        host=settings.host,
        port=port,
        tracing=settings.tracing,
        max_in_flight=settings.max_in_flight,
        trust_baggage=False,  # the mesh's edge: a client's baggage is dropped, never trusted
    )
    freeze_startup_heap()
    announce_ready(SERVICE, f"{settings.host}:{bound}")

    async def on_stop() -> None:
        await core.close()
        await clients.close()
        await asyncio.to_thread(log.close)
        if loop_db is not None:
            loop_db.close()
        engine.dispose()
        shutdown_tracing()
        shutdown_metrics()

    await serve_until_signalled(server, health, stop, grace_s=settings.grace_s, on_stop=on_stop)


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
