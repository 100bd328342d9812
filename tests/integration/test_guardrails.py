"""The dispatcher's guardrails through the real mesh (dispatcher and registry processes, real
gRPC): policy rules and their escalating wording, advisory warnings, rate limits, RBAC and
tenancy, the repeat-failure hint, the loop guard, cancellation that stops the work on this and
on another dispatcher replica, concurrent batches guarded in order, and the decision / outcome /
policy_violation events."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future

import grpc
import pytest

from shared.cli.guardrails import add_subcommands
from shared.config import Settings
from shared.launcher import ServiceProcess, start_service
from shared.rpc_errors import from_rpc_error
from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration


def err_kind(response: dpb.DispatchToolCallResponse) -> str:
    env = response.result.envelope
    return env.err.err_kind if env.WhichOneof("kind") == "err" else str(env.WhichOneof("kind"))


def add_rule(mesh: Mesh, **fields: object) -> dpb.PolicyRule:
    params = fields.pop("params", {})
    rule = dpb.PolicyRule(params_json=json.dumps(params), **fields)  # type: ignore[arg-type]
    return mesh.dispatcher.AddPolicyRule(dpb.AddPolicyRuleRequest(rule=rule)).rule


def events_of(mesh: Mesh, conversation: str, tenant: str, event_type: str = "") -> list[dict]:
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(
            conversation_id=conversation, tenant_id=tenant, event_type=event_type, limit=1000
        )
    ).events
    return [dict(json.loads(e.data_json), event_type=e.event_type) for e in events]


def test_a_blocking_rule_refuses_with_wording_that_escalates_and_is_logged(mesh: Mesh) -> None:
    tenant, conv = "t-escalate", "escalate"
    rule = add_rule(
        mesh,
        tenant_id=tenant,
        name="describe-first",
        kind=dpb.POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL,
        tool_name="query",
        mode=dpb.POLICY_MODE_BLOCKING,
        params={"prior_tool": "describe_entry"},
        message="describe the dataset before querying it",
    )
    refusals = [
        mesh.call("query", json.dumps({"sql": f"select {i}"}), tenant=tenant, conversation=conv)
        for i in range(4)
    ]
    assert [err_kind(r) for r in refusals] == ["policy_violation"] * 4
    texts = [r.result.envelope.err.message for r in refusals]
    assert "Policy 'describe-first': describe the dataset before querying it." in texts[0]
    assert "Second time" in texts[1]
    assert "STOP. You've skipped this 3 times." in texts[2]
    assert "STOP. You've skipped this 4 times." in texts[3]
    # Refused calls are still logged, with their events.
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conv, tenant_id=tenant)
    ).entries
    assert [(e.tool_name, e.success) for e in entries] == [("query", False)] * 4
    violations = events_of(mesh, conv, tenant, "policy_violation")
    assert [(v["rule_id"], v["count"]) for v in violations] == [(rule.id, n) for n in (1, 2, 3, 4)]
    decisions = events_of(mesh, conv, tenant, "decision")
    assert {d["refused_by"] for d in decisions} == {"policy_violation"}

    # Once describe_entry has succeeded in the conversation, the rule is satisfied.
    assert (
        err_kind(
            mesh.call("load_dataset", '{"path": "people.csv"}', tenant=tenant, conversation=conv)
        )
        == "ok"
    )
    assert (
        err_kind(
            mesh.call("describe_entry", '{"name": "people"}', tenant=tenant, conversation=conv)
        )
        == "ok"
    )
    allowed = mesh.call(
        "query", '{"sql": "select count(*) from people"}', tenant=tenant, conversation=conv
    )
    assert err_kind(allowed) == "ok"
    assert list(allowed.warnings) == []


def test_an_advisory_rule_warns_and_lets_the_call_run(mesh: Mesh) -> None:
    tenant = "t-advisory"
    add_rule(
        mesh,
        tenant_id=tenant,
        name="no-secrets",
        kind=dpb.POLICY_RULE_KIND_ARG_CONSTRAINT,
        tool_name="ping",
        mode=dpb.POLICY_MODE_ADVISORY,
        params={"path": "$.echo.note", "pattern": "(?i)secret", "must_match": False},
    )
    flagged = mesh.call(
        "ping", '{"echo": {"note": "my SECRET"}}', tenant=tenant, conversation="adv"
    )
    assert err_kind(flagged) == "ok"
    assert len(flagged.warnings) == 1
    assert flagged.warnings[0].startswith("Policy 'no-secrets': $.echo.note must not match")
    clean = mesh.call("ping", '{"echo": {"note": "fine"}}', tenant=tenant, conversation="adv")
    assert list(clean.warnings) == []
    again = mesh.call(
        "ping", '{"echo": {"note": "secret again"}}', tenant=tenant, conversation="adv"
    )
    assert "Second time" in again.warnings[0]


def test_a_deny_rule_targets_callers_lacking_a_capability_and_can_be_disabled(mesh: Mesh) -> None:
    tenant = "t-deny"
    rule = add_rule(
        mesh,
        tenant_id=tenant,
        name="ops-only",
        kind=dpb.POLICY_RULE_KIND_DENY_TOOL,
        tool_name="ping",
        params={"unless_capability": "ops"},
    )
    assert rule.mode == dpb.POLICY_MODE_BLOCKING  # unspecified means blocking
    assert err_kind(mesh.call("ping", tenant=tenant, conversation="d1")) == "policy_violation"
    assert (
        err_kind(mesh.call("ping", tenant=tenant, conversation="d2", capabilities=("ops",))) == "ok"
    )
    assert err_kind(mesh.call("ping", tenant="t-other", conversation="d3")) == "ok"

    listed = mesh.dispatcher.ListPolicyRules(dpb.ListPolicyRulesRequest(tenant_id=tenant)).rules
    assert [r.id for r in listed] == [rule.id]
    disabled = mesh.dispatcher.DisablePolicyRule(dpb.DisablePolicyRuleRequest(id=rule.id)).rule
    assert not disabled.enabled
    assert mesh.dispatcher.ListPolicyRules(dpb.ListPolicyRulesRequest(tenant_id=tenant)).rules == []
    assert err_kind(mesh.call("ping", tenant=tenant, conversation="d4")) == "ok"
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.DisablePolicyRule(dpb.DisablePolicyRuleRequest(id=999_999))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_rate_limit_counts_calls_per_tenant_and_tool(mesh: Mesh) -> None:
    tenant = "t-rate"
    add_rule(
        mesh,
        tenant_id=tenant,
        name="two-pings",
        kind=dpb.POLICY_RULE_KIND_RATE_LIMIT,
        tool_name="ping",
        params={"max_calls": 2, "window_seconds": 3600},
    )
    kinds = [
        err_kind(mesh.call("ping", json.dumps({"echo": i}), tenant=tenant, conversation=f"r{i}"))
        for i in range(3)
    ]
    assert kinds == ["ok", "ok", "policy_violation"]
    assert err_kind(mesh.call("ping", tenant="t-rate-other", conversation="r9")) == "ok"


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        (dpb.POLICY_RULE_KIND_UNSPECIFIED, {}, "rule.kind"),
        (
            dpb.POLICY_RULE_KIND_ARG_CONSTRAINT,
            {"path": "$..x", "pattern": "a", "must_match": True},
            "rule.params_json.path",
        ),
        (
            dpb.POLICY_RULE_KIND_ARG_CONSTRAINT,
            {"path": "$.x", "pattern": "(", "must_match": True},
            "rule.params_json.pattern",
        ),
        (
            dpb.POLICY_RULE_KIND_RATE_LIMIT,
            {"max_calls": -1, "window_seconds": 5},
            "rule.params_json.max_calls",
        ),
    ],
)
def test_a_malformed_rule_is_invalid_argument_with_the_reason(
    mesh: Mesh, kind: int, params: dict, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        add_rule(mesh, tenant_id="t-bad", name="bad", kind=kind, tool_name="ping", params=params)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(caught.value)
    assert err.reason == "INVALID_POLICY_RULE"
    assert field in [f for f, _ in err.field_violations]


def test_rule_params_that_are_not_a_json_object_are_invalid_argument(mesh: Mesh) -> None:
    rule = dpb.PolicyRule(
        tenant_id="t",
        name="x",
        kind=dpb.POLICY_RULE_KIND_DENY_TOOL,
        tool_name="ping",
        params_json="[1]",
    )
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.AddPolicyRule(dpb.AddPolicyRuleRequest(rule=rule))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rule.params_json" in [f for f, _ in from_rpc_error(caught.value).field_violations]


def test_a_tool_requiring_capabilities_is_permission_denied_and_invisible_to_other_tenants(
    mesh: Mesh,
) -> None:
    mesh.registry.UpsertTools(
        rpb.UpsertToolsRequest(
            tools=[
                pb.ToolDefinition(
                    name="rbac_probe",
                    description="custom tool that needs the admin capability",
                    input_schema_json='{"type": "object"}',
                    tool_type=pb.TOOL_TYPE_CUSTOM,
                    status=pb.TOOL_STATUS_APPROVED,
                    enabled=True,
                    tenant_id="t-rbac",
                    required_capabilities=["admin"],
                )
            ]
        )
    )
    denied = mesh.call("rbac_probe", tenant="t-rbac", conversation="rbac")
    assert err_kind(denied) == "permission_denied"
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="rbac", tenant_id="t-rbac")
    ).entries
    assert [(e.tool_name, e.success) for e in entries] == [("rbac_probe", False)]
    # With the capability the registry gets past RBAC (and reports the sandbox is absent).
    with pytest.raises(grpc.RpcError) as admin:
        mesh.call("rbac_probe", tenant="t-rbac", conversation="rbac2", capabilities=("admin",))
    assert from_rpc_error(admin.value).reason == "SERVICE_NOT_CONFIGURED"
    # Another tenant neither sees nor runs it.
    with pytest.raises(grpc.RpcError) as other:
        mesh.call("rbac_probe", tenant="t-intruder", conversation="rbac3", capabilities=("admin",))
    assert other.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_third_identical_failure_gets_a_hint_and_the_fourth_call_is_refused(
    mesh: Mesh,
) -> None:
    conv = "repeat-failure"
    responses = [
        mesh.call(
            "ping", json.dumps({"fail": "error", "reasoning": f"attempt {i}"}), conversation=conv
        )
        for i in range(4)
    ]
    assert [err_kind(r) for r in responses] == ["legacy", "legacy", "legacy", "loop_guard"]
    assert [len(r.warnings) for r in responses[:2]] == [0, 0]
    assert "failed 3 times" in responses[2].warnings[0]
    assert "different approach" in responses[2].warnings[0]
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conv)
    ).entries
    assert len(entries) == 4  # the refusal is logged too
    assert "loop guard" in entries[0].error


def test_the_loop_guard_sees_through_narration_keys_but_not_operative_arguments(
    mesh: Mesh,
) -> None:
    narration = ["reasoning", "explanation", "thought", "rationale", "justification"]
    narrated = [
        mesh.call("ping", json.dumps({"echo": "x", key: f"because {i}"}), conversation="narr")
        for i, key in enumerate(narration[:4])
    ]
    # (ping's schema only knows `reasoning`: the others are schema hints, but they ran.)
    assert [err_kind(r) for r in narrated] == ["ok", "hint", "hint", "loop_guard"]
    outcome = events_of(mesh, "narr", "tenant-a", "outcome")[-1]
    assert outcome["status"] == "refused"

    operative = [
        mesh.call("ping", json.dumps({"echo": f"x{i}", "reasoning": "same"}), conversation="op")
        for i in range(5)
    ]
    assert [err_kind(r) for r in operative] == ["ok"] * 5


def in_flight_call(mesh: Mesh, conv: str, tool_use_id: str, delay_ms: int) -> Future:
    request = dpb.DispatchToolCallRequest(
        tool_use=pb.ToolUse(
            id=tool_use_id, name="ping", input_json=json.dumps({"delay_ms": delay_ms})
        ),
        context=pb.CallContext(tenant_id="tenant-a", user_id="tester", conversation_id=conv),
    )
    return mesh.dispatcher.DispatchToolCall.future(request, timeout=30)  # type: ignore[no-any-return]


def wait_until(predicate, timeout: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def assert_registry_handler_stopped(mesh: Mesh, tool_use_id: str) -> None:
    """The registry's execute_tool span of the call ended at the cancellation, not after the
    seconds the handler would have slept: the handler's task was cancelled."""
    (span,) = mesh.spans.wait_for_sync(
        lambda s: (
            s.name == "execute_tool ping" and s.attributes.get("gen_ai.tool.call.id") == tool_use_id
        ),
        timeout=15,
    )
    assert span.duration_ns < 1.5e9
    assert "toolmesh.envelope.kind" not in span.attributes  # the handler never returned


