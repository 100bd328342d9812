"""A tool call through the real mesh: dispatcher -> registry -> handler, logged and traced."""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2

from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration


def error_info(exc: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    raise AssertionError("no ErrorInfo in the status details")


def test_ping_answers_ok_with_the_echo_and_integers_intact(mesh: Mesh) -> None:
    response = mesh.call("ping", '{"echo": {"n": 3, "big": 9007199254740993}}')
    assert response.result.envelope.WhichOneof("kind") == "ok"
    data = json.loads(response.result.envelope.ok.data_json)
    assert data == {"pong": True, "echo": {"n": 3, "big": 9007199254740993}}
    assert len(response.args_hash) == 16
    assert response.tool_use_id.startswith("toolu_")
    assert response.duration_ms > 0


def test_args_hash_is_stable_across_key_order_and_ignores_reasoning(mesh: Mesh) -> None:
    a = mesh.call("ping", '{"echo": {"x": 1, "y": 2}}')
    b = mesh.call("ping", '{"echo": {"y": 2, "x": 1}, "reasoning": "because"}')
    c = mesh.call("ping", '{"echo": {"x": 1, "y": 3}}')
    assert a.args_hash == b.args_hash != c.args_hash


def test_an_unknown_tool_is_not_found_naming_the_closest_tools(mesh: Mesh) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("pnig", conversation="unknown-tool")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(caught.value)
    assert info.reason == "TOOL_NOT_FOUND"
    assert info.domain == "toolmesh.dev"
    assert "ping" in info.metadata["suggestions"].split(",")


def test_a_failed_call_is_still_logged(mesh: Mesh) -> None:
    with pytest.raises(grpc.RpcError):
        mesh.call("no_such_tool", conversation="logged-failure")
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="logged-failure", limit=5)
    ).entries
    assert [(e.tool_name, e.success) for e in entries] == [("no_such_tool", False)]
    assert "NOT_FOUND" in entries[0].error


def test_a_call_whose_client_deadline_passes_is_logged_as_cancelled(mesh: Mesh) -> None:
    """A frontend's deadline shorter than the tool: the client gets DEADLINE_EXCEEDED, the
    handler is stopped, and the call is still in the log with its events."""
    conversation = "deadline-passed"
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call(
            "ping",
            '{"delay_ms": 20000}',
            conversation=conversation,
            tool_use_id="toolu_deadline",
            timeout=1.0,
        )
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    entries: list[dpb.ExecutionLogEntry] = []
    for _ in range(100):  # the dispatcher logs as the cancellation reaches it
        entries = list(
            mesh.dispatcher.ListExecutionLog(
                dpb.ListExecutionLogRequest(conversation_id=conversation, limit=5)
            ).entries
        )
        if entries:
            break
        time.sleep(0.05)
    (entry,) = entries
    assert (entry.tool_name, entry.success, entry.tool_use_id) == ("ping", False, "toolu_deadline")
    assert "cancelled" in entry.error and "stopped waiting" in entry.error
    assert entry.execution_ms < 10_000  # stopped, not run to its end
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(tenant_id="tenant-a", conversation_id=conversation)
    ).events
    kinds = [e.event_type for e in events]
    assert kinds[0] == "tool_call" and "tool_result" in kinds, kinds
    (result,) = [e for e in events if e.event_type == "tool_result"]
    assert "cancelled" in result.data_json
    # SREs see why in the trace: the dispatcher's SERVER span carries the gRPC outcome.
    (server,) = mesh.spans.wait_for_sync(
        lambda s: (
            s.kind == "SERVER"
            and s.name.endswith("DispatcherService/DispatchToolCall")
            and s.attributes.get("gen_ai.tool.call.id") == "toolu_deadline"
            and s.attributes.get("toolmesh.tenant.id") == "tenant-a"
            and s.trace_id == entry.trace_id
        ),
        timeout=15,
    )
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert server.attributes["error.type"] == "DEADLINE_EXCEEDED"
    assert server.status_code == "ERROR"
    # ... and its CLIENT span to the registry says the dispatcher cancelled that call.
    (client,) = mesh.spans.wait_for_sync(
        lambda s: (
            s.kind == "CLIENT"
            and s.trace_id == entry.trace_id
            and s.name.endswith("RegistryService/ExecuteTool")
        ),
        timeout=15,
    )
    assert client.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert client.status_code == "ERROR"


