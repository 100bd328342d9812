"""Entry point of the dispatcher service: `python -m services.dispatcher [--port N]`."""

from __future__ import annotations

import asyncio

from services.dispatcher.core import Dispatcher
from services.dispatcher.effects import ExportFiles, SqlEffectsStore
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.retention import LogRetention, RetentionSweeper
from services.dispatcher.servicer import DispatcherServicer, GrpcRegistryGateway
from services.dispatcher.statestore import SqlGuardrailStore
from shared.auth import ApiKeys
from shared.clients import MeshClients
from shared.config import Settings
from shared.db.engine import make_engine, session_factory
from shared.db.inline import LoopConnection
from shared.server import ServiceBinding, install_stop_signals
from shared.service_lifecycle import serve_service
from shared.service_main import service_main
from shared.telemetry.metrics import setup_metrics
from shared.telemetry.tracing import setup_tracing
from shared.telemetry.usage import SqlUsageLog
from toolmesh.dispatcher.v1 import dispatcher_pb2, dispatcher_pb2_grpc

SERVICE = "dispatcher"


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    setup_tracing(SERVICE, settings)
    setup_metrics(SERVICE, settings)
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    loop_db = LoopConnection.for_engine(engine)  # the loop's reads and writes share its cache
    log = SqlCallLog(sessions, loop_db=loop_db, wait_s=settings.db_wait_s)
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
        db_wait_s=settings.db_wait_s,
        replay_window_s=settings.replay_window_s,
    )
    log.group_commits(core.coming_writes, settings.log_group_delay_ms / 1000)
    keys = ApiKeys.load(settings.api_keys_file) if settings.api_keys_file else None
    exports = ExportFiles(effects_store, settings.data_dir, db_wait_s=settings.db_wait_s)
    servicer = DispatcherServicer(core, log, keys, exports, db_wait_s=settings.db_wait_s)
    sweeper: RetentionSweeper | None = None
    if settings.retention_days > 0:
        sweeper = RetentionSweeper(
            LogRetention(engine, data_dir=settings.data_dir),
            settings.retention_days,
            settings.retention_interval_s,
        )
        sweeper.start()

    async def on_stop() -> None:
        if sweeper is not None:
            await asyncio.to_thread(sweeper.close)
        await core.close()
        await clients.close()
        await asyncio.to_thread(log.close)
        if loop_db is not None:
            loop_db.close()
        engine.dispose()

    await serve_service(
        SERVICE,
        settings,
        port,
        ServiceBinding(
            dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server,
            servicer,
            dispatcher_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name,
        ),
        stop=stop,
        on_stop=on_stop,
        stream_keys=keys,  # the servicer checks each call; a call stream opens with a key
        trust_baggage=False,  # the mesh's edge: a client's baggage is dropped, never trusted
    )


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