def test_a_cancel_stops_a_running_call_within_a_second_and_the_handler_with_it(
    mesh: Mesh,
) -> None:
    conv = "cancel-here"
    # Both backends' meshes export to one collector: the id names the backend's own call.
    call_id = f"toolu_cancel_here_{mesh.backend}"
    started = time.monotonic()
    future = in_flight_call(mesh, conv, call_id, delay_ms=8000)
    # The dispatcher knows the call before it has reached the registry; give it time to
    # arrive there, so the cancellation has a running handler to stop (8 s of sleep left).
    time.sleep(1.0)

    def cancel_once_in_flight() -> dpb.CancelResponse | None:
        response = mesh.dispatcher.Cancel(
            dpb.CancelRequest(conversation_id=conv, tenant_id="tenant-a")
        )
        return response if response.cancelled_calls else None

    cancelled = wait_until(cancel_once_in_flight, what="the call to be in flight")
    cancelled_at = time.monotonic()
    response = future.result(timeout=5)
    assert time.monotonic() - cancelled_at < 1.0
    assert time.monotonic() - started < 5.0
    assert list(cancelled.cancelled_tool_use_ids) == [call_id]
    assert err_kind(response) == "cancelled"
    # Nothing is left running: neither in the dispatcher...
    again = mesh.dispatcher.Cancel(dpb.CancelRequest(conversation_id=conv, tenant_id="tenant-a"))
    assert again.cancelled_calls == 0 and "no active calls" in again.message
    # ...nor in the registry.
    assert_registry_handler_stopped(mesh, call_id)
    outcome = events_of(mesh, conv, "tenant-a", "outcome")[-1]
    assert outcome["status"] == "cancelled"


