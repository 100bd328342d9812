"""The dispatcher's domain core: the single-call dispatch path (validation, args_hash, execution
through the registry, durable logging) and batches. Imports no grpc: the registry is reached
through the RegistryGateway seam."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.dispatcher.logstore import CallLog, CallRecord, EventRecord, summarize
from shared import convert
from shared.errors import DeadlineExceeded, InvalidArgument, ToolmeshError
from shared.telemetry.tracing import current_trace_id
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

NARRATION_KEYS = frozenset({"reasoning", "explanation", "thought", "rationale", "justification"})


class RegistryGateway(Protocol):
    """Executes a tool in the registry (over gRPC in the service, in-process in unit tests)."""

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse: ...


@dataclass
class DispatchOutcome:
    result: pb.ToolResult
    duration_ms: float
    args_hash: str
    tool_use_id: str
    warnings: list[str] = field(default_factory=list)


def args_hash(tool_name: str, tool_input: Any) -> str:
    """Stable 16-hex SHA-256 prefix of the tool name and its arguments with sorted keys."""
    payload = json.dumps(
        [tool_name, tool_input], sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def _kind_of_error(error: ToolmeshError) -> str:
    return error.reason.lower() if error.reason else error.code.lower()


class Dispatcher:
    def __init__(
        self,
        registry: RegistryGateway,
        log: CallLog,
        *,
        timeout_s: float = 300.0,
        max_input_bytes: int = 4 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._log = log
        self._timeout_s = timeout_s
        self._max_input_bytes = max_input_bytes
        self._clock = clock

    def parse_input(self, tool_use: pb.ToolUse) -> dict[str, Any]:
        if not tool_use.name:
            raise InvalidArgument(
                "tool_use.name is required", field_violations=[("tool_use.name", "empty")]
            )
        size = len(tool_use.input_json.encode("utf-8"))
        if size > self._max_input_bytes:
            raise InvalidArgument(
                f"tool_use.input_json is {size} bytes, over the {self._max_input_bytes}-byte limit",
                reason="INPUT_TOO_LARGE",
                field_violations=[("tool_use.input_json", "too large")],
            )
        return convert.parse_json_object(tool_use.input_json, "tool_use.input_json")

    async def dispatch(self, tool_use: pb.ToolUse, context: pb.CallContext) -> DispatchOutcome:
        """Dispatch one call. RPC-level errors (unknown tool, bad input, registry down) are
        logged and re-raised; tool failures come back as Err results."""
        inputs = self.parse_input(tool_use)
        return await self._dispatch_parsed(tool_use, inputs, context)

    async def _dispatch_parsed(
        self, tool_use: pb.ToolUse, inputs: dict[str, Any], context: pb.CallContext
    ) -> DispatchOutcome:
        tool_use_id = tool_use.id or f"toolu_{uuid.uuid4().hex[:24]}"
        ctx = pb.CallContext()
        ctx.CopyFrom(context)
        ctx.tool_use_id = tool_use_id
        h = args_hash(tool_use.name, {k: v for k, v in inputs.items() if k != "reasoning"})
        started = self._clock()
        call_event = EventRecord(
            "tool_call",
            {
                "tool_name": tool_use.name,
                "tool_use_id": tool_use_id,
                "input": inputs,
                "reasoning": inputs.get("reasoning"),
                "args_hash": h,
                "user_id": ctx.user_id,
            },
            tool_use_id,
        )
        request = rpb.ExecuteToolRequest(
            name=tool_use.name, input_json=tool_use.input_json or "{}", context=ctx
        )
        await self._log.ensure_available()  # never run a tool whose call cannot be logged
        try:
            response = await self._registry.execute(request, self._timeout_s)
            result = response.result
        except DeadlineExceeded:
            result = convert.error_result_pb(
                f"{tool_use.name} did not finish within {self._timeout_s:g}s", "timeout"
            )
        except ToolmeshError as error:
            elapsed = (self._clock() - started) * 1000
            await self._log.write(
                self._record(
                    tool_use, tool_use_id, ctx, h, inputs, elapsed, None, error, call_event
                )
            )
            raise
        elapsed = (self._clock() - started) * 1000
        await self._log.write(
            self._record(tool_use, tool_use_id, ctx, h, inputs, elapsed, result, None, call_event)
        )
        return DispatchOutcome(
            result=result, duration_ms=elapsed, args_hash=h, tool_use_id=tool_use_id
        )

    def _record(
        self,
        tool_use: pb.ToolUse,
        tool_use_id: str,
        ctx: pb.CallContext,
        h: str,
        inputs: dict[str, Any],
        elapsed_ms: float,
        result: pb.ToolResult | None,
        error: ToolmeshError | None,
        call_event: EventRecord,
    ) -> CallRecord:
        if result is not None:
            kind = convert.envelope_kind(result)
            success = kind != "err"
            err_text = result.error or None
            content = result.content
            result_data: dict[str, Any] = {
                "tool_name": tool_use.name,
                "tool_use_id": tool_use_id,
                "content": content,
                "envelope": kind,
                "error": err_text,
                "cost_usd": result.cost_usd,
                "duration_ms": elapsed_ms,
                "datasets": [d.name for d in result.datasets],
                "exports": [e.filename for e in result.exports],
            }
        else:
            assert error is not None
            success = False
            err_text = f"{error.code}: {error.message}"
            content = ""
            result_data = {
                "tool_name": tool_use.name,
                "tool_use_id": tool_use_id,
                "content": "",
                "envelope": "rpc_error",
                "error": err_text,
                "status": error.code,
                "reason": error.reason,
                "duration_ms": elapsed_ms,
            }
        return CallRecord(
            tool_name=tool_use.name,
            tenant_id=ctx.tenant_id,
            user_id=ctx.user_id,
            conversation_id=ctx.conversation_id,
            tool_use_id=tool_use_id,
            args_hash=h,
            input_data=inputs,
            output_summary=summarize(content or (err_text or "")),
            success=success,
            error=err_text,
            execution_ms=elapsed_ms,
            trace_id=current_trace_id(),
            events=[call_event, EventRecord("tool_result", result_data, tool_use_id)],
        )

    async def dispatch_many(
        self, tool_uses: Sequence[pb.ToolUse], context: pb.CallContext
    ) -> list[DispatchOutcome]:
        """Run the calls of one assistant turn concurrently; results in input order. A call that
        fails at the RPC level gets an Err result in its own slot."""
        seen: set[str] = set()
        for i, tu in enumerate(tool_uses):
            if tu.id and tu.id in seen:
                raise InvalidArgument(
                    f"duplicate tool_use id {tu.id!r}",
                    reason="DUPLICATE_TOOL_USE_ID",
                    field_violations=[(f"tool_uses[{i}].id", "duplicate")],
                )
            seen.add(tu.id)
        parsed = [self.parse_input(tu) for tu in tool_uses]  # all-or-nothing validation

        async def one(tu: pb.ToolUse, inputs: dict[str, Any]) -> DispatchOutcome:
            try:
                return await self._dispatch_parsed(tu, inputs, context)
            except ToolmeshError as error:
                return DispatchOutcome(
                    result=convert.error_result_pb(error.message, _kind_of_error(error)),
                    duration_ms=0.0,
                    args_hash=args_hash(tu.name, inputs),
                    tool_use_id=tu.id,
                )

        return list(
            await asyncio.gather(*(one(tu, i) for tu, i in zip(tool_uses, parsed, strict=True)))
        )
