"""Entry point of the surface service: `python -m services.surface [--port N]`."""

from __future__ import annotations

import os

# One BLAS thread: a search embeds one short query, where thread hand-offs cost more than they
# save on a shared machine. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import asyncio
import contextlib
import logging

from services.surface.core import SurfaceCore
from services.surface.embedding import load_embedder
from services.surface.servicer import SurfaceServicer
from services.surface.store import SqlSurfaceStore
from shared.config import Settings
from shared.db.engine import make_engine, session_factory, upgrade
from shared.errors import ToolmeshError
from shared.llm.config import ModelConfigStore
from shared.server import ServiceBinding, install_stop_signals, mesh_auth
from shared.service_lifecycle import serve_service
from shared.service_main import service_main
from shared.telemetry.tracing import setup_tracing
from toolmesh.surface.v1 import surface_pb2, surface_pb2_grpc

SERVICE = "surface"
logger = logging.getLogger(__name__)


async def _rederive_periodically(core: SurfaceCore, interval_s: float) -> None:
    """Re-derive the Tier-0 floor every `interval_s` (0 turns it off)."""
    while interval_s > 0:
        await asyncio.sleep(interval_s)
        try:
            await core.derive_tier0()
        except ToolmeshError as exc:
            logger.warning("periodic tier0 derivation failed: %s", exc.message)
        except Exception:  # a bug must not end the periodic derivation
            logger.exception("periodic tier0 derivation failed unexpectedly; trying next time")


async def serve(settings: Settings, port: int) -> None:
    stop = install_stop_signals()
    setup_tracing(SERVICE, settings)
    await asyncio.to_thread(upgrade, settings.database_url)
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    models = ModelConfigStore(sessions)
    await asyncio.to_thread(models.seed_defaults)
    embedder = await asyncio.to_thread(load_embedder) if settings.surface_embeddings else None
    core = SurfaceCore(
        SqlSurfaceStore(sessions),
        models,
        embedder,
        catalog_ttl_s=settings.tool_cache_ttl_s,
        floor_ttl_s=settings.surface_floor_ttl_s,
        db_wait_s=settings.db_wait_s,
    )
    await core.catalog()  # loads the catalog and starts embedding tools that lack a vector
    rederiving: list[asyncio.Future[None]] = []

    async def on_bound(_port: int) -> None:
        rederiving.append(
            asyncio.ensure_future(_rederive_periodically(core, settings.surface_derive_interval_s))
        )

    async def on_stop() -> None:
        for rederive in rederiving:
            rederive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rederive
        await core.close()
        engine.dispose()

    await serve_service(
        SERVICE,
        settings,
        port,
        ServiceBinding(
            surface_pb2_grpc.add_SurfaceServiceServicer_to_server,
            SurfaceServicer(core),
            surface_pb2.DESCRIPTOR.services_by_name["SurfaceService"].full_name,
        ),
        stop=stop,
        on_stop=on_stop,
        on_bound=on_bound,
        # GetWorkingSet names no tenant, so it shows every tenant's working set: operators only.
        auth=mesh_auth(
            settings.api_keys_file,
            admin_methods=("DeriveTier0", "UpsertModelConfig", "GetWorkingSet"),
        ),
    )


def main() -> None:
    service_main(SERVICE, serve)


if __name__ == "__main__":
    main()
