"""The dispatcher's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.dispatcher.core import Dispatcher
from services.dispatcher.effects import ExportEntry, ExportFiles
from services.dispatcher.guardrails import PolicyRule
from services.dispatcher.logstore import LISTED_INPUT_CHARS, CallLog
from shared import convert
from shared.auth import ApiKeys, Principal
from shared.clients import mark_cancelled_client, traced_call
from shared.config import DEFAULT_DB_WAIT_S
from shared.db.engine import db_thread
from shared.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from shared.rpc_errors import from_rpc_error
from shared.server import deadline_passed
from shared.telemetry.tracing import inject_metadata, tracer
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)

MAX_LOG_ROWS = 1000
MAX_EVENTS = 5000
MAX_EXPORTS = 1000
# A listing page stops at about this many bytes (at least one entry), under the 4 MB message
# limit every gRPC client has by default.
PAGE_BYTES = 3_500_000
EVENT_CHUNK_BYTES = 1024 * 1024
GET_TOOL_TIMEOUT_S = 5.0

RULE_KINDS = {
    dpb.POLICY_RULE_KIND_DENY_TOOL: "deny_tool",
    dpb.POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL: "require_prior_tool",
    dpb.POLICY_RULE_KIND_ARG_CONSTRAINT: "arg_constraint",
    dpb.POLICY_RULE_KIND_RATE_LIMIT: "rate_limit",
}
RULE_KIND_VALUES = {v: k for k, v in RULE_KINDS.items()}
POLICY_MODES = {
    dpb.POLICY_MODE_UNSPECIFIED: "blocking",
    dpb.POLICY_MODE_BLOCKING: "blocking",
    dpb.POLICY_MODE_ADVISORY: "advisory",
}


class GrpcRegistryGateway:
    """RegistryGateway over gRPC: a CLIENT span, the deadline, and status mapping."""

    def __init__(self, stub: registry_pb2_grpc.RegistryServiceStub, tracing: bool) -> None:
        self._stub = stub
        self._tracing = tracing

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        return await traced_call(
            self._stub.ExecuteTool,
            request,
            span_name="toolmesh.registry.v1.RegistryService/ExecuteTool",
            peer_service="registry",
            timeout=timeout,
            tracing=self._tracing,
        )

    async def execute_stream(
        self,
        request: rpb.ExecuteToolRequest,
        timeout: float,
        on_progress: Callable[[Mapping[str, Any]], None],
    ) -> rpb.ExecuteToolResponse:
        """ExecuteToolStream: each progress report goes to `on_progress` as it arrives; the
        result is returned. Cancelling the awaiting task cancels the stream (and the handler)."""
        span_name = "toolmesh.registry.v1.RegistryService/ExecuteToolStream"
        with tracer().start_as_current_span(
            span_name,
            kind=SpanKind.CLIENT,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": "toolmesh.registry.v1.RegistryService",
                "rpc.method": "ExecuteToolStream",
                "peer.service": "registry",
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            metadata = inject_metadata({}) if self._tracing else {}
            call = self._stub.ExecuteToolStream(
                rpb.ExecuteToolStreamRequest(
                    name=request.name, input_json=request.input_json, context=request.context
                ),
                metadata=tuple(metadata.items()),
                timeout=timeout,
            )
            try:
                async for message in call:
                    if message.HasField("progress"):
                        p = message.progress
                        report: dict[str, Any] = {"message": p.message}
                        if p.HasField("fraction"):
                            report["fraction"] = p.fraction
                        if p.data_json:
                            report["data"] = convert.parse_json_object(p.data_json, "data_json")
                        on_progress(report)
                    elif message.HasField("result"):
                        return message.result
            except asyncio.CancelledError:
                mark_cancelled_client(span)
                raise
            except grpc.aio.AioRpcError as exc:
                err = from_rpc_error(exc)
                span.set_status(Status(StatusCode.ERROR, str(err)))
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not err.metadata:
                    raise Unavailable(
                        f"registry unavailable: {exc.details()}", reason="SERVICE_UNAVAILABLE"
                    ) from None
                raise err from None
            finally:
                call.cancel()
        raise Unavailable(
            "registry ended ExecuteToolStream without a result", reason="STREAM_TRUNCATED"
        )

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        """The tool's timeout_seconds (GetTool). A cache fill rather than part of the call, so
        it is traced as its own root, not inside the caller's trace."""
        token = otel_context.attach(otel_context.Context())
        try:
            response = await traced_call(
                self._stub.GetTool,
                rpb.GetToolRequest(name=name, tenant_id=tenant_id),
                span_name="toolmesh.registry.v1.RegistryService/GetTool",
                peer_service="registry",
                timeout=GET_TOOL_TIMEOUT_S,
                tracing=self._tracing,
            )
        finally:
            otel_context.detach(token)
        return response.tool.timeout_seconds or None


