"""The registry's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC
from typing import Any, TypeVar

import grpc
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.model import NAME_PATTERN, ToolDef
from shared import convert, schema_regex
from shared.clients import traced_call
from shared.contract import ToolContractStats, ToolResult
from shared.db.engine import db_thread
from shared.errors import FailedPrecondition, InvalidArgument
from shared.schema_check import schema_problem
from shared.server import require_admin_caller
from shared.telemetry.stats import usage_stats
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

T = TypeVar("T")
logger = logging.getLogger(__name__)

_NAME_RE = re.compile(NAME_PATTERN)
# A tool's own timeout: at most a day (0: the dispatcher's default).
MAX_TIMEOUT_S = 86_400.0


def context_from_pb(m: pb.CallContext, tool_name: str) -> ToolContext:
    return ToolContext(
        tool_name=tool_name,
        tenant_id=m.tenant_id,
        user_id=m.user_id,
        conversation_id=m.conversation_id,
        namespace_id=m.namespace_id,
        capabilities=frozenset(m.capabilities),
        mode=convert.MODES.get(m.mode, "chat"),
        tool_use_id=m.tool_use_id,
        parent_tool_use_id=m.parent_tool_use_id,
        reasoning=m.reasoning or None,
        user_message=m.user_message,
        dataset_id=m.dataset_id,
        budget_limit=m.budget.limit_usd or None,
        budget_spent=m.budget.spent_usd,
        depth=m.depth,
        model=m.model,
    )


def context_to_pb(c: ToolContext) -> pb.CallContext:
    return pb.CallContext(
        tenant_id=c.tenant_id,
        user_id=c.user_id,
        conversation_id=c.conversation_id,
        namespace_id=c.namespace_id,
        capabilities=sorted(c.capabilities),
        mode=convert.MODE_VALUES.get(c.mode, pb.MODE_CHAT),
        tool_use_id=c.tool_use_id,
        parent_tool_use_id=c.parent_tool_use_id,
        reasoning=c.reasoning or "",
        user_message=c.user_message,
        dataset_id=c.dataset_id,
        budget=pb.Budget(limit_usd=c.cost.limit or 0.0, spent_usd=c.cost.spent),
        depth=c.depth,
        model=c.model,
    )


def tool_to_pb(t: ToolDef) -> pb.ToolDefinition:
    msg = pb.ToolDefinition(
        id=t.id,
        name=t.name,
        description=t.description,
        input_schema_json=convert.dumps(t.input_schema),
        implementation=t.implementation,
        handler_path=t.handler_path or "",
        tool_type=convert.TOOL_TYPE_VALUES.get(t.tool_type, pb.TOOL_TYPE_UNSPECIFIED),
        status=convert.STATUS_VALUES.get(t.status, pb.TOOL_STATUS_UNSPECIFIED),
        enabled=t.enabled,
        category=t.category,
        domain=t.domain or "",
        replaced_by_model_capability=t.replaced_by_model_capability or "",
        status_message=t.status_message or "",
        large_output=t.large_output,
        parent_tool=t.parent_tool or "",
        dependencies=list(t.dependencies),
        version=t.version,
        tenant_id=t.tenant_id,
        created_by=t.created_by,
        rejection_reason=t.rejection_reason or "",
        test_results_json=convert.dumps(t.test_results) if t.test_results else "",
        required_capabilities=list(t.required_capabilities),
        timeout_seconds=t.timeout_seconds or 0.0,
        definition_hash=t.definition_hash or "",
        annotations=convert.annotations_to_pb(t.annotations),
    )
    for field, value in (
        ("deleted_at", t.deleted_at),
        ("created_at", t.created_at),
        ("updated_at", t.updated_at),
    ):
        ts = convert.to_timestamp(value)
        if ts is not None:
            getattr(msg, field).CopyFrom(ts)
    return msg


# Bounds of what one definition may hold: every listing of the catalog carries it, and the
# registry compiles its schema before the tool's first call.
MAX_IMPLEMENTATION_BYTES = 1024 * 1024
MAX_SHORT_TEXT_CHARS = 4096  # status and rejection messages
MAX_LISTED_VALUES = 100  # dependencies, required capabilities


def _definition_size_problems(m: pb.ToolDefinition) -> list[tuple[str, str]]:
    """Field violations of a definition's sizes and identifiers (names of tenants, categories
    and creators are stored as ids: no control characters, at most MAX_ID_CHARS)."""
    problems: list[tuple[str, str]] = []
    for field, value in (
        ("tenant_id", m.tenant_id),
        ("created_by", m.created_by),
        ("category", m.category),
        ("domain", m.domain),
        ("parent_tool", m.parent_tool),
        ("replaced_by_model_capability", m.replaced_by_model_capability),
    ):
        limit = 64 if field == "category" else convert.MAX_ID_CHARS
        if len(value) > limit or convert.has_control(value):
            problems.append((field, f"must be at most {limit} printable characters"))
    if len(m.input_schema_json.encode("utf-8")) > convert.MAX_SCHEMA_BYTES:
        problems.append(("input_schema_json", f"is over {convert.MAX_SCHEMA_BYTES} bytes"))
    size = len(m.implementation.encode("utf-8"))
    if size > MAX_IMPLEMENTATION_BYTES:
        problems.append(("implementation", f"is over {MAX_IMPLEMENTATION_BYTES} bytes"))
    elif size > convert.MAX_CUSTOM_CODE_BYTES and m.tool_type == pb.TOOL_TYPE_CUSTOM:
        # The sandbox would refuse every execution of it (code_rejected).
        problems.append(
            ("implementation", f"is over {convert.MAX_CUSTOM_CODE_BYTES} bytes of custom code")
        )
    for field, text in (
        ("description", m.description),
        ("implementation", m.implementation),
        ("status_message", m.status_message),
        ("rejection_reason", m.rejection_reason),
    ):
        if "\x00" in text:
            problems.append((field, "holds a NUL character"))
    for field, text in (
        ("status_message", m.status_message),
        ("rejection_reason", m.rejection_reason),
    ):
        if len(text) > MAX_SHORT_TEXT_CHARS:
            problems.append((field, f"is over {MAX_SHORT_TEXT_CHARS} characters"))
    for field, values in (
        ("dependencies", m.dependencies),
        ("required_capabilities", m.required_capabilities),
    ):
        if len(values) > MAX_LISTED_VALUES or any(
            len(v) > convert.MAX_ID_CHARS or convert.has_control(v) for v in values
        ):
            problems.append(
                (field, f"at most {MAX_LISTED_VALUES} printable values of 128 characters")
            )
    if m.status and m.status not in convert.STATUSES:
        problems.append(("status", f"unknown status {m.status}"))
    title = m.annotations.title
    if len(title) > convert.MAX_TOOL_TITLE_CHARS or convert.has_control(title):
        problems.append(
            (
                "annotations.title",
                f"must be at most {convert.MAX_TOOL_TITLE_CHARS} printable characters",
            )
        )
    return problems


def tool_from_pb(m: pb.ToolDefinition) -> ToolDef:
    """A custom or MCP definition from UpsertTools, validated."""
    violations: list[tuple[str, str]] = []
    if not _NAME_RE.match(m.name):
        violations.append(("name", "must match [a-zA-Z0-9_-]{1,64}"))
    tool_type = convert.TOOL_TYPES.get(m.tool_type, "")
    if tool_type not in ("custom", "mcp"):
        violations.append(("tool_type", "must be TOOL_TYPE_CUSTOM or TOOL_TYPE_MCP"))
    schema: dict[str, Any] = {}
    try:
        schema = convert.parse_json_object(m.input_schema_json or "{}", "input_schema_json")
    except InvalidArgument as exc:
        violations.extend(exc.field_violations)
    # An MCP server's schema is taken as it is (a pattern RE2 cannot run is not enforced; an
    # unusable schema answers each call with a schema Hint saying so).
    if tool_type == "custom" and schema:
        problem = schema_problem(schema) or schema_regex.pattern_problem(schema)
        if problem is not None:
            violations.append(("input_schema_json", problem))
    if len(m.description) > convert.MAX_TOOL_DESCRIPTION_CHARS:
        violations.append(
            (
                "description",
                f"is {len(m.description)} characters, over {convert.MAX_TOOL_DESCRIPTION_CHARS}",
            )
        )
    timeout = m.timeout_seconds
    if not math.isfinite(timeout) or timeout < 0 or timeout > MAX_TIMEOUT_S:
        violations.append(
            ("timeout_seconds", f"must be between 0 (the default) and {MAX_TIMEOUT_S:g} seconds")
        )
    if m.handler_path:
        violations.append(("handler_path", "is for system tools, which are seeded from code"))
    violations.extend(_definition_size_problems(m))
    test_results: dict[str, Any] | None = None
    try:
        test_results = convert.parse_json_object(m.test_results_json, "test_results_json") or None
    except InvalidArgument as exc:
        violations.extend(exc.field_violations)
    if violations:
        raise InvalidArgument(
            f"invalid tool definition {m.name!r}: " + "; ".join(f"{f} {d}" for f, d in violations),
            reason="INVALID_TOOL_DEFINITION",
            field_violations=violations,
        )
    return ToolDef(
        name=m.name,
        description=m.description,
        input_schema=schema or {"type": "object"},
        tool_type=tool_type,
        status=convert.STATUSES.get(m.status, "draft"),
        enabled=m.enabled,
        category=m.category or "general",
        implementation=m.implementation,
        domain=m.domain or None,
        replaced_by_model_capability=m.replaced_by_model_capability or None,
        status_message=m.status_message or None,
        large_output=m.large_output,
        parent_tool=m.parent_tool or None,
        dependencies=list(m.dependencies),
        tenant_id=m.tenant_id or "*",
        created_by=m.created_by or tool_type,
        rejection_reason=m.rejection_reason or None,
        test_results=test_results,
        required_capabilities=list(m.required_capabilities),
        timeout_seconds=m.timeout_seconds or None,
        definition_hash=m.definition_hash or None,
        annotations=convert.annotations_from_pb(m.annotations),
    )


def contract_stats_to_pb(s: ToolContractStats) -> rpb.ContractStats:
    return rpb.ContractStats(
        tool_name=s.tool_name,
        ok_count=s.ok,
        hint_count=s.hint,
        err_count=s.err,
        hint_kinds=dict(s.hint_kinds),
        err_kinds=dict(s.err_kinds),
        contract_violation_count=s.contract_violations,
        coerced_count=s.coerced,
    )


class GrpcToolCaller:
    """Tool composition: a handler's call_tool goes back through the registry's gRPC API with
    the same context (depth + 1), so it is traced, validated and routed like any call."""

    def __init__(self, stub: registry_pb2_grpc.RegistryServiceStub, tracing: bool) -> None:
        self._stub = stub
        self._tracing = tracing

    async def call_tool(
        self, name: str, inputs: Mapping[str, Any], context: ToolContext
    ) -> ToolResult:
        ctx = context_to_pb(context)
        ctx.depth = context.depth + 1
        ctx.parent_tool_use_id = context.tool_use_id
        ctx.reasoning = ""
        context.cost.check(f"before calling {name}")
        response = await traced_call(
            self._stub.ExecuteTool,
            rpb.ExecuteToolRequest(name=name, input_json=convert.dumps(dict(inputs)), context=ctx),
            span_name="toolmesh.registry.v1.RegistryService/ExecuteTool",
            peer_service="registry",
            tracing=self._tracing,
        )
        result = convert.tool_result_from_pb(response.result)
        # The nested call logged its own leaves; its total rolls up into this call's.
        context.cost.charge_nested(result.cost, f"{name} called by {context.tool_name}")
        return result


def _progress_message(report: Mapping[str, Any]) -> rpb.ExecuteToolStreamResponse:
    message = rpb.ToolProgress(message=str(report.get("message", "")))
    if "fraction" in report:
        message.fraction = float(report["fraction"])
    if report.get("data"):
        message.data_json = convert.dumps(report["data"])
    return rpb.ExecuteToolStreamResponse(progress=message)


class LatestProgress:
    """The progress sink of one streamed call: a single slot holding the latest report not yet
    sent. Progress is a state, so a report replaces the one waiting (counted in `superseded`)
    and the handler never waits for the caller, however slowly it reads; what waits is one
    report, whatever the rate. `put` is safe from any thread (sync handlers run in worker
    threads) and wakes the stream once per report taken, not once per report put, so a flood
    from a thread does not flood the event loop with callbacks either."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._latest: Mapping[str, Any] | None = None
        self._woken = False
        # Set when a report waits (or the stream should look again); cleared by the stream.
        self.ready = asyncio.Event()
        self.superseded = 0

    def put(self, report: Mapping[str, Any]) -> None:
        with self._lock:
            if self._latest is not None:
                self.superseded += 1
            self._latest = report
            if self._woken:
                return
            self._woken = True
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.ready.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                self._loop.call_soon_threadsafe(self.ready.set)

    def take(self) -> Mapping[str, Any] | None:
        """The latest report not yet taken, or None."""
        with self._lock:
            report, self._latest = self._latest, None
            self._woken = False
        return report