@pytest.mark.parametrize("payload", ["[1, 2]", "42", '"text"', "{not json", "null"])
def test_input_that_is_not_a_json_object_is_invalid_argument(mesh: Mesh, payload: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("ping", payload)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason in {"INPUT_NOT_JSON", "INPUT_NOT_OBJECT"}


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        ('{"echo": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"echo": ' + "7" * 5000 + "}", "digits"),
        ('{"echo": ' + "[" * 500 + "]" * 500 + "}", "nested more than 100 levels deep"),
        ('{"echo": NaN}', "NaN is not a JSON value"),
        ('{"echo": 1e400}', "out of range for a double"),
        ('{"echo": "\\udc80"}', "unpaired UTF-16 surrogate"),
    ],
)
def test_hostile_json_is_refused_logged_and_the_mesh_keeps_serving(
    mesh: Mesh, payload: str, detail: str
) -> None:
    conversation = f"hostile-{abs(hash(payload))}"
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("ping", payload, conversation=conversation, tool_use_id="toolu_hostile")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in caught.value.details()
    assert error_info(caught.value).reason == "INPUT_NOT_JSON"
    (entry,) = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation, limit=5)
    ).entries
    assert (entry.tool_name, entry.success, entry.tool_use_id) == ("ping", False, "toolu_hostile")
    assert entry.error.startswith("INVALID_ARGUMENT: ") and detail in entry.error
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(tenant_id="tenant-a", conversation_id=conversation)
    ).events
    assert [e.event_type for e in events] == ["tool_call", "tool_result", "outcome"]
    call = json.loads(events[0].data_json)
    assert call["input"]["input_chars"] == len(payload)
    assert call["input"]["input_json"] == payload[: 64 * 1024]
    after = mesh.call("ping", json.dumps({"echo": conversation}), conversation=conversation)
    assert after.result.envelope.WhichOneof("kind") == "ok"


def test_an_empty_tool_name_is_invalid_argument(mesh: Mesh) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_input_over_the_size_limit_is_invalid_argument(mesh: Mesh) -> None:
    big = json.dumps({"echo": "x" * (4 * 1024 * 1024 + 10)})
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("ping", big)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INPUT_TOO_LARGE"


def test_a_schema_violation_is_a_schema_hint_naming_the_field(mesh: Mesh) -> None:
    result = mesh.call("ping", '{"delay_ms": "soon"}').result
    assert result.envelope.WhichOneof("kind") == "hint"
    assert result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert "delay_ms" in result.envelope.hint.message
    assert result.content.startswith("⚠ schema hint:")
    assert result.error == ""


def test_an_unknown_input_field_hints_the_closest_allowed_field(mesh: Mesh) -> None:
    hint = mesh.call("ping", '{"ecko": 1}').result.envelope.hint
    assert hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert hint.alternatives[0].label == "echo"


def test_a_flood_of_unknown_fields_makes_a_short_hint(mesh: Mesh) -> None:
    fields = {f"k{i}": i for i in range(100_000)} | {"e" * 1_000_000 + "cho": 1}
    result = mesh.call("ping", json.dumps(fields), conversation="flood").result
    assert result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA
    assert "'k0', 'k1'" in result.content and "and 99991 more" in result.content
    assert len(result.content) < 3000


def test_a_handler_that_raises_is_an_err_result_and_the_service_keeps_serving(mesh: Mesh) -> None:
    failed = mesh.call("ping", '{"fail": "raise"}', conversation="raises")
    assert failed.result.envelope.WhichOneof("kind") == "err"
    assert failed.result.envelope.err.err_kind == "PingFailure"
    assert failed.result.content.startswith("✗ error (PingFailure):")
    assert failed.result.error
    assert mesh.call("ping").result.envelope.WhichOneof("kind") == "ok"
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="raises")
    ).entries
    assert not entries[0].success
    assert "asked to raise" in entries[0].error


