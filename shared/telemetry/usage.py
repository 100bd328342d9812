"""usage_log: one row per cost-bearing leaf, written where the cost happens, so an SRE can
answer "what did it cost, for whom" per tenant / user / conversation / tool from the database.
The dispatcher reads a conversation's total to enforce the per-conversation ceiling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import translate_db_errors
from shared.db.models import UsageLogRow
from shared.telemetry.tracing import current_trace_id

if TYPE_CHECKING:
    from shared.llm.client import LLMSpend


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

    @classmethod
    def of_llm_spend(
        cls,
        spend: LLMSpend,
        *,
        tenant_id: str,
        tool_name: str,
        user_id: str = "",
        conversation_id: str = "",
        tool_use_id: str = "",
    ) -> UsageEntry:
        """The usage_log row of what an LLM call was billed for (a failed one's too)."""
        return cls(
            tenant_id=tenant_id,
            tool_name=tool_name,
            kind="llm",
            cost_usd=spend.cost_usd,
            user_id=user_id,
            conversation_id=conversation_id,
            tool_use_id=tool_use_id,
            trace_id=current_trace_id(),
            provider=spend.provider,
            model=spend.model,
            input_tokens=spend.usage.input_tokens,
            output_tokens=spend.usage.output_tokens,
            cache_read_tokens=spend.usage.cache_read_tokens,
            cache_write_tokens=spend.usage.cache_write_tokens,
        )


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
