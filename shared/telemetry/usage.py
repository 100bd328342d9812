"""usage_log: one row per cost-bearing leaf, written where the cost happens, so an SRE can
answer "what did it cost, for whom" per tenant / user / conversation / tool from the database.
The dispatcher reads a conversation's total to enforce the per-conversation ceiling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import translate_db_errors
from shared.db.models import UsageLogRow


@dataclass(frozen=True)
class UsageEntry:
    tenant_id: str
    tool_name: str
    kind: str  # "llm" | "tool"
    cost_usd: float
    user_id: str = ""
    conversation_id: str = ""
    tool_use_id: str = ""
    trace_id: str = ""
    provider: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class UsageLog(Protocol):
    def record(self, entry: UsageEntry) -> None: ...

    def conversation_spent(self, tenant_id: str, conversation_id: str) -> float: ...


class SqlUsageLog:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def record(self, entry: UsageEntry) -> None:
        with translate_db_errors(), self._sessions.begin() as session:
            session.execute(insert(UsageLogRow).values(**entry.__dict__))

    def conversation_spent(self, tenant_id: str, conversation_id: str) -> float:
        with translate_db_errors(), self._sessions() as session:
            total = session.scalar(
                select(func.coalesce(func.sum(UsageLogRow.cost_usd), 0.0)).where(
                    UsageLogRow.tenant_id == tenant_id,
                    UsageLogRow.conversation_id == conversation_id,
                )
            )
            return float(total or 0.0)