@pytest.fixture
def second_dispatcher(mesh: Mesh) -> Iterator[dispatcher_pb2_grpc.DispatcherServiceStub]:
    proc: ServiceProcess = start_service("dispatcher", env=mesh.env, port=0)
    channel = grpc.insecure_channel(proc.address)
    try:
        yield dispatcher_pb2_grpc.DispatcherServiceStub(channel)
    finally:
        channel.close()
        proc.stop()


def test_a_cancel_sent_to_another_replica_stops_the_call_through_the_database(
    mesh: Mesh, second_dispatcher: dispatcher_pb2_grpc.DispatcherServiceStub
) -> None:
    conv = "cancel-elsewhere"
    call_id = f"toolu_cancel_elsewhere_{mesh.backend}"  # one collector for both backends
    future = in_flight_call(mesh, conv, call_id, delay_ms=8000)
    time.sleep(1.0)  # let the call reach the registry's handler (see the test above)

    def cancel_once_known() -> dpb.CancelResponse | None:
        response = second_dispatcher.Cancel(
            dpb.CancelRequest(conversation_id=conv, tenant_id="tenant-a")
        )
        return response if response.known_conversation else None

    cancelled = wait_until(cancel_once_known, what="the conversation to be known")
    cancelled_at = time.monotonic()
    response = future.result(timeout=5)
    assert time.monotonic() - cancelled_at < 1.0
    assert cancelled.cancelled_calls == 0  # the call ran on the first replica
    assert err_kind(response) == "cancelled"
    assert_registry_handler_stopped(mesh, call_id)


