"""ConnectionStore over SQLAlchemy: the mcp_connections table (SQLite or PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.model import ServerConfig
from shared.db.engine import translate_db_errors
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
        """Insert or update the connection's row. Two bridges saving a new name at once: the
        one whose insert loses on the key updates the row the other inserted."""
        for attempt in range(2):
            try:
                with translate_db_errors(), self._sessions.begin() as s:
                    row = s.get(McpConnectionRow, config.name)
                    if row is None:
                        row = McpConnectionRow(name=config.name)
                        s.add(row)
                    row.transport = config.transport
                    row.config = config.to_json()
                    row.tenant_id = config.tenant_id
                return
            except IntegrityError:
                if attempt:
                    raise

    def delete(self, name: str) -> None:
        with translate_db_errors(), self._sessions.begin() as s:
            s.execute(delete(McpConnectionRow).where(McpConnectionRow.name == name))
