"""ConnectionStore over SQLAlchemy: the mcp_connections table (SQLite or PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.model import ServerConfig
from shared.db.engine import translate_db_errors, upsert_row
from shared.db.models import McpConnectionRow


class SqlConnectionStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def load(self) -> list[ServerConfig]:
        with translate_db_errors(), self._sessions() as s:
            rows = s.scalars(select(McpConnectionRow).order_by(McpConnectionRow.name))
            return [
                ServerConfig.from_json(r.name, r.transport, r.config, r.tenant_id) for r in rows
            ]

    def save(self, config: ServerConfig) -> None:
        """Insert or update the connection's row (bridges racing on a new name all succeed)."""

        def fill(row: McpConnectionRow) -> None:
            row.transport = config.transport
            row.config = config.to_json()
            row.tenant_id = config.tenant_id

        upsert_row(self._sessions, McpConnectionRow, {"name": config.name}, fill)

    def delete(self, name: str) -> None:
        with translate_db_errors(), self._sessions.begin() as s:
            s.execute(delete(McpConnectionRow).where(McpConnectionRow.name == name))