def rule_from_pb(m: dpb.PolicyRule) -> PolicyRule:
    """A rule as sent by a client (not yet validated: Dispatcher.add_rule does that)."""
    params = convert.parse_json_object(m.params_json, "rule.params_json")
    return PolicyRule(
        id=0,
        tenant_id=m.tenant_id,
        name=m.name,
        kind=RULE_KINDS.get(m.kind, ""),
        tool_name=m.tool_name,
        mode=POLICY_MODES.get(m.mode, ""),
        params=params,
        message=m.message,
        created_by=m.created_by,
    )


def rule_to_pb(r: PolicyRule) -> dpb.PolicyRule:
    msg = dpb.PolicyRule(
        id=r.id,
        tenant_id=r.tenant_id,
        name=r.name,
        kind=RULE_KIND_VALUES.get(r.kind, dpb.POLICY_RULE_KIND_UNSPECIFIED),
        tool_name=r.tool_name,
        mode=dpb.POLICY_MODE_ADVISORY if r.mode == "advisory" else dpb.POLICY_MODE_BLOCKING,
        params_json=convert.dumps(dict(r.params)),
        message=r.message,
        enabled=r.enabled,
        created_by=r.created_by,
    )
    ts = convert.to_timestamp(r.created_at)
    if ts is not None:
        msg.created_at.CopyFrom(ts)
    return msg


# What a batch's response may hold: every result is at most convert.MAX_RESULT_BYTES, but
# several together can pass the 64 MB a gRPC message may have, and then the client got only
# RESOURCE_EXHAUSTED and none of the results of calls that had run.
MAX_BATCH_RESPONSE_BYTES = 48 * 1024 * 1024


def _fit_batch(response: dpb.DispatchToolCallsResponse) -> None:
    """Make the batch's response fit MAX_BATCH_RESPONSE_BYTES: the largest results are
    replaced, one by one, by an Err saying so (the calls ran and are logged in full; the
    result can be read from the conversation's events)."""
    sizes = [r.ByteSize() for r in response.results]
    total = sum(sizes)
    while total > MAX_BATCH_RESPONSE_BYTES:
        i = max(range(len(sizes)), key=sizes.__getitem__)
        item = response.results[i]
        message = (
            f"the result of {item.tool_use_id or f'call {i}'} is {sizes[i]} bytes: with the "
            f"batch's other results it is over the {MAX_BATCH_RESPONSE_BYTES}-byte limit of "
            "one response. The call ran and its full result is in the conversation's events "
            "(ListConversationEvents; GetConversationEventData streams a large one); call it "
            "alone, or ask for less"
        )
        item.result.CopyFrom(convert.error_result_pb(message, "batch_result_too_large"))
        total += item.ByteSize() - sizes[i]
        sizes[i] = item.ByteSize()


def export_to_pb(e: ExportEntry) -> dpb.ExportFile:
    return dpb.ExportFile(
        file_id=e.file_id,
        filename=e.filename,
        path=e.path,
        mime_type=e.mime_type,
        size_bytes=e.size_bytes,
        source_tool=e.source_tool,
        original_filename=e.original_filename,
        conversation_id=e.conversation_id,
        tool_use_id=e.tool_use_id,
        created_at=convert.to_timestamp(e.created_at),
        tenant_id=e.tenant_id,
    )


