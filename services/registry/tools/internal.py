"""Internal tools: `ping` (health, latency, failure injection for tests) and `compose_ping`
(tool composition through the registry). Both are spec-only under the Uniform Tool Contract
(`migrate_tool`, not tabular): they return ToolResults and the registry wraps them."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
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
    steps = int(inputs.get("progress_steps") or 0)
    for step in range(steps):
        context.report_progress(f"ping step {step + 1} of {steps}", fraction=step / steps)
        await asyncio.sleep(delay_ms / 1000 / steps)
    if delay_ms and not steps:
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
    effects = Effects()
    if "export_text" in inputs:
        effects.exports["ping.txt"] = await asyncio.to_thread(
            _write_export, context, str(inputs["export_text"])
        )
    return envelope_to_tool_result(Ok(rows=0, data=data, effects=effects))


def _write_export(context: ToolContext, text: str) -> dict[str, Any]:
    """ping.txt in a fresh folder under <data_dir>/exports; its export entry."""
    data_dir = context.settings.data_dir if context.settings is not None else Path(".toolmesh")
    folder = data_dir / "exports" / uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ping.txt"
    path.write_text(text, encoding="utf-8")
    return {
        "path": str(path.relative_to(data_dir)),
        "mime_type": "text/plain",
        "size_bytes": path.stat().st_size,
        "source_tool": "ping",
    }


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


async def compose_llm(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    """ping (composed), call_llm (composed; its LLM call is a leaf of the nested call) and an
    LLM call of its own (a leaf of this call). The registry rolls the costs up."""
    question = str(inputs["question"])
    await context.call_tool("ping", {"echo": question})
    nested = await context.call_tool("call_llm", {"prompt": question})
    if nested.error is not None:
        return ToolResult(error=f"nested call_llm failed: {nested.error}")
    own = await context.llm([{"role": "user", "content": question}])
    return envelope_to_tool_result(Ok(data={"nested": nested.content_as_data(), "own": own.text}))


migrate_tool(compose_llm, "compose_llm", is_tabular=False, expected_envelopes={"ok", "err"})
