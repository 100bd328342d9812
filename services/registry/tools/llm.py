"""The "llm" system tools: `call_llm` (one LLM call on the `call_llm` role's model, charged to
the call through its context) and `query_telemetry` (operational statistics from the logs).
Spec-only under the Uniform Tool Contract: they return ToolResults and the registry wraps
them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from services.registry.context import ToolContext
from shared.contract import (
    Effects,
    Ok,
    ToolResult,
    envelope_to_tool_result,
    measure_schema,
    migrate_tool,
)
from shared.costs import BudgetExceeded
from shared.db.models import utcnow
from shared.errors import ToolmeshError
from shared.llm import prompts
from shared.llm.config import ROLE_CALL_LLM
from shared.telemetry.stats import stats_frame, usage_stats

TELEMETRY_ADMIN = "telemetry_admin"


async def call_llm(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    try:
        reply = await context.llm(
            [{"role": "user", "content": str(inputs["prompt"])}],
            role=ROLE_CALL_LLM,
            system=str(inputs.get("system") or prompts.CALL_LLM_SYSTEM),
            max_output_tokens=inputs.get("max_output_tokens"),
        )
    except BudgetExceeded:
        raise
    except ToolmeshError as exc:
        # The provider or its configuration failed: an Err the model can read, with the reason.
        return ToolResult(error=f"{exc.reason}: {exc.message}")
    data = {
        "text": reply.text,
        "model": reply.model,
        "stop_reason": reply.stop_reason,
        "input_tokens": reply.usage.input_tokens,
        "output_tokens": reply.usage.output_tokens,
        "cost_usd": round(reply.cost_usd, 8),
    }
    return envelope_to_tool_result(Ok(data=data, effects=Effects(cost=reply.cost_usd)))


migrate_tool(call_llm, "call_llm", is_tabular=False, expected_envelopes={"ok", "err"})


async def query_telemetry(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    if context.sessions is None:
        return ToolResult(error="telemetry is not available in this registry (no database)")
    tenant = str(inputs.get("tenant") or "")
    admin = TELEMETRY_ADMIN in context.capabilities
    if not admin:
        if tenant and tenant != context.tenant_id:
            return ToolResult(
                error=f"tenant {tenant!r} is not yours; reading another tenant's telemetry "
                f"needs the {TELEMETRY_ADMIN} capability"
            )
        tenant = context.tenant_id
    group_by = str(inputs.get("group_by") or "tool")
    hours = float(inputs.get("since_hours") or 24)
    stats, _since = await asyncio.to_thread(
        usage_stats,
        context.sessions,
        group_by=group_by,
        since=utcnow() - timedelta(hours=hours),
        tool_name=str(inputs.get("tool") or ""),
        tenant_id=tenant,
    )
    frame = stats_frame(stats, group_by)
    return envelope_to_tool_result(Ok(rows=len(frame), schema=measure_schema(frame), data=frame))


migrate_tool(query_telemetry, "query_telemetry", is_tabular=True, expected_envelopes={"ok", "err"})
