"""The dispatcher's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry import context as otel_context

from services.dispatcher.core import Dispatcher, DispatchOutcome
from services.dispatcher.guardrails import PolicyRule
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


def _outcome_to_pb(o: DispatchOutcome) -> dpb.DispatchToolCallResponse:
    return dpb.DispatchToolCallResponse(
        result=o.result,
        duration_ms=o.duration_ms,
        warnings=o.warnings,
        args_hash=o.args_hash,
        tool_use_id=o.tool_use_id,
    )


def _page_limit(requested: int, *, default: int, cap: int) -> int:
    """A list RPC's `limit`: 0 means `default`, larger values are capped, negatives refused."""
    if requested < 0:
        raise InvalidArgument("limit must be >= 0", field_violations=[("limit", "negative")])
    return min(requested or default, cap)


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

    async def Cancel(
        self, request: dpb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> dpb.CancelResponse:
        outcome = await self._core.cancel(request.tenant_id, request.conversation_id)
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
        rule = await self._core.add_rule(rule_from_pb(request.rule))
        return dpb.AddPolicyRuleResponse(rule=rule_to_pb(rule))

    async def ListPolicyRules(
        self, request: dpb.ListPolicyRulesRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListPolicyRulesResponse:
        rules = await self._core.list_rules(request.tenant_id, request.include_disabled)
        return dpb.ListPolicyRulesResponse(rules=[rule_to_pb(r) for r in rules])

    async def DisablePolicyRule(
        self, request: dpb.DisablePolicyRuleRequest, context: grpc.aio.ServicerContext
    ) -> dpb.DisablePolicyRuleResponse:
        rule = await self._core.disable_rule(request.id)
        return dpb.DisablePolicyRuleResponse(rule=rule_to_pb(rule))

    async def ListExecutionLog(
        self, request: dpb.ListExecutionLogRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListExecutionLogResponse:
        limit = _page_limit(request.limit, default=50, cap=MAX_LOG_ROWS)
        entries = await asyncio.to_thread(
            self._log.list_log,
            tool_name=request.tool_name,
            tenant_id=request.tenant_id,
            conversation_id=request.conversation_id,
            limit=limit,
        )
        return dpb.ListExecutionLogResponse(
            entries=[
                dpb.ExecutionLogEntry(
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
                    created_at=convert.to_timestamp(e.created_at),
                )
                for e in entries
            ]
        )

    async def ListConversationEvents(
        self, request: dpb.ListConversationEventsRequest, context: grpc.aio.ServicerContext
    ) -> dpb.ListConversationEventsResponse:
        if not request.conversation_id:
            raise InvalidArgument(
                "conversation_id is required", field_violations=[("conversation_id", "empty")]
            )
        limit = _page_limit(request.limit, default=200, cap=MAX_EVENTS)
        events = await asyncio.to_thread(
            self._log.list_events,
            tenant_id=request.tenant_id,
            conversation_id=request.conversation_id,
            event_type=request.event_type,
            limit=limit,
        )
        return dpb.ListConversationEventsResponse(
            events=[
                dpb.ConversationEvent(
                    id=e.id,
                    event_type=e.event_type,
                    data_json=e.data_json,
                    tool_use_id=e.tool_use_id,
                    created_at=convert.to_timestamp(e.created_at),
                )
                for e in events
            ]
        )
