"""A dispatcher that authenticates its callers (TOOLMESH_API_KEYS_FILE): the tenant comes from
the API key, never from the request; capabilities are capped by the key; the log, events,
cancellation and policy administration are scoped to the key's tenant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from shared.auth import key_digest
from shared.clients import cli_channel
from shared.launcher import start_service
from shared.telemetry import semconv
from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

KEYS = {
    "key-a": {"name": "backend-a", "tenant_id": "auth-a", "capabilities": ["analyst"]},
    "key-b": {"name": "backend-b", "tenant_id": "auth-b"},
    "key-admin": {"name": "ops", "tenant_id": "ops", "admin": True},
    "key-sre": {"name": "sre", "tenant_id": "auth-sre", "capabilities": ["telemetry_admin"]},
}


class Callers:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channels: list[grpc.Channel] = []

    def stub(self, key: str | None) -> dispatcher_pb2_grpc.DispatcherServiceStub:
        channel = cli_channel(self.address, api_key=key or "")
        self._channels.append(channel)
        return dispatcher_pb2_grpc.DispatcherServiceStub(channel)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@pytest.fixture(scope="module")
def authed(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callers]:
    path = Path(tmp_path_factory.mktemp("keys")) / "keys.json"
    entries = [{"key_sha256": key_digest(k), **v} for k, v in KEYS.items()]
    path.write_text(json.dumps({"keys": entries}))
    proc = start_service(
        "dispatcher", env={**mesh.env, "TOOLMESH_API_KEYS_FILE": str(path)}, port=0
    )
    callers = Callers(proc.address)
    yield callers
    callers.close()
    proc.stop()


def request(
    name: str,
    inputs: dict[str, object],
    *,
    tenant: str,
    conversation: str,
    tool_use_id: str,
    capabilities: tuple[str, ...] = (),
) -> dpb.DispatchToolCallRequest:
    return dpb.DispatchToolCallRequest(
        tool_use=pb.ToolUse(id=tool_use_id, name=name, input_json=json.dumps(inputs)),
        context=pb.CallContext(
            tenant_id=tenant,
            user_id="u",
            conversation_id=conversation,
            capabilities=list(capabilities),
        ),
    )


def test_a_call_without_a_known_key_is_unauthenticated(authed: Callers) -> None:
    for key in (None, "not-a-key"):
        with pytest.raises(grpc.RpcError) as caught:
            authed.stub(key).DispatchToolCall(
                request("ping", {}, tenant="auth-a", conversation="c", tool_use_id="t"),
                timeout=30,
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "API key" in (caught.value.details() or "")


def test_the_tenant_is_the_keys_whatever_the_request_claims(authed: Callers, mesh: Mesh) -> None:
    response = authed.stub("key-a").DispatchToolCall(
        request(
            "ping",
            {"echo": 1},
            tenant="auth-b",
            conversation="claim",
            tool_use_id="toolu_claim_" + mesh.backend,
        ),
        timeout=30,
    )
    assert response.result.envelope.WhichOneof("kind") == "ok"
    (span,) = mesh.spans.wait_for_sync(
        lambda s: (
            s.name == "execute_tool ping"
            and s.attributes.get(semconv.GEN_AI_TOOL_CALL_ID) == "toolu_claim_" + mesh.backend
        ),
        timeout=15,
    )
    assert span.attributes[semconv.TOOLMESH_TENANT_ID] == "auth-a"
    # The log is scoped to the key's tenant too: asking for tenant b's rows shows a's.
    rows = (
        authed.stub("key-a")
        .ListExecutionLog(
            dpb.ListExecutionLogRequest(tenant_id="auth-b", conversation_id="claim"), timeout=30
        )
        .entries
    )
    assert [(r.tenant_id, r.tool_use_id) for r in rows] == [
        ("auth-a", "toolu_claim_" + mesh.backend)
    ]
    assert (
        not authed.stub("key-b")
        .ListExecutionLog(dpb.ListExecutionLogRequest(conversation_id="claim"), timeout=30)
        .entries
    )


def test_capabilities_are_capped_by_the_key(authed: Callers) -> None:
    # key-a may claim "analyst" only: its claim of telemetry_admin is dropped.
    response = authed.stub("key-a").DispatchToolCall(
        request(
            "query_telemetry",
            {"tenant": "auth-b"},
            tenant="auth-a",
            conversation="caps",
            tool_use_id="toolu_caps",
            capabilities=("analyst", "telemetry_admin"),
        ),
        timeout=30,
    )
    assert response.result.envelope.WhichOneof("kind") == "err"
    assert "telemetry_admin" in response.result.content
    # A key without a capability list may claim any but those reaching other tenants' data:
    # every tenant key would otherwise read every tenant's telemetry.
    response = authed.stub("key-b").DispatchToolCall(
        request(
            "query_telemetry",
            {"tenant": "auth-a"},
            tenant="auth-b",
            conversation="caps",
            tool_use_id="toolu_caps_b",
            capabilities=("telemetry_admin",),
        ),
        timeout=30,
    )
    assert response.result.envelope.WhichOneof("kind") == "err"
    assert "telemetry_admin" in response.result.content
    # A key whose entry lists it, and an admin key, may.
    for key, tenant in (("key-sre", "auth-sre"), ("key-admin", "ops")):
        response = authed.stub(key).DispatchToolCall(
            request(
                "query_telemetry",
                {"tenant": "auth-a"},
                tenant=tenant,
                conversation="caps",
                tool_use_id=f"toolu_caps_{key}",
                capabilities=("telemetry_admin",),
            ),
            timeout=30,
        )
        assert response.result.envelope.WhichOneof("kind") == "ok", response.result.content


def test_cancel_and_policy_administration_are_scoped(authed: Callers) -> None:
    future = authed.stub("key-a").DispatchToolCall.future(
        request(
            "ping",
            {"delay_ms": 1500},
            tenant="auth-a",
            conversation="mine",
            tool_use_id="toolu_mine",
        ),
        timeout=30,
    )
    # Tenant b names tenant a's conversation: it cancels nothing of a's.
    other = authed.stub("key-b").Cancel(
        dpb.CancelRequest(conversation_id="mine", tenant_id="auth-a"), timeout=30
    )
    assert other.cancelled_calls == 0
    assert future.result(timeout=30).result.envelope.WhichOneof("kind") == "ok"
    rule = dpb.PolicyRule(
        name="no pings", kind=dpb.POLICY_RULE_KIND_DENY_TOOL, tenant_id="auth-b", tool_name="ping"
    )
    with pytest.raises(grpc.RpcError) as caught:
        authed.stub("key-a").AddPolicyRule(dpb.AddPolicyRuleRequest(rule=rule), timeout=30)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    added = authed.stub("key-admin").AddPolicyRule(dpb.AddPolicyRuleRequest(rule=rule), timeout=30)
    authed.stub("key-admin").DisablePolicyRule(
        dpb.DisablePolicyRuleRequest(id=added.rule.id), timeout=30
    )