class _Pending:
    """One message of a streamed call waiting to be sent, kept as the chunk's data (built into
    its protobuf only when sent, so a superseded progress costs no message)."""

    __slots__ = ("data", "key", "kind", "message", "parts", "size")

    def __init__(self, kind: str, key: str = "", data: Mapping[str, Any] | None = None) -> None:
        self.kind = kind
        self.key = key
        self.data = data
        self.parts: list[str] = []
        self.size = 0
        self.message: dpb.DispatchToolCallStreamResponse | None = None


def _progress_message(data: Mapping[str, Any]) -> dpb.DispatchToolCallStreamResponse:
    update = dpb.ProgressUpdate(
        tool_use_id=str(data.get("tool_use_id", "")), message=str(data.get("message", ""))
    )
    if data.get("fraction") is not None:
        update.fraction = float(data["fraction"])
    if data.get("data"):
        update.data_json = convert.dumps(data["data"])
    return dpb.DispatchToolCallStreamResponse(progress=update)


class CoalescingDisplay:
    """The display of a streamed call (the DisplayHandle the chokepoint writes to) and the
    outbox `DispatchToolCallStream` drains. Writing to it never waits, whatever the client's
    pace, and what waits in it is bounded; messages leave in the order they were written:

    * progress is a state: a progress update replaces the one of the same tool_use_id not yet
      sent (which is removed, the newer one taking the end of the line), so at most one per
      call waits however fast the tool reports and however slowly the client reads;
    * text is never dropped (it is the result's own text, bounded by the result's size), and
      arrives in the chunks it was written in while fewer than MERGE_AFTER messages wait; past
      that, a text delta is merged into the one of the same tool_use_id waiting last, up to
      MAX_TEXT_CHARS characters a message (a large result is fewer, larger messages);
    * cards and export notices are never merged or replaced. They come from the call's result
      (bounded by its size, and also in the final result the client gets), so the caps
      MAX_PENDING_ITEMS / MAX_PENDING_BYTES of those waiting are a guard that a real result
      does not reach: past them a card or notice is left out of the stream, counted in
      `dropped` and logged (a WARNING at the first, the total when the stream ends). Waiting
      for room instead is not an option: the chokepoint writes here synchronously, on the
      event loop, from the dispatch itself, which must never wait for a client;
    * the final result is not written here: the RPC sends it after everything written.
    """

    MERGE_AFTER = 16
    MAX_TEXT_CHARS = 64 * 1024
    MAX_PENDING_ITEMS = 4096
    MAX_PENDING_BYTES = 16 * 1024 * 1024

    def __init__(self) -> None:
        self._outbox: deque[_Pending] = deque()
        self._progress_of: dict[str, _Pending] = {}
        self._item_count = 0
        self._item_bytes = 0
        # Set when something waits to be sent (or the RPC is told to look again).
        self.ready = asyncio.Event()
        self.superseded = 0
        self.merged = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._outbox)

    def _push(self, entry: _Pending) -> None:
        self._outbox.append(entry)
        self.ready.set()

    def progress(self, data: Mapping[str, Any]) -> None:
        key = str(data.get("tool_use_id", ""))
        waiting = self._progress_of.get(key)
        if waiting is not None:
            self.superseded += 1
            if self._outbox[-1] is waiting:  # the usual case in a flood: replace in place
                waiting.data = data
                return
            self._outbox.remove(waiting)
        entry = _Pending("progress", key, data)
        self._progress_of[key] = entry
        self._push(entry)

    def text(self, data: Mapping[str, Any]) -> None:
        key, chunk = str(data.get("tool_use_id", "")), str(data.get("text", ""))
        tail = self._outbox[-1] if self._outbox else None
        if (
            tail is not None
            and len(self._outbox) >= self.MERGE_AFTER
            and tail.kind == "text"
            and tail.key == key
            and tail.size + len(chunk) <= self.MAX_TEXT_CHARS
        ):
            tail.parts.append(chunk)
            tail.size += len(chunk)
            self.merged += 1
            return
        entry = _Pending("text", key)
        entry.parts.append(chunk)
        entry.size = len(chunk)
        self._push(entry)

    def card(self, data: Mapping[str, Any]) -> None:
        message = dpb.DispatchToolCallStreamResponse()
        message.card.update(dict(data))
        self._push_item(message, "card")

    def notice(self, data: Mapping[str, Any]) -> None:
        message = dpb.DispatchToolCallStreamResponse(
            export_ready=dpb.ExportReady(
                file_id=str(data.get("file_id", "")),
                filename=str(data.get("filename", "")),
                size_bytes=int(data.get("size_bytes") or 0),
                mime_type=str(data.get("mime_type", "")),
            )
        )
        self._push_item(message, "notice")

    def _push_item(self, message: dpb.DispatchToolCallStreamResponse, kind: str) -> None:
        size = message.ByteSize()
        if (
            self._item_count >= self.MAX_PENDING_ITEMS
            or self._item_bytes + size > self.MAX_PENDING_BYTES
        ):
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "streamed call: %d cards/export notices (%d bytes) wait for a slow client; "
                    "further ones are left out of the stream (they are in the final result)",
                    self._item_count,
                    self._item_bytes,
                )
            return
        entry = _Pending(kind)
        entry.message = message
        entry.size = size
        self._item_count += 1
        self._item_bytes += size
        self._push(entry)

    def pop(self) -> dpb.DispatchToolCallStreamResponse | None:
        """The next message to send, None when nothing waits (`ready` is then cleared)."""
        if not self._outbox:
            self.ready.clear()
            return None
        entry = self._outbox.popleft()
        if entry.kind == "progress":
            del self._progress_of[entry.key]
            assert entry.data is not None
            return _progress_message(entry.data)
        if entry.kind == "text":
            return dpb.DispatchToolCallStreamResponse(
                text_delta=dpb.TextDelta(tool_use_id=entry.key, text="".join(entry.parts))
            )
        self._item_count -= 1
        self._item_bytes -= entry.size
        assert entry.message is not None
        return entry.message