class RegistryServicer(registry_pb2_grpc.RegistryServiceServicer):
    def __init__(
        self,
        core: Registry,
        *,
        max_input_bytes: int,
        sessions: sessionmaker[Session] | None = None,
    ) -> None:
        self._core = core
        self._sessions = sessions
        self._max_input_bytes = max_input_bytes
        self._instance = f"{socket.gethostname()}/{os.getpid()}"

    async def _db(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """A database operation (`what` it is) in a thread, waited for at most the core's
        db_wait_s (UNAVAILABLE past it: shared.db.engine.bounded_db_wait)."""
        return await db_thread(self._core.db_wait_s, what, fn, *args, **kwargs)

    async def ExecuteTool(
        self, request: rpb.ExecuteToolRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ExecuteToolResponse:
        if not request.name:
            raise InvalidArgument("name is required", field_violations=[("name", "empty")])
        if len(request.input_json) > self._max_input_bytes:
            raise InvalidArgument(
                f"input_json is {len(request.input_json)} bytes, over the "
                f"{self._max_input_bytes}-byte limit",
                reason="INPUT_TOO_LARGE",
                field_violations=[("input_json", "too large")],
            )
        inputs = convert.parse_json_object(request.input_json, "input_json")
        convert.check_ids([("name", request.name), *convert.context_ids(request.context)])
        ctx = context_from_pb(request.context, request.name)
        execution = await self._core.execute(request.name, inputs, ctx)
        response = rpb.ExecuteToolResponse(
            tool_type=convert.TOOL_TYPE_VALUES.get(execution.tool.tool_type, 0),
            execution_ms=execution.execution_ms,
        )
        convert.tool_result_into(response.result, execution.result)
        return response

    async def ExecuteToolStream(
        self, request: rpb.ExecuteToolStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.ExecuteToolStreamResponse]:
        """ExecuteTool relaying the handler's progress reports as they happen, then the
        result. The reports go through a LatestProgress slot: a caller that reads slowly gets
        the latest report rather than every one (the last one always, before the result), and
        the handler never waits for it. When the caller goes away the generator is closed and
        the handler cancelled."""
        if not request.name:
            raise InvalidArgument("name is required", field_violations=[("name", "empty")])
        if len(request.input_json) > self._max_input_bytes:
            raise InvalidArgument(
                f"input_json is {len(request.input_json)} bytes, over the "
                f"{self._max_input_bytes}-byte limit",
                reason="INPUT_TOO_LARGE",
                field_violations=[("input_json", "too large")],
            )
        inputs = convert.parse_json_object(request.input_json, "input_json")
        convert.check_ids([("name", request.name), *convert.context_ids(request.context)])
        ctx = context_from_pb(request.context, request.name)
        relay = LatestProgress(asyncio.get_running_loop())
        ctx.progress_sink = relay.put
        task = asyncio.create_task(self._core.execute(request.name, inputs, ctx))
        task.add_done_callback(lambda _: relay.ready.set())
        try:
            while True:
                relay.ready.clear()
                # Looked at before taking: a sync handler's last report (from its worker
                # thread) happened before its task finished, so it is taken below.
                finished = task.done()
                report = relay.take()
                if report is not None:
                    yield _progress_message(report)
                elif finished:
                    break
                else:
                    await relay.ready.wait()
            execution = task.result()
            final = rpb.ExecuteToolStreamResponse()
            final.result.tool_type = convert.TOOL_TYPE_VALUES.get(execution.tool.tool_type, 0)
            final.result.execution_ms = execution.execution_ms
            convert.tool_result_into(final.result.result, execution.result)
            yield final
        finally:
            if relay.superseded:
                logger.debug(
                    "ExecuteToolStream %s: %d progress reports superseded before they were sent",
                    request.name,
                    relay.superseded,
                )
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    async def GetToolsForLLM(
        self, request: rpb.GetToolsForLLMRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetToolsForLLMResponse:
        convert.check_ids([("tenant_id", request.tenant_id)])
        tools = await self._db("the tool list's read", self._core.tools_for_llm, request.tenant_id)
        return rpb.GetToolsForLLMResponse(
            tools=[
                rpb.LlmTool(
                    name=t.name,
                    description=t.description,
                    input_schema_json=convert.dumps(t.input_schema),
                )
                for t in tools
            ]
        )

    async def ListTools(
        self, request: rpb.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.ListToolsResponse:
        convert.check_ids(
            [
                ("tenant_id", request.tenant_id),
                ("category", request.category),
                ("created_by", request.created_by),
            ]
        )
        tools = await self._db(
            "the tool list's read",
            self._core.repo.find,
            tenant_id=request.tenant_id,
            tool_type=convert.TOOL_TYPES.get(request.tool_type, ""),
            category=request.category,
            created_by=request.created_by,
            include_deleted=request.include_deleted,
        )
        return rpb.ListToolsResponse(tools=[tool_to_pb(t) for t in tools])

    async def GetTool(
        self, request: rpb.GetToolRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetToolResponse:
        convert.check_ids([("name", request.name), ("tenant_id", request.tenant_id)])
        tool = await self._core.lookup(request.name, request.tenant_id)
        return rpb.GetToolResponse(tool=tool_to_pb(tool))

    async def SeedSystemTools(
        self, request: rpb.SeedSystemToolsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.SeedSystemToolsResponse:
        report = await self._db("the system tools' seeding", self._core.seed_system_tools)
        await self._db("the handlers' registration", self._core.auto_register_handlers)
        return rpb.SeedSystemToolsResponse(
            created=report.created,
            updated=report.updated,
            unchanged=report.unchanged,
            retired=report.retired,
            unknown=report.unknown,
        )

    async def UpsertTools(
        self, request: rpb.UpsertToolsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.UpsertToolsResponse:
        tools = [tool_from_pb(t) for t in request.tools]
        if request.mcp_listing:
            # A listing is merged into the rows an administrator edits: only MCP rows are.
            others = [
                (f"tools[{i}].tool_type", "must be TOOL_TYPE_MCP in an MCP listing")
                for i, t in enumerate(tools)
                if t.tool_type != "mcp"
            ]
            if others:
                raise InvalidArgument(
                    "mcp_listing registers MCP tools only",
                    reason="INVALID_TOOL_DEFINITION",
                    field_violations=others,
                )
        stored = await self._db(
            "the tools' write", self._core.repo.upsert, tools, mcp_listing=request.mcp_listing
        )
        for t in stored:
            self._core.invalidate(t.name)
        return rpb.UpsertToolsResponse(tools=[tool_to_pb(t) for t in stored])

    async def DeleteTools(
        self, request: rpb.DeleteToolsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.DeleteToolsResponse:
        if request.created_by == "system":
            raise InvalidArgument(
                "system tools are retired in code (RETIRED_TOOLS), not deleted",
                reason="SYSTEM_TOOL_PROTECTED",
                field_violations=[("created_by", "system")],
            )
        if not request.names and not request.created_by:
            raise InvalidArgument(
                "give names or created_by; refusing to delete every tool",
                field_violations=[("names", "empty"), ("created_by", "empty")],
            )
        convert.check_ids(
            [("created_by", request.created_by)] + [("names", name) for name in request.names]
        )
        system = set(await self._db("the tool names' read", self._core.repo.names)) & {
            t["name"] for t in self._core.system_tools
        }
        protected = sorted(system & set(request.names))
        if protected:
            raise InvalidArgument(
                f"system tools are retired in code (RETIRED_TOOLS), not deleted: {protected}",
                reason="SYSTEM_TOOL_PROTECTED",
                field_violations=[("names", "contains system tools")],
            )
        deleted = await self._db(
            "the tools' deletion",
            self._core.repo.soft_delete,
            list(request.names),
            request.created_by,
        )
        self._core.invalidate()
        for name in deleted:  # their compiled validators too
            self._core.invalidate(name)
        return rpb.DeleteToolsResponse(deleted=deleted)

    async def SetToolStatus(
        self, request: rpb.SetToolStatusRequest, context: grpc.aio.ServicerContext
    ) -> rpb.SetToolStatusResponse:
        status = convert.STATUSES.get(request.status)
        enabled = request.enabled if request.HasField("enabled") else None
        if status is None and enabled is None:
            raise InvalidArgument(
                "nothing to change: give status or enabled",
                field_violations=[("status", "unspecified")],
            )
        convert.check_ids([("name", request.name)])
        if len(request.reason) > MAX_SHORT_TEXT_CHARS or "\x00" in request.reason:
            raise InvalidArgument(
                f"reason must be at most {MAX_SHORT_TEXT_CHARS} characters, without NUL",
                field_violations=[("reason", "too long or holds NUL")],
            )
        tool = await self._db(
            "the tool status's write",
            self._core.repo.set_status,
            request.name,
            status,
            request.reason,
            enabled,
        )
        self._core.invalidate(request.name)
        return rpb.SetToolStatusResponse(tool=tool_to_pb(tool))

    async def GetContractStats(
        self, request: rpb.GetContractStatsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetContractStatsResponse:
        # The counters are of every tenant's calls (the request names no tenant): operators
        # only, when the registry checks API keys.
        require_admin_caller("GetContractStats (every tenant's calls)")
        counters = self._core.contract_stats
        stats = counters.snapshot(request.tool_name or None)
        return rpb.GetContractStatsResponse(
            stats=[contract_stats_to_pb(s) for s in stats],
            counting_since=convert.to_timestamp(counters.since),
            instance=self._instance,
        )

    async def GetUsageStats(
        self, request: rpb.GetUsageStatsRequest, context: grpc.aio.ServicerContext
    ) -> rpb.GetUsageStatsResponse:
        if self._sessions is None:
            raise FailedPrecondition("this registry has no database for usage statistics")
        convert.check_ids([("tool_name", request.tool_name), ("tenant_id", request.tenant_id)])
        since = None
        if request.HasField("since"):
            try:
                since = request.since.ToDatetime(tzinfo=UTC)
            except (ValueError, OverflowError, OSError) as exc:
                raise InvalidArgument(
                    f"since is not a valid timestamp: {exc}",
                    field_violations=[("since", "out of range")],
                ) from None
        stats, used_since = await self._db(
            "the usage statistics' query",
            usage_stats,
            self._sessions,
            group_by=request.group_by or "tool",
            since=since,
            tool_name=request.tool_name,
            tenant_id=request.tenant_id,
        )
        return rpb.GetUsageStatsResponse(
            stats=[rpb.UsageStats(**s.__dict__) for s in stats],
            since=convert.to_timestamp(used_since),
            total_cost_usd=sum(s.cost_usd for s in stats),
        )