def test_a_cancel_for_an_unknown_conversation_is_a_no_op_that_says_so(mesh: Mesh) -> None:
    response = mesh.dispatcher.Cancel(
        dpb.CancelRequest(conversation_id="never-used", tenant_id="tenant-a")
    )
    assert response.cancelled_calls == 0
    assert not response.known_conversation
    assert "no active calls" in response.message and "unknown conversation" in response.message
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.Cancel(dpb.CancelRequest(tenant_id="tenant-a"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_twenty_slow_calls_in_a_batch_take_about_as_long_as_the_slowest(mesh: Mesh) -> None:
    uses = [
        pb.ToolUse(id=f"slow{i}", name="ping", input_json=json.dumps({"echo": i, "delay_ms": 500}))
        for i in range(20)
    ]
    started = time.monotonic()
    response = mesh.dispatcher.DispatchToolCalls(
        dpb.DispatchToolCallsRequest(
            tool_uses=uses,
            context=pb.CallContext(tenant_id="tenant-a", conversation_id="batch20"),
        ),
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert [r.tool_use_id for r in response.results] == [u.id for u in uses]
    assert [json.loads(r.result.envelope.ok.data_json)["echo"] for r in response.results] == list(
        range(20)
    )
    assert elapsed < 3  # 20 x 500 ms serially would be 10 s (headroom for a loaded machine)


def test_a_batch_is_guarded_in_input_order(mesh: Mesh) -> None:
    tenant = "t-batch-order"
    add_rule(
        mesh,
        tenant_id=tenant,
        name="echo-required",
        kind=dpb.POLICY_RULE_KIND_ARG_CONSTRAINT,
        tool_name="ping",
        mode=dpb.POLICY_MODE_ADVISORY,
        params={"path": "$.echo", "pattern": ".", "must_match": True},
    )
    uses = [pb.ToolUse(id=f"o{i}", name="ping", input_json='{"delay_ms": 10}') for i in range(5)]
    response = mesh.dispatcher.DispatchToolCalls(
        dpb.DispatchToolCallsRequest(
            tool_uses=uses,
            context=pb.CallContext(tenant_id=tenant, user_id="u", conversation_id="order"),
        ),
        timeout=60,
    )
    kinds = [err_kind(r) for r in response.results]
    assert kinds == ["ok", "ok", "ok", "loop_guard", "loop_guard"]
    warnings = [r.warnings[0] for r in response.results]
    assert warnings[0].startswith("Policy 'echo-required'")
    assert warnings[1].startswith("Second time")
    assert [w.startswith("STOP. You've skipped this") for w in warnings[2:]] == [True] * 3
    assert "skipped this 5 times" in warnings[4]


def test_every_call_logs_its_decision_and_outcome(mesh: Mesh) -> None:
    mesh.call("ping", '{"echo": 1}', conversation="decisions", tool_use_id="toolu_dec")
    events = events_of(mesh, "decisions", "tenant-a")
    assert [e["event_type"] for e in events] == ["tool_call", "decision", "tool_result", "outcome"]
    decision, outcome = events[1], events[3]
    assert decision["action"] == "execute" and decision["refused_by"] is None
    assert decision["loop_guard"] == {"run_length": 1, "threshold": 3, "fired": False}
    assert decision["timeout_s"] == 300
    assert outcome["status"] == "ok" and outcome["tool_use_id"] == "toolu_dec"


def run_cli(mesh: Mesh, *argv: str) -> int:
    """`toolmesh <argv>` with the guardrail subcommands (shared.cli.guardrails), in process."""
    parser = argparse.ArgumentParser(prog="toolmesh")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([*argv, "--dispatcher", mesh.address("dispatcher")])
    return int(args.func(args, Settings.from_env()))


def test_the_cli_adds_lists_and_disables_rules_and_cancels(
    mesh: Mesh, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(
        mesh,
        "policy",
        "add",
        "--tenant",
        "t-cli",
        "--name",
        "cli-deny",
        "--kind",
        "deny_tool",
        "--tool",
        "ping",
        "--mode",
        "advisory",
        "--json",
    )
    assert code == 0
    (added,) = json.loads(capsys.readouterr().out)
    assert added["name"] == "cli-deny" and added["mode"] == "POLICY_MODE_ADVISORY"
    assert mesh.call("ping", tenant="t-cli", conversation="cli-adv").warnings

    assert run_cli(mesh, "policy", "list", "--tenant", "t-cli") == 0
    assert "cli-deny" in capsys.readouterr().out
    assert run_cli(mesh, "policy", "disable", added["id"]) == 0
    assert f"disabled policy rule {added['id']}" in capsys.readouterr().out
    assert run_cli(mesh, "policy", "list", "--tenant", "t-cli") == 0
    assert "cli-deny" not in capsys.readouterr().out

    bad = run_cli(
        mesh,
        "policy",
        "add",
        "--tenant",
        "t-cli",
        "--name",
        "bad",
        "--kind",
        "rate_limit",
        "--tool",
        "ping",
        "--params",
        '{"max_calls": 0}',
    )
    assert bad == 2
    assert "rule.params_json.max_calls" in capsys.readouterr().err

    assert run_cli(mesh, "cancel", "cli-never-used", "--tenant", "t-cli") == 0
    assert "unknown conversation" in capsys.readouterr().out