def test_a_legacy_error_string_is_coerced_to_err_legacy(mesh: Mesh) -> None:
    env = mesh.call("ping", '{"fail": "error"}').result.envelope
    assert env.err.err_kind == "legacy"


def test_a_hint_exception_is_a_hint_and_counts_as_success(mesh: Mesh) -> None:
    response = mesh.call("ping", '{"fail": "hint"}', conversation="hinted")
    assert response.result.envelope.hint.hint_kind == pb.HINT_KIND_FETCH
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="hinted")
    ).entries
    assert entries[0].success


def test_every_call_writes_a_log_row_and_full_conversation_events(mesh: Mesh) -> None:
    big = "é" * 40_000  # over the 32 KB inline limit once encoded: lands in the blob table
    response = mesh.call(
        "ping",
        json.dumps({"echo": big, "reasoning": "to test"}),
        conversation="events",
        tool_use_id="toolu_events_1",
    )
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="events")
    ).entries
    assert len(entries) == 1
    entry = entries[0]
    assert entry.tool_use_id == "toolu_events_1"
    assert entry.tenant_id == "tenant-a"
    assert entry.success
    assert len(entry.output_summary) == 500
    assert entry.args_hash == response.args_hash
    assert len(entry.trace_id) == 32
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(conversation_id="events", tenant_id="tenant-a")
    ).events
    assert [e.event_type for e in events] == ["tool_call", "decision", "tool_result", "outcome"]
    by_type = {e.event_type: json.loads(e.data_json) for e in events}
    call, result = by_type["tool_call"], by_type["tool_result"]
    assert call["input"]["echo"] == big
    assert call["reasoning"] == "to test"
    assert result["content"] == response.result.content  # untruncated
    assert result["envelope"] == "ok"


def test_the_log_records_the_model_the_context_named_and_filters_by_it(mesh: Mesh) -> None:
    """CallContext.model lands in the call's log row (refused calls included), so the log
    answers per-model questions; ListExecutionLog filters by it."""
    for model, tool, tool_input in (
        ("claude-sonnet-4-5", "ping", '{"echo": 1}'),
        ("claude-haiku-4-5", "ping", '{"echo": 2}'),
        ("claude-haiku-4-5", "ping", "[not an object]"),  # refused before it ran
        ("", "ping", '{"echo": 3}'),
    ):
        request = dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name=tool, input_json=tool_input),
            context=pb.CallContext(tenant_id="tenant-a", conversation_id="models", model=model),
        )
        try:
            mesh.dispatcher.DispatchToolCall(request, timeout=60)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    log = mesh.dispatcher.ListExecutionLog(dpb.ListExecutionLogRequest(conversation_id="models"))
    assert [(e.model, e.success) for e in log.entries] == [
        ("", True),
        ("claude-haiku-4-5", False),
        ("claude-haiku-4-5", True),
        ("claude-sonnet-4-5", True),
    ]
    haiku = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="models", model="claude-haiku-4-5")
    )
    assert [e.success for e in haiku.entries] == [False, True]
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.ListExecutionLog(dpb.ListExecutionLogRequest(model="m" * 200))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model is 200 characters" in (caught.value.details() or "")


def test_a_batch_runs_concurrently_and_answers_in_input_order(mesh: Mesh) -> None:
    uses = [
        pb.ToolUse(id=f"b{i}", name="ping", input_json=json.dumps({"echo": i, "delay_ms": 300}))
        for i in range(10)
    ]
    uses.append(pb.ToolUse(id="b-missing", name="no_such_tool", input_json="{}"))
    response = mesh.dispatcher.DispatchToolCalls(
        dpb.DispatchToolCallsRequest(
            tool_uses=uses, context=pb.CallContext(tenant_id="tenant-a", conversation_id="batch")
        ),
        timeout=60,
    )
    assert [r.tool_use_id for r in response.results] == [u.id for u in uses]
    for i, r in enumerate(response.results[:10]):
        assert json.loads(r.result.envelope.ok.data_json)["echo"] == i
    assert response.results[10].result.envelope.err.err_kind == "tool_not_found"
    # Concurrency: ten 300 ms calls take far less than their 3 s sum.
    assert max(r.duration_ms for r in response.results) < 3000


