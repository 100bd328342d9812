"""The MCP bridge core against real MCP servers over stdio, registering into the registry's own
SqlToolRepository (the tables the registry service uses), without gRPC."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.model import ServerConfig, StoredTool, ToolRegistration
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from shared.db.engine import make_engine, session_factory
from tests.conftest import fresh_database_url

RAW_SERVER = ["-m", "tests.mcp_servers.raw_server"]


class RepositorySink:
    """ToolSink straight into the registry's repository (the service goes through its RPCs),
    upserting as GrpcToolSink does: as an MCP listing, merged into the stored rows."""

    def __init__(self, repo: SqlToolRepository) -> None:
        self.repo = repo

    @staticmethod
    def _stored(t: ToolDef) -> StoredTool:
        return StoredTool(
            name=t.name,
            created_by=t.created_by,
            status=t.status,
            implementation=t.implementation,
            definition_hash=t.definition_hash,
            deleted=t.deleted_at is not None,
            enabled=t.enabled,
        )

    async def connection_tools(self, created_by: str) -> list[StoredTool]:
        rows = await asyncio.to_thread(
            self.repo.find, created_by=created_by, tool_type="mcp", include_deleted=True
        )
        return [self._stored(t) for t in rows]

    async def live_tools(self) -> list[StoredTool]:
        return [self._stored(t) for t in await asyncio.to_thread(self.repo.find)]

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        defs = [
            ToolDef(
                name=t.name,
                description=t.description,
                input_schema=t.input_schema,
                tool_type="mcp",
                status=t.status,
                implementation=t.implementation,
                category="mcp",
                tenant_id=t.tenant_id,
                created_by=t.created_by,
                definition_hash=t.definition_hash,
                enabled=t.enabled,
                annotations=t.annotations.to_json() if t.annotations is not None else None,
                required_capabilities=list(t.required_capabilities),
            )
            for t in tools
        ]
        await asyncio.to_thread(self.repo.upsert, defs, mcp_listing=True)

    async def delete(self, names: Sequence[str], created_by: str) -> list[str]:
        return await asyncio.to_thread(self.repo.soft_delete, list(names), created_by)


def raw_config(name: str = "raw", *extra: str, **kw: object) -> ServerConfig:
    return ServerConfig(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=(*RAW_SERVER, *extra),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def sqlite_sessions(request: pytest.FixtureRequest, tmp_path: Path) -> sessionmaker[Session]:
    return session_factory(make_engine(fresh_database_url(request, "sqlite", str(tmp_path))))


BridgeFactory = Callable[..., McpBridge]


@pytest.fixture
async def make_bridge(
    sqlite_sessions: sessionmaker[Session], tmp_path: Path
) -> AsyncIterator[BridgeFactory]:
    made: list[McpBridge] = []

    def factory(sessions: sessionmaker[Session] | None = None, **kw: object) -> McpBridge:
        s = sessions or sqlite_sessions
        options: dict[str, object] = {
            "connect_timeout_s": 20.0,
            "backoff_s": 0.1,
            "backoff_max_s": 0.5,
            "export_dir": tmp_path / "exports",
        }
        options.update(kw)
        bridge = McpBridge(
            SqlConnectionStore(s),
            RepositorySink(SqlToolRepository(s)),
            **options,  # type: ignore[arg-type]
        )
        made.append(bridge)
        return bridge

    yield factory
    for bridge in made:
        await bridge.stop()