def _page_limit(requested: int, *, default: int, cap: int) -> int:
    """A list RPC's `limit`: 0 means `default`, larger values are capped, negatives refused."""
    if requested < 0:
        raise InvalidArgument("limit must be >= 0", field_violations=[("limit", "negative")])
    return min(requested or default, cap)


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServiceServicer):
    def __init__(
        self,
        core: Dispatcher,
        log: CallLog,
        auth: ApiKeys | None = None,
        exports: ExportFiles | None = None,
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        self._core = core
        self._log = log
        self._auth = auth
        self._exports = exports
        self._db_wait_s = db_wait_s

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        """The authenticated caller, or None when the dispatcher runs open."""
        if self._auth is None:
            return None
        return self._auth.authenticate(context.invocation_metadata())

    def _tenant(self, context: grpc.aio.ServicerContext, requested: str) -> str:
        principal = self._principal(context)
        return requested if principal is None else principal.tenant_for(requested)

    def _call_context(
        self, context: grpc.aio.ServicerContext, requested: pb.CallContext
    ) -> pb.CallContext:
        """The call's context with the tenant and capabilities of the authenticated caller."""
        principal = self._principal(context)
        if principal is None:
            return requested
        ctx = pb.CallContext()
        ctx.CopyFrom(requested)
        ctx.tenant_id = principal.tenant_for(requested.tenant_id)
        del ctx.capabilities[:]
        ctx.capabilities.extend(principal.capabilities_for(requested.capabilities))
        return ctx

    async def DispatchToolCall(
        self, request: dpb.DispatchToolCallRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DispatchToolCallResponse:
        ctx = self._call_context(context, request.context)
        return (await self._core.dispatch(request.tool_use, ctx)).to_pb()

    async def DispatchToolCalls(
        self, request: dpb.DispatchToolCallsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DispatchToolCallsResponse:
        ctx = self._call_context(context, request.context)
        outcomes = await self._core.dispatch_many(list(request.tool_uses), ctx)
        response = dpb.DispatchToolCallsResponse(results=[o.to_pb() for o in outcomes])
        _fit_batch(response)
        return response

    async def DispatchToolCallStream(
        self, request: dpb.DispatchToolCallStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dpb.DispatchToolCallStreamResponse]:
        """The call's progress, cards, text and export notices as they happen, then its result.
        The call writes them to a CoalescingDisplay, which never makes it wait: a client that
        reads slowly gets the latest progress rather than every one, and the call runs at its
        own pace. A client that goes away (or whose deadline passes) stops the call."""
        ctx = self._call_context(context, request.context)
        outbox = CoalescingDisplay()
        stop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            self._core.dispatch(request.tool_use, ctx, display=outbox, stop=stop)
        )
        task.add_done_callback(lambda _: outbox.ready.set())
        try:
            while True:
                message = outbox.pop()
                if message is not None:
                    yield message
                elif task.done():
                    break
                else:
                    await outbox.ready.wait()
            yield dpb.DispatchToolCallStreamResponse(result=task.result().to_pb())
        finally:
            if outbox.superseded or outbox.merged or outbox.dropped:
                log = logger.warning if outbox.dropped else logger.debug
                log(
                    "streamed call %s: %d progress updates superseded, %d text deltas merged, "
                    "%d cards/export notices left out of the stream",
                    request.tool_use.id,
                    outbox.superseded,
                    outbox.merged,
                    outbox.dropped,
                )
            if not task.done():
                # The client went away: stop the call (its handler is cancelled) and let the
                # dispatcher log it as cancelled before this RPC ends.
                if not stop.done():
                    stop.set_result(
                        "the client's deadline passed"
                        if deadline_passed(context)
                        else "the client cancelled the stream"
                    )
                await asyncio.wait({task}, timeout=30)

    async def ListExports(
        self, request: dpb.ListExportsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListExportsResponse:
        exports = self._require_exports()
        convert.check_ids(
            [("tenant_id", request.tenant_id), ("conversation_id", request.conversation_id)]
        )
        limit = _page_limit(request.limit, default=50, cap=MAX_EXPORTS)
        tenant = self._tenant(context, request.tenant_id)
        entries = await exports.list(tenant, request.conversation_id, limit)
        return dpb.ListExportsResponse(exports=[export_to_pb(e) for e in entries])

    async def GetExport(
        self, request: dpb.GetExportRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dpb.GetExportResponse]:
        exports = self._require_exports()
        if not request.file_id:
            raise InvalidArgument("file_id is required", field_violations=[("file_id", "empty")])
        convert.check_ids([("tenant_id", request.tenant_id), ("file_id", request.file_id)])
        tenant = self._tenant(context, request.tenant_id)
        entry, path = await exports.open(tenant, request.file_id)
        yield dpb.GetExportResponse(info=export_to_pb(entry))
        async for chunk in exports.chunks(path):
            yield dpb.GetExportResponse(chunk=chunk)

    def _require_exports(self) -> ExportFiles:
        if self._exports is None:
            raise FailedPrecondition("this dispatcher has no export store", reason="NO_EXPORTS")
        return self._exports

    async def Cancel(
        self, request: dpb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> dpb.CancelResponse:
        convert.check_ids(
            [("tenant_id", request.tenant_id), ("conversation_id", request.conversation_id)]
        )
        tenant = self._tenant(context, request.tenant_id)
        outcome = await self._core.cancel(tenant, request.conversation_id)
        return dpb.CancelResponse(
            cancelled_calls=len(outcome.cancelled_tool_use_ids),
            message=outcome.message,
            cancelled_tool_use_ids=outcome.cancelled_tool_use_ids,
            known_conversation=outcome.known_conversation,
            cancel_epoch=outcome.cancel_epoch,
        )

    async def AddPolicyRule(
        self, request: dpb.AddPolicyRuleRequest, context: grpc.aio.ServicerContext
    ) -> dpb.AddPolicyRuleResponse:
        principal = self._principal(context)
        if principal is not None:
            principal.require_admin("adding a policy rule")
        rule = await self._core.add_rule(rule_from_pb(request.rule))
        return dpb.AddPolicyRuleResponse(rule=rule_to_pb(rule))

    async def ListPolicyRules(
        self, request: dpb.ListPolicyRulesRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListPolicyRulesResponse:
        convert.check_ids([("tenant_id", request.tenant_id)])
        tenant = self._tenant(context, request.tenant_id)
        rules = await self._core.list_rules(tenant, request.include_disabled)
        return dpb.ListPolicyRulesResponse(rules=[rule_to_pb(r) for r in rules])

    async def DisablePolicyRule(
        self, request: dpb.DisablePolicyRuleRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DisablePolicyRuleResponse:
        principal = self._principal(context)
        if principal is not None:
            principal.require_admin("disabling a policy rule")
        rule = await self._core.disable_rule(request.id)
        return dpb.DisablePolicyRuleResponse(rule=rule_to_pb(rule))

    async def ListExecutionLog(
        self, request: dpb.ListExecutionLogRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListExecutionLogResponse:
        convert.check_ids(
            [
                ("tool_name", request.tool_name),
                ("tenant_id", request.tenant_id),
                ("conversation_id", request.conversation_id),
                ("model", request.model),
            ]
        )
        limit = _page_limit(request.limit, default=50, cap=MAX_LOG_ROWS)
        page = await db_thread(
            self._db_wait_s,
            "a query of the execution log",
            self._log.page_log,
            tool_name=request.tool_name,
            tenant_id=self._tenant(context, request.tenant_id),
            conversation_id=request.conversation_id,
            limit=limit,
            before_id=max(request.before_id, 0),
            max_bytes=PAGE_BYTES,
            model=request.model,
        )
        return dpb.ListExecutionLogResponse(
            next_before_id=page.next_id,
            entries=[
                dpb.ExecutionLogEntry(
                    id=e.id,
                    tool_name=e.tool_name,
                    tenant_id=e.tenant_id,
                    input_json=e.input_json[:LISTED_INPUT_CHARS],
                    input_truncated=len(e.input_json) > LISTED_INPUT_CHARS,
                    output_summary=e.output_summary,
                    success=e.success,
                    error=e.error or "",
                    execution_ms=e.execution_ms,
                    conversation_id=e.conversation_id,
                    user_id=e.user_id,
                    tool_use_id=e.tool_use_id,
                    args_hash=e.args_hash,
                    trace_id=e.trace_id,
                    created_at=convert.to_timestamp(e.created_at),
                    model=e.model,
                )
                for e in page.entries
            ],
        )

    async def ListConversationEvents(
        self, request: dpb.ListConversationEventsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListConversationEventsResponse:
        if not request.conversation_id:
            raise InvalidArgument(
                "conversation_id is required", field_violations=[("conversation_id", "empty")]
            )
        convert.check_ids(
            [
                ("tenant_id", request.tenant_id),
                ("conversation_id", request.conversation_id),
                ("event_type", request.event_type),
            ]
        )
        limit = _page_limit(request.limit, default=200, cap=MAX_EVENTS)
        page = await db_thread(
            self._db_wait_s,
            "a query of the conversation's events",
            self._log.page_events,
            tenant_id=self._tenant(context, request.tenant_id),
            conversation_id=request.conversation_id,
            event_type=request.event_type,
            limit=limit,
            after_id=max(request.after_id, 0),
            max_bytes=PAGE_BYTES,
        )
        return dpb.ListConversationEventsResponse(
            next_after_id=page.next_id,
            events=[
                dpb.ConversationEvent(
                    id=e.id,
                    event_type=e.event_type,
                    data_json=e.data_json,
                    tool_use_id=e.tool_use_id,
                    created_at=convert.to_timestamp(e.created_at),
                    data_truncated=e.truncated,
                    data_bytes=e.data_bytes,
                )
                for e in page.entries
            ],
        )

    async def GetConversationEventData(
        self, request: dpb.GetConversationEventDataRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dpb.GetConversationEventDataResponse]:
        convert.check_ids(
            [("tenant_id", request.tenant_id), ("conversation_id", request.conversation_id)]
        )
        data = await db_thread(
            self._db_wait_s,
            "a query of an event's data",
            self._log.event_data,
            tenant_id=self._tenant(context, request.tenant_id),
            conversation_id=request.conversation_id,
            event_id=request.event_id,
        )
        if data is None:
            raise NotFound(
                f"no event {request.event_id} in conversation {request.conversation_id!r}",
                reason="EVENT_NOT_FOUND",
            )
        payload = data.encode("utf-8")
        for start in range(0, len(payload), EVENT_CHUNK_BYTES):
            yield dpb.GetConversationEventDataResponse(
                chunk=payload[start : start + EVENT_CHUNK_BYTES]
            )