def test_a_batch_with_duplicate_ids_is_invalid_argument(mesh: Mesh) -> None:
    uses = [pb.ToolUse(id="same", name="ping", input_json="{}") for _ in range(2)]
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.DispatchToolCalls(dpb.DispatchToolCallsRequest(tool_uses=uses))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_call_is_one_trace_across_processes(mesh: Mesh) -> None:
    response = mesh.call("compose_ping", '{"echo": "nested"}', conversation="traced")
    assert json.loads(response.result.envelope.ok.data_json)["inner"]["echo"] == "nested"
    entry = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="traced")
    ).entries[0]
    trace_id = entry.trace_id
    root_name = "toolmesh.dispatcher.v1.DispatcherService/DispatchToolCall"
    # dispatcher: SERVER + CLIENT; registry: SERVER, execute_tool, CLIENT, SERVER, execute_tool.
    spans = mesh.spans.wait_for_sync(lambda s: s.trace_id == trace_id, timeout=15, count=7)
    by_id = {s.span_id: s for s in spans}
    services = {s.service_name for s in spans}
    assert {"toolmesh-dispatcher", "toolmesh-registry"} <= services
    outer = next(s for s in spans if s.name == "execute_tool compose_ping")
    inner = next(s for s in spans if s.name == "execute_tool ping")
    assert outer.attributes["gen_ai.operation.name"] == "execute_tool"
    assert outer.attributes["gen_ai.tool.call.id"] == response.tool_use_id
    # The inner execute_tool descends from the outer one through a client/server hop.
    chain = []
    cursor = inner
    while cursor.parent_span_id in by_id:
        cursor = by_id[cursor.parent_span_id]
        chain.append((cursor.name, cursor.kind))
    assert ("execute_tool compose_ping", "INTERNAL") in chain
    assert ("toolmesh.registry.v1.RegistryService/ExecuteTool", "SERVER") in chain
    assert ("toolmesh.registry.v1.RegistryService/ExecuteTool", "CLIENT") in chain
    root = cursor
    assert root.name == root_name
    assert root.kind == "SERVER"
    assert root.service_name == "toolmesh-dispatcher"


@pytest.mark.parametrize(
    ("tool_use", "context", "reason"),
    [
        (pb.ToolUse(name="p" * 5_000_000), pb.CallContext(tenant_id="t"), "NAME_TOO_LONG"),
        (pb.ToolUse(name="ping", id="i" * 129), pb.CallContext(tenant_id="t"), "ID_TOO_LONG"),
        (pb.ToolUse(name="pi\x00ng"), pb.CallContext(tenant_id="t"), "NAME_INVALID"),
        (pb.ToolUse(name="ping"), pb.CallContext(tenant_id="t\x00"), "ID_INVALID"),
        (
            pb.ToolUse(name="ping"),
            pb.CallContext(tenant_id="t", conversation_id="a\nb"),
            "ID_INVALID",
        ),
        (pb.ToolUse(name="ping"), pb.CallContext(tenant_id="t" * 129), "ID_TOO_LONG"),
        (
            pb.ToolUse(name="ping"),
            pb.CallContext(tenant_id="t", conversation_id="c" * 1_000_000),
            "ID_TOO_LONG",
        ),
        (
            pb.ToolUse(name="ping"),
            pb.CallContext(tenant_id="t", capabilities=["c"] * 10_000),
            "CAPABILITIES_TOO_LARGE",
        ),
    ],
)
def test_oversized_names_and_identifiers_are_refused_at_once(
    mesh: Mesh, tool_use: pb.ToolUse, context: pb.CallContext, reason: str
) -> None:
    """Before: a 5 MB tool name held the registry (its "did you mean") past a 60 s deadline, a
    1 MB conversation id took 21 s on SQLite, and PostgreSQL refused ids over the log's
    128-character columns or holding NUL, so such a call failed as UNAVAILABLE, unlogged."""
    with pytest.raises(grpc.RpcError) as caught:
        mesh.dispatcher.DispatchToolCall(
            dpb.DispatchToolCallRequest(tool_use=tool_use, context=context), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == reason
    assert len(caught.value.details()) < 300


def test_an_unknown_long_name_is_not_found_with_suggestions_quickly(mesh: Mesh) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        mesh.call("ping" + "x" * 60, conversation="long-unknown", timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "did you mean ping" in caught.value.details()
    # The registry called directly: a name longer than any id is refused at once, without
    # quoting it (a 100 KB name in the status overflowed gRPC's 16 KB header limit).
    with pytest.raises(grpc.RpcError) as direct:
        mesh.registry.ExecuteTool(
            rpb.ExecuteToolRequest(
                name="ping" + "y" * 5_000_000, context=pb.CallContext(tenant_id="tenant-a")
            ),
            timeout=10,
        )
    assert direct.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "5000004 characters" in direct.value.details()
    assert len(direct.value.details()) < 300


def test_nul_characters_in_input_are_logged_on_every_backend(mesh: Mesh) -> None:
    conversation = "nul-in-input"
    response = mesh.call("ping", '{"echo": "a\\u0000b"}', conversation=conversation)
    assert json.loads(response.result.envelope.ok.data_json)["echo"] == "a\x00b"
    (entry,) = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation, limit=5)
    ).entries
    assert entry.success and entry.conversation_id == conversation
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(tenant_id="tenant-a", conversation_id=conversation)
    ).events
    call = next(e for e in events if e.event_type == "tool_call")
    assert json.loads(call.data_json)["input"]["echo"] == "a\x00b"


