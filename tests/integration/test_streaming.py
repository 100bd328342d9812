"""DispatchToolCallStream against the real mesh: progress reported by the handler reaches the
client before the result, followed by the rendered text in chunks and the final result; a
client that cancels the stream stops the call, which is logged as cancelled."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.type.v1 import types_pb2 as pb


def stream_request(
    tool_use_id: str, inputs: dict[str, object], *, name: str = "ping", conversation: str
) -> dpb.DispatchToolCallStreamRequest:
    return dpb.DispatchToolCallStreamRequest(
        tool_use=pb.ToolUse(id=tool_use_id, name=name, input_json=json.dumps(inputs)),
        context=pb.CallContext(
            tenant_id="tenant-a", user_id="tester", conversation_id=conversation
        ),
    )


def events_of(mesh: Mesh, conversation: str) -> list[dpb.ConversationEvent]:
    return list(
        mesh.dispatcher.ListConversationEvents(
            dpb.ListConversationEventsRequest(conversation_id=conversation, tenant_id="tenant-a"),
            timeout=30,
        ).events
    )


def test_progress_arrives_before_the_text_and_the_result(mesh: Mesh) -> None:
    call = mesh.dispatcher.DispatchToolCallStream(
        stream_request("s-1", {"progress_steps": 3, "delay_ms": 150}, conversation="stream-1"),
        timeout=60,
    )
    kinds = []
    messages = []
    for message in call:
        kinds.append(message.WhichOneof("event"))
        messages.append(message)
    assert kinds[:3] == ["progress"] * 3
    assert kinds[-1] == "result" and "text_delta" in kinds
    assert kinds.index("text_delta") > 2
    progress = [m.progress for m in messages if m.WhichOneof("event") == "progress"]
    assert [p.message for p in progress] == [f"ping step {i} of 3" for i in (1, 2, 3)]
    assert [round(p.fraction, 3) for p in progress] == [0.0, 0.333, 0.667]
    assert all(p.tool_use_id == "s-1" for p in progress)
    final = messages[-1].result
    assert final.result.envelope.WhichOneof("kind") == "ok"
    text = "".join(m.text_delta.text for m in messages if m.WhichOneof("event") == "text_delta")
    assert text == final.result.content and text.startswith("✓ ok.")
    # The progress the client saw is in the conversation's events, between call and result.
    types = [e.event_type for e in events_of(mesh, "stream-1")]
    assert types == ["tool_call", "decision", *["progress"] * 3, "tool_result", "outcome"]


def test_a_streamed_call_answers_like_the_unary_one(mesh: Mesh) -> None:
    streamed = list(
        mesh.dispatcher.DispatchToolCallStream(
            stream_request("s-2", {"echo": "same"}, conversation="stream-2"), timeout=60
        )
    )[-1].result
    unary = mesh.call("ping", json.dumps({"echo": "same"}), conversation="stream-2b")
    assert streamed.result.content == unary.result.content
    assert streamed.result.envelope == unary.result.envelope


def test_an_unknown_tool_is_a_not_found_status_on_the_stream(mesh: Mesh) -> None:
    call = mesh.dispatcher.DispatchToolCallStream(
        stream_request("s-3", {}, name="pnig", conversation="stream-3"), timeout=60
    )
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_input_is_invalid_argument_on_the_stream(mesh: Mesh) -> None:
    request = stream_request("s-4", {}, conversation="stream-4")
    request.tool_use.input_json = "[1, 2]"
    with pytest.raises(grpc.RpcError) as info:
        list(mesh.dispatcher.DispatchToolCallStream(request, timeout=60))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cancelling_the_stream_stops_the_call(mesh: Mesh) -> None:
    call = mesh.dispatcher.DispatchToolCallStream(
        stream_request(
            "s-5", {"progress_steps": 100, "delay_ms": 120_000}, conversation="stream-5"
        ),
        timeout=180,
    )
    first = next(iter(call))
    assert first.WhichOneof("event") == "progress"
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    deadline = time.monotonic() + 30
    outcome: dict[str, object] = {}
    while time.monotonic() < deadline:
        found = [e for e in events_of(mesh, "stream-5") if e.event_type == "outcome"]
        if found:
            outcome = json.loads(found[0].data_json)
            break
        time.sleep(0.1)
    assert outcome.get("status") == "cancelled", outcome
    # Stopped long before the handler's two minutes: its remaining steps never ran.
    assert float(str(outcome["duration_ms"])) < 60_000
    progress = [e for e in events_of(mesh, "stream-5") if e.event_type == "progress"]
    assert 1 <= len(progress) < 100


def test_a_stream_whose_deadline_passes_is_logged_as_such(mesh: Mesh) -> None:
    call = mesh.dispatcher.DispatchToolCallStream(
        stream_request(
            "s-6", {"progress_steps": 100, "delay_ms": 120_000}, conversation="stream-6"
        ),
        timeout=1.5,
    )
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    entries: list[dpb.ExecutionLogEntry] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not entries:
        entries = list(
            mesh.dispatcher.ListExecutionLog(
                dpb.ListExecutionLogRequest(conversation_id="stream-6", limit=5), timeout=30
            ).entries
        )
        time.sleep(0.1)
    (entry,) = entries
    assert not entry.success
    assert entry.error == "ping was cancelled: the client's deadline passed"
