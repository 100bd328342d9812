"""Internal tools: `ping` (health, latency, failure injection for tests) and `compose_ping`
(tool composition through the registry). Both are spec-only under the Uniform Tool Contract
(`migrate_tool`, not tabular): they return ToolResults and the registry wraps them."""

from __future__ import annotations

import asyncio
from typing import Any

from services.registry.context import ToolContext
from shared.contract import (
    Effects,
    HintException,
    Ok,
    ToolResult,
    envelope_to_tool_result,
    migrate_tool,
)


class PingFailure(RuntimeError):
    """Raised by ping when asked to, so tests see a handler exception become an Err."""


async def ping(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    delay_ms = int(inputs.get("delay_ms") or 0)
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000)
    fail = inputs.get("fail") or ""
    if fail == "raise":
        raise PingFailure("ping was asked to raise")
    if fail == "hint":
        raise HintException(
            "fetch", "ping was asked for a hint", [{"label": "fail=''", "score": 1.0}]
        )
    if fail == "error":
        return ToolResult(content="", error="ping was asked to fail")
    data: dict[str, Any] = {"pong": True}
    if "echo" in inputs:
        data["echo"] = inputs["echo"]
    return envelope_to_tool_result(Ok(rows=0, data=data))


migrate_tool(ping, "ping", is_tabular=False)


async def compose_ping(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """Calls ping and reads its output as data: `inner` is ping's typed payload, `inner_text`
    its rendered content without the `✓ ok.` status line."""
    inner = await context.call_tool("ping", {"echo": inputs.get("echo")})
    if inner.error is not None:
        return ToolResult(error=f"inner ping failed: {inner.error}")
    envelope = inner.envelope
    inner_data = envelope.data if isinstance(envelope, Ok) else None
    return envelope_to_tool_result(
        Ok(
            data={"composed": True, "inner": inner_data, "inner_text": inner.content_as_data()},
            effects=Effects(cost=inner.cost),
        )
    )


# compose_ping never answers a Hint itself: an inner failure is an Err, an inner Hint is data.
migrate_tool(compose_ping, "compose_ping", is_tabular=False, expected_envelopes={"ok", "err"})