def test_listings_page_big_payloads_within_a_default_clients_4_mb(mesh: Mesh) -> None:
    conversation = "big-pages"
    big = "x" * 1_200_000
    for i in range(3):
        mesh.call("ping", json.dumps({"echo": f"{i}{big}"}), conversation=conversation)
    # Events: every payload whole, pages under 4 MB (the fixture's client has the default
    # limit), the cursor walking them all.
    seen: list[dpb.ConversationEvent] = []
    after, pages = 0, 0
    while True:
        page = mesh.dispatcher.ListConversationEvents(
            dpb.ListConversationEventsRequest(
                tenant_id="tenant-a", conversation_id=conversation, after_id=after, limit=5000
            )
        )
        assert page.ByteSize() < 4 * 1024 * 1024
        seen.extend(page.events)
        pages += 1
        if not page.next_after_id:
            break
        after = page.next_after_id
    assert pages > 1
    calls = [json.loads(e.data_json) for e in seen if e.event_type == "tool_call"]
    assert [c["input"]["echo"][:1] for c in calls] == ["0", "1", "2"]
    assert all(len(c["input"]["echo"]) == len(big) + 1 for c in calls)
    assert len({e.id for e in seen}) == len(seen)
    # The log: inputs cut at 64 KB (marked), newest first, paged by before_id.
    first = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation, limit=2)
    )
    assert [e.input_json[:10] for e in first.entries] == ['{"echo":"2', '{"echo":"1']
    assert all(e.input_truncated and len(e.input_json) == 64 * 1024 for e in first.entries)
    rest = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(
            conversation_id=conversation, limit=2, before_id=first.next_before_id
        )
    )
    assert [e.input_json[:10] for e in rest.entries] == ['{"echo":"0']
    assert rest.next_before_id == 0


