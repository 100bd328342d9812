"""Operational statistics from the shared logs — calls, error rates, p50/p95 durations from
tool_execution_log; cost, LLM calls and tokens from usage_log — grouped by tool, tenant, user,
conversation or model over a window. Used by the `query_telemetry` tool, GetUsageStats and
`toolmesh stats`. Blocking; call from a worker thread."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import translate_db_errors
from shared.db.models import ToolExecutionLogRow, UsageLogRow, utcnow
from shared.errors import InvalidArgument

GROUPS = {
    "tool": "tool_name",
    "tenant": "tenant_id",
    "user": "user_id",
    "conversation": "conversation_id",
    # Calls by the model their context named (the conversation's); LLM cost and tokens by the
    # model that answered them.
    "model": "model",
}
DEFAULT_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class GroupStats:
    key: str
    calls: int
    errors: int
    error_rate: float
    p50_ms: float
    p95_ms: float
    cost_usd: float
    llm_calls: int
    tokens: int


def usage_stats(
    sessions: sessionmaker[Session],
    *,
    group_by: str = "tool",
    since: datetime | None = None,
    tool_name: str = "",
    tenant_id: str = "",
) -> tuple[list[GroupStats], datetime]:
    """Statistics per group, most calls first, and the window start used."""
    group_by = group_by or "tool"
    column = GROUPS.get(group_by)
    if column is None:
        raise InvalidArgument(
            f"group_by must be one of {', '.join(GROUPS)}, not {group_by!r}",
            field_violations=[("group_by", f"unknown grouping {group_by!r}")],
        )
    since = since or (utcnow() - DEFAULT_WINDOW)
    log, usage = ToolExecutionLogRow, UsageLogRow
    calls_q = select(getattr(log, column).label("key"), log.success, log.execution_ms).where(
        log.created_at >= since
    )
    cost_q = select(
        getattr(usage, column).label("key"),
        usage.kind,
        usage.cost_usd,
        (usage.input_tokens + usage.output_tokens).label("tokens"),
    ).where(usage.created_at >= since)
    if tool_name:
        calls_q = calls_q.where(log.tool_name == tool_name)
        cost_q = cost_q.where(usage.tool_name == tool_name)
    if tenant_id:
        calls_q = calls_q.where(log.tenant_id == tenant_id)
        cost_q = cost_q.where(usage.tenant_id == tenant_id)
    with translate_db_errors(), sessions() as session:
        calls = pd.DataFrame(session.execute(calls_q).all(), columns=["key", "ok", "ms"])
        costs = pd.DataFrame(
            session.execute(cost_q).all(), columns=["key", "kind", "cost", "tokens"]
        )
    keys = sorted(set(calls["key"]) | set(costs["key"]))
    out: list[GroupStats] = []
    by_calls = {k: g for k, g in calls.groupby("key")} if len(calls) else {}
    by_cost = {k: g for k, g in costs.groupby("key")} if len(costs) else {}
    for key in keys:
        c = by_calls.get(key)
        u = by_cost.get(key)
        n = 0 if c is None else len(c)
        errors = 0 if c is None else int((~c["ok"].astype(bool)).sum())
        llm = u[u["kind"] == "llm"] if u is not None else None
        out.append(
            GroupStats(
                key=str(key),
                calls=n,
                errors=errors,
                error_rate=errors / n if n else 0.0,
                p50_ms=float(c["ms"].quantile(0.5)) if c is not None and n else 0.0,
                p95_ms=float(c["ms"].quantile(0.95)) if c is not None and n else 0.0,
                cost_usd=float(u["cost"].sum()) if u is not None else 0.0,
                llm_calls=0 if llm is None else len(llm),
                tokens=0 if llm is None else int(llm["tokens"].sum()),
            )
        )
    out.sort(key=lambda g: (-g.calls, -g.cost_usd, g.key))
    return out, since


def stats_frame(stats: list[GroupStats], group_by: str) -> pd.DataFrame:
    """The statistics as a table (for the query_telemetry tool's Ok)."""
    frame = pd.DataFrame([s.__dict__ for s in stats])
    if frame.empty:
        frame = pd.DataFrame(columns=list(GroupStats.__dataclass_fields__))
    frame = frame.rename(columns={"key": group_by})
    frame["error_rate"] = frame["error_rate"].astype(float).round(4)
    for col in ("p50_ms", "p95_ms"):
        frame[col] = frame[col].astype(float).round(2)
    frame["cost_usd"] = frame["cost_usd"].astype(float).round(6)
    return frame
