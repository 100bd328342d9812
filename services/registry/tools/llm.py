"""The "llm" system tools: `call_llm` (one LLM call on the `call_llm` role's model, charged to
the call through its context) and `query_telemetry` (operational statistics from the logs).
Spec-only under the Uniform Tool Contract: they return ToolResults and the registry wraps
them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from services.registry.context import ToolContext
from shared.contract import (
    Effects,
    Err,
    Ok,
    ToolResult,
    Warning,
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


def _err(reason: str, message: str) -> ToolResult:
    """An Err the calling model can act on: its kind is the stable reason (`llm_rate_limited`,
    `llm_prompt_too_long`, …), its message what happened and what to do."""
    return envelope_to_tool_result(Err(message=f"{reason}: {message}", err_kind=reason.lower()))


async def _affordable_output_tokens(context: ToolContext, requested: int | None) -> int | None:
    """`requested`, lowered so that the answer's output tokens alone cannot cost more than what
    is left of the call's budget (a model asked for 16k tokens with a cent left would otherwise
    spend far past it before the charge stops the handler)."""
    remaining = context.cost.remaining()
    if remaining is None or context.llm_clients is None:
        return requested
    try:
        client = await context.db(
            "the model configuration's read", context.llm_clients, ROLE_CALL_LLM
        )
        cfg = client.config
    except ToolmeshError:
        return requested  # context.llm raises the same error, with its reason
    if cfg.output_price_per_mtok <= 0:
        return requested
    affordable = max(1, int(remaining * 1_000_000 / cfg.output_price_per_mtok))
    return min(requested or cfg.max_output_tokens, affordable)


def _warnings(reply: Any) -> list[Warning]:
    warnings: list[Warning] = []
    if reply.stop_reason in ("max_tokens", "model_context_window_exceeded"):
        warnings.append(
            Warning(
                "truncated",
                f"the answer was cut at {reply.usage.output_tokens} output tokens "
                f"(stop_reason {reply.stop_reason}); ask for a shorter answer or raise "
                "max_output_tokens",
                {"stop_reason": reply.stop_reason, "max_output_tokens": reply.max_tokens},
            )
        )
    elif reply.stop_reason == "pause_turn":
        warnings.append(
            Warning(
                "incomplete",
                "the model paused its turn before finishing; the answer may be partial",
                {"stop_reason": reply.stop_reason},
            )
        )
    if reply.tool_uses:
        warnings.append(
            Warning(
                "unexpected_tool_use",
                "the model asked to use tools, which call_llm does not run; only its text is "
                "returned",
                {"tools": [u["name"] for u in reply.tool_uses]},
            )
        )
    if not reply.usage_reported:
        warnings.append(
            Warning("usage_missing", "the provider reported no token usage; cost recorded as 0")
        )
    return warnings


async def call_llm(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    try:
        max_output_tokens = await _affordable_output_tokens(
            context, inputs.get("max_output_tokens")
        )
        reply = await context.llm(
            [{"role": "user", "content": str(inputs["prompt"])}],
            role=ROLE_CALL_LLM,
            system=str(inputs.get("system") or prompts.CALL_LLM_SYSTEM),
            max_output_tokens=max_output_tokens,
        )
    except BudgetExceeded:
        raise
    except ToolmeshError as exc:
        # The provider or its configuration failed: an Err the model can read, with the reason.
        return _err(exc.reason, exc.message)
    if reply.refused:
        # Spent (and charged by context.llm) but no answer: say so instead of an empty Ok.
        return _err(
            "LLM_REFUSAL",
            "the model declined to answer this prompt (stop_reason refusal); rephrase it or "
            "ask for something else",
        )
    data = {
        "text": reply.text,
        "model": reply.model,
        "stop_reason": reply.stop_reason,
        "input_tokens": reply.usage.input_tokens,
        "output_tokens": reply.usage.output_tokens,
        "cache_read_tokens": reply.usage.cache_read_tokens,
        "cache_write_tokens": reply.usage.cache_write_tokens,
        "cost_usd": round(reply.cost_usd, 8),
    }
    return envelope_to_tool_result(
        Ok(data=data, warnings=_warnings(reply), effects=Effects(cost=reply.cost_usd))
    )


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
    stats, _since = await context.db(
        "the usage statistics' query",
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