def test_an_event_over_a_page_comes_cut_and_streams_whole(mesh: Mesh) -> None:
    """An input near the 4 MiB limit makes a tool_call event over a page's 3.5 MB: it came
    alone and whole, so a client with the default 4 MB limit could neither read it nor page
    past it."""
    conversation = "huge-event"
    echo = "é" * 1_900_000  # 3.8 MB of UTF-8
    with pytest.raises(grpc.RpcError) as too_big:  # its echo, twice, is over 4 MB too
        mesh.call("ping", json.dumps({"echo": echo}, ensure_ascii=False), conversation=conversation)
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    page = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(
            tenant_id="tenant-a", conversation_id=conversation, event_type="tool_call"
        )
    )
    (event,) = page.events
    assert page.ByteSize() < 4 * 1024 * 1024
    assert event.data_truncated and event.data_bytes > 3_800_000
    assert event.data_json.startswith('{"tool_name":"ping"')
    chunks = list(
        mesh.dispatcher.GetConversationEventData(
            dpb.GetConversationEventDataRequest(
                tenant_id="tenant-a", conversation_id=conversation, event_id=event.id
            )
        )
    )
    assert all(len(c.chunk) <= 1024 * 1024 for c in chunks)
    whole = b"".join(c.chunk for c in chunks)
    assert len(whole) == event.data_bytes
    assert json.loads(whole)["input"]["echo"] == echo
    small = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(
            tenant_id="tenant-a", conversation_id=conversation, event_type="outcome"
        )
    ).events[0]
    assert not small.data_truncated and small.data_bytes == len(small.data_json.encode())
    with pytest.raises(grpc.RpcError) as missing:
        list(
            mesh.dispatcher.GetConversationEventData(
                dpb.GetConversationEventDataRequest(
                    tenant_id="tenant-b", conversation_id=conversation, event_id=event.id
                )
            )
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


NUL_ID = "a\x00b"


@pytest.mark.parametrize(
    "send",
    [
        lambda m: m.dispatcher.Cancel(dpb.CancelRequest(tenant_id=NUL_ID, conversation_id="c")),
        lambda m: m.dispatcher.Cancel(dpb.CancelRequest(tenant_id="t", conversation_id="c" * 300)),
        lambda m: m.dispatcher.ListExecutionLog(dpb.ListExecutionLogRequest(tool_name=NUL_ID)),
        lambda m: m.dispatcher.ListExecutionLog(dpb.ListExecutionLogRequest(tenant_id=NUL_ID)),
        lambda m: m.dispatcher.ListConversationEvents(
            dpb.ListConversationEventsRequest(conversation_id="c", event_type=NUL_ID)
        ),
        lambda m: m.dispatcher.ListPolicyRules(dpb.ListPolicyRulesRequest(tenant_id=NUL_ID)),
        lambda m: m.dispatcher.AddPolicyRule(
            dpb.AddPolicyRuleRequest(
                rule=dpb.PolicyRule(
                    tenant_id="t",
                    name="r",
                    kind=dpb.POLICY_RULE_KIND_DENY_TOOL,
                    tool_name="ping",
                    mode=dpb.POLICY_MODE_BLOCKING,
                    message=NUL_ID,
                )
            )
        ),
        lambda m: m.registry.GetTool(rpb.GetToolRequest(name=NUL_ID)),
        lambda m: m.registry.ListTools(rpb.ListToolsRequest(tenant_id=NUL_ID)),
        lambda m: m.registry.ListTools(rpb.ListToolsRequest(category="c" * 200)),
        lambda m: m.registry.DeleteTools(rpb.DeleteToolsRequest(names=[NUL_ID])),
        lambda m: m.registry.SetToolStatus(
            rpb.SetToolStatusRequest(name=NUL_ID, status=pb.TOOL_STATUS_APPROVED)
        ),
        lambda m: m.registry.GetToolsForLLM(rpb.GetToolsForLLMRequest(tenant_id=NUL_ID)),
        lambda m: m.registry.GetUsageStats(
            rpb.GetUsageStatsRequest(since=Timestamp(seconds=10**12))
        ),
        lambda m: m.registry.UpsertTools(
            rpb.UpsertToolsRequest(
                tools=[
                    pb.ToolDefinition(
                        name="bad_def", tool_type=pb.TOOL_TYPE_MCP, tenant_id="t" * 200
                    )
                ]
            )
        ),
        lambda m: m.registry.UpsertTools(
            rpb.UpsertToolsRequest(
                tools=[
                    pb.ToolDefinition(
                        name="bad_def",
                        tool_type=pb.TOOL_TYPE_MCP,
                        input_schema_json='{"description": "' + "x" * 300_000 + '"}',
                    )
                ]
            )
        ),
        lambda m: m.registry.UpsertTools(
            rpb.UpsertToolsRequest(
                tools=[pb.ToolDefinition(name="bad_def", tool_type=pb.TOOL_TYPE_MCP, status=99)]
            )
        ),
    ],
)
def test_ids_and_values_no_database_can_store_are_invalid_argument_on_every_backend(
    mesh: Mesh, send: Any
) -> None:
    """Before, on PostgreSQL (which refuses NUL in text and values over a column's length)
    these answered INTERNAL with a traceback in the service's log; on SQLite they were stored."""
    with pytest.raises(grpc.RpcError) as caught:
        send(mesh)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert len(caught.value.details()) < 500
    alive = mesh.call("ping", json.dumps({"echo": time.time_ns()}), conversation="still-serving")
    assert alive.result.envelope.WhichOneof("kind") == "ok"


def test_a_nan_or_negative_budget_is_invalid_argument(mesh: Mesh) -> None:
    for limit in (float("nan"), -1.0, float("inf")):
        with pytest.raises(grpc.RpcError) as caught:
            mesh.dispatcher.DispatchToolCall(
                dpb.DispatchToolCallRequest(
                    tool_use=pb.ToolUse(name="ping", input_json="{}"),
                    context=pb.CallContext(tenant_id="t", budget=pb.Budget(limit_usd=limit)),
                ),
                timeout=10,
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "BUDGET_INVALID"


def test_a_retried_call_is_answered_with_its_first_response_not_run_again(mesh: Mesh) -> None:
    """An agent back end that lost a response sends the call again with its tool_use id: it
    gets the same response, marked replayed, on any of the three dispatch RPCs, and the tool
    does not run again (one log row); a retry that comes while the call runs waits for it."""
    conversation, payload = "retries", json.dumps({"echo": "once", "delay_ms": 400})
    context = pb.CallContext(tenant_id="tenant-a", user_id="tester", conversation_id=conversation)
    request = dpb.DispatchToolCallRequest(
        tool_use=pb.ToolUse(id="toolu_retry_1", name="ping", input_json=payload), context=context
    )
    first = mesh.dispatcher.DispatchToolCall.future(request, timeout=60)
    time.sleep(0.1)
    meanwhile = mesh.dispatcher.DispatchToolCall(request, timeout=60)
    answered = first.result()
    later = mesh.dispatcher.DispatchToolCall(request, timeout=60)
    streamed = list(
        mesh.dispatcher.DispatchToolCallStream(
            dpb.DispatchToolCallStreamRequest(tool_use=request.tool_use, context=context),
            timeout=60,
        )
    )
    batch = mesh.dispatcher.DispatchToolCalls(
        dpb.DispatchToolCallsRequest(tool_uses=[request.tool_use], context=context), timeout=60
    ).results
    assert not answered.replayed
    for replay in (meanwhile, later, streamed[-1].result, batch[0]):
        assert replay.replayed
        assert replay.result == answered.result and replay.duration_ms == answered.duration_ms
    log = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation)
    ).entries
    assert [e.tool_use_id for e in log] == ["toolu_retry_1"]
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(tenant_id="tenant-a", conversation_id=conversation)
    ).events
    replays = [json.loads(e.data_json) for e in events if e.event_type == "replayed"]
    assert len(replays) == 4
    assert {r["tool_use_id"] for r in replays} == {"toolu_retry_1"}
    assert {r["envelope"] for r in replays} == {"ok"}
    # The same id with other input is another call: it runs (and is answered once too).
    other = mesh.call(
        "ping", '{"echo": "twice"}', conversation=conversation, tool_use_id="toolu_retry_1"
    )
    assert not other.replayed
    # SREs see the retries in the trace: the dispatcher's server span says it replayed.
    mesh.spans.wait_for_sync(
        lambda s: (
            s.kind == "SERVER"
            and s.attributes.get("toolmesh.replayed") is True
            and s.attributes.get("gen_ai.tool.call.id") == "toolu_retry_1"
        ),
        timeout=15,
        count=4,
    )
