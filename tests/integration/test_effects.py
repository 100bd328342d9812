"""Exports through the real mesh: a tool's export is registered by the dispatcher (file id,
`export` and `export.ready` events, a notice on the stream), listed by ListExports, downloaded
byte for byte by the streaming GetExport and by `toolmesh export get`."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from shared.cli.main import main as toolmesh
from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.type.v1 import types_pb2 as pb

TEXT = "résumé,total\n" + "x" * 200_000 + "\n"  # several GetExport chunks


def download(mesh: Mesh, file_id: str, tenant: str = "tenant-a") -> tuple[dpb.ExportFile, bytes]:
    messages = list(
        mesh.dispatcher.GetExport(
            dpb.GetExportRequest(file_id=file_id, tenant_id=tenant), timeout=30
        )
    )
    assert messages[0].WhichOneof("part") == "info"
    assert all(m.WhichOneof("part") == "chunk" for m in messages[1:])
    return messages[0].info, b"".join(m.chunk for m in messages[1:])


@pytest.fixture(scope="module")
def exported(mesh: Mesh) -> dpb.DispatchToolCallResponse:
    return mesh.call(
        "ping", json.dumps({"export_text": TEXT}), conversation="exports-1", tool_use_id="e-1"
    )


def test_an_export_is_registered_and_announced(
    mesh: Mesh, exported: dpb.DispatchToolCallResponse
) -> None:
    assert exported.result.envelope.WhichOneof("kind") == "ok"
    (export,) = exported.result.exports
    assert len(export.file_id) == 32 and export.filename == "ping.txt"
    assert export.size_bytes == len(TEXT.encode()) and export.path.startswith("exports/")
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(conversation_id="exports-1", tenant_id="tenant-a"),
        timeout=30,
    ).events
    by_type = {e.event_type: json.loads(e.data_json) for e in events}
    assert by_type["export"]["file_id"] == export.file_id
    assert by_type["export.ready"] == {
        "title": "ping.txt is ready",
        "file_id": export.file_id,
        "filename": "ping.txt",
        "size_bytes": export.size_bytes,
        "mime_type": "text/plain",
    }
    listed = mesh.dispatcher.ListExports(
        dpb.ListExportsRequest(conversation_id="exports-1", tenant_id="tenant-a"), timeout=30
    ).exports
    assert [e.file_id for e in listed] == [export.file_id]
    assert listed[0].tool_use_id == "e-1" and listed[0].source_tool == "ping"


def test_get_export_streams_the_file_byte_for_byte(
    mesh: Mesh, exported: dpb.DispatchToolCallResponse
) -> None:
    info, data = download(mesh, exported.result.exports[0].file_id)
    assert data == TEXT.encode() and info.size_bytes == len(data)
    assert info.filename == "ping.txt" and info.mime_type == "text/plain"


def test_get_export_of_an_unknown_or_foreign_id_is_not_found(
    mesh: Mesh, exported: dpb.DispatchToolCallResponse
) -> None:
    for file_id, tenant in (("0" * 32, "tenant-a"), (exported.result.exports[0].file_id, "b")):
        with pytest.raises(grpc.RpcError) as info:
            download(mesh, file_id, tenant)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        download(mesh, "")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_streamed_call_announces_its_export_before_the_result(mesh: Mesh) -> None:
    messages = list(
        mesh.dispatcher.DispatchToolCallStream(
            dpb.DispatchToolCallStreamRequest(
                tool_use=pb.ToolUse(id="e-2", name="ping", input_json='{"export_text": "hi"}'),
                context=pb.CallContext(tenant_id="tenant-a", conversation_id="exports-2"),
            ),
            timeout=60,
        )
    )
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds.index("export_ready") < kinds.index("result") == len(kinds) - 1
    ready = messages[kinds.index("export_ready")].export_ready
    assert ready.file_id == messages[-1].result.result.exports[0].file_id
    assert ready.size_bytes == 2


def test_toolmesh_export_list_and_get(
    mesh: Mesh,
    exported: dpb.DispatchToolCallResponse,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file_id = exported.result.exports[0].file_id
    common = ["--tenant", "tenant-a", "--dispatcher", mesh.address("dispatcher")]
    assert toolmesh(["export", "list", "--conversation", "exports-1", "--json", *common]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["fileId"] for e in listed] == [file_id]
    assert toolmesh(["export", "get", file_id, "-o", str(tmp_path), *common]) == 0
    assert (tmp_path / "ping.txt").read_bytes() == TEXT.encode()
    capsys.readouterr()
    # An existing file is kept unless --force; an unknown id exits 2 naming NOT_FOUND.
    assert toolmesh(["export", "get", file_id, "-o", str(tmp_path), *common]) == 1
    assert "exists" in capsys.readouterr().err
    assert toolmesh(["export", "get", "f" * 32, "-o", str(tmp_path), *common]) == 2
    assert "NOT_FOUND" in capsys.readouterr().err
