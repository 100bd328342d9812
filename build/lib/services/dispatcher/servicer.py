"""The dispatcher's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio

import grpc

from services.dispatcher.core import Dispatcher, DispatchOutcome
from services.dispatcher.logstore import CallLog
from shared import convert
from shared.clients import traced_call
from shared.errors import InvalidArgument
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc

MAX_LOG_ROWS = 1000
MAX_EVENTS = 5000


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


def _outcome_to_pb(o: DispatchOutcome) -> dpb.DispatchToolCallResponse:
    return dpb.DispatchToolCallResponse(
        result=o.result,
        duration_ms=o.duration_ms,
        warnings=o.warnings,
        args_hash=o.args_hash,
        tool_use_id=o.tool_use_id,
    )


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServiceServicer):
    def __init__(self, core: Dispatcher, log: CallLog) -> None:
        self._core = core
        self._log = log

    async def DispatchToolCall(
        self, request: dpb.DispatchToolCallRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DispatchToolCallResponse:
        return _outcome_to_pb(await self._core.dispatch(request.tool_use, request.context))

    async def DispatchToolCalls(
        self, request: dpb.DispatchToolCallsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DispatchToolCallsResponse:
        outcomes = await self._core.dispatch_many(list(request.tool_uses), request.context)
        return dpb.DispatchToolCallsResponse(results=[_outcome_to_pb(o) for o in outcomes])

    async def ListExecutionLog(
        self, request: dpb.ListExecutionLogRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListExecutionLogResponse:
        if request.limit < 0:
            raise InvalidArgument("limit must be >= 0", field_violations=[("limit", "negative")])
        limit = min(request.limit or 50, MAX_LOG_ROWS)
        entries = await asyncio.to_thread(
            self._log.list_log,
            tool_name=request.tool_name,
            tenant_id=request.tenant_id,
            conversation_id=request.conversation_id,
            limit=limit,
        )
        out = []
        for e in entries:
            m = dpb.ExecutionLogEntry(
                id=e.id,
                tool_name=e.tool_name,
                tenant_id=e.tenant_id,
                input_json=convert.dumps(e.input_data),
                output_summary=e.output_summary,
                success=e.success,
                error=e.error or "",
                execution_ms=e.execution_ms,
                conversation_id=e.conversation_id,
                user_id=e.user_id,
                tool_use_id=e.tool_use_id,
                args_hash=e.args_hash,
                trace_id=e.trace_id,
            )
            ts = convert.to_timestamp(e.created_at)
            if ts is not None:
                m.created_at.CopyFrom(ts)
            out.append(m)
        return dpb.ListExecutionLogResponse(entries=out)

    async def ListConversationEvents(
        self, request: dpb.ListConversationEventsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListConversationEventsResponse:
        if not request.conversation_id:
            raise InvalidArgument(
                "conversation_id is required", field_violations=[("conversation_id", "empty")]
            )
        if request.limit < 0:
            raise InvalidArgument("limit must be >= 0", field_violations=[("limit", "negative")])
        limit = min(request.limit or 200, MAX_EVENTS)
        events = await asyncio.to_thread(
            self._log.list_events,
            tenant_id=request.tenant_id,
            conversation_id=request.conversation_id,
            event_type=request.event_type,
            limit=limit,
        )
        out = []
        for e in events:
            m = dpb.ConversationEvent(
                id=e.id, event_type=e.event_type, data_json=e.data_json, tool_use_id=e.tool_use_id
            )
            ts = convert.to_timestamp(e.created_at)
            if ts is not None:
                m.created_at.CopyFrom(ts)
            out.append(m)
        return dpb.ListConversationEventsResponse(events=out)
