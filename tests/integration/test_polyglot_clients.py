"""Clients that know the mesh only by its contract: a Node client built from the .proto files
alone (tests/clients/node: unary calls, the server-streaming DispatchToolCallStream, and result
tables decoded from Arrow IPC with apache-arrow), a Python client that learns the API through
server reflection, and the standard health service."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as refl
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from shared.arrow_ipc import ipc_to_table
from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb

pytestmark = pytest.mark.integration

NODE_CLIENT = Path(__file__).parent.parent / "clients" / "node"
STREAM_JS = NODE_CLIENT / "stream.js"
DATASETS_JS = NODE_CLIENT / "datasets.js"
NODE_TENANT = "node-tenant"  # the tenant every script of the Node client calls for
NPM_TIMEOUT_S = 300
NODE_TIMEOUT_S = 90

DISPATCHER_SERVICE = "toolmesh.dispatcher.v1.DispatcherService"
REGISTRY_SERVICE = "toolmesh.registry.v1.RegistryService"

# googleapis-common-protos ships google/rpc/status.proto and error_details.proto next to the
# generated modules; the Node client decodes the ErrorInfo of a status with them.
GOOGLEAPIS_PROTOS = Path(status_pb2.__file__).parent.parent.parent
HAS_GOOGLE_RPC_PROTOS = (GOOGLEAPIS_PROTOS / "google" / "rpc" / "error_details.proto").is_file()


def _installed_matches_pins() -> bool:
    """Whether node_modules holds exactly the versions that package.json pins."""
    pins = json.loads((NODE_CLIENT / "package.json").read_text())["dependencies"]
    for name, version in pins.items():
        manifest = NODE_CLIENT / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text())["version"] != version:
            return False
    return True


@pytest.fixture(scope="module")
def node_client() -> Iterator[Path]:
    """The Node client's dependencies installed (npm ci from the lock file); skips only when
    node or npm is not on PATH."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm must be on PATH for the Node client tests")
    # Serialize concurrent test runs: `npm ci` deletes node_modules before it installs.
    key = hashlib.sha256(str(NODE_CLIENT.resolve()).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"toolmesh-node-client-{key}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed_matches_pins():
            has_lock = (NODE_CLIENT / "package-lock.json").is_file()
            command = [npm, "ci" if has_lock else "install", "--no-audit", "--no-fund"]
            # No dependency needs an install script (grpc-js, apache-arrow and fzstd are pure
            # JavaScript).
            command.append("--ignore-scripts")
            done = subprocess.run(
                command,
                cwd=NODE_CLIENT,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT_S,
                check=False,
            )
            assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"
            assert _installed_matches_pins(), "node_modules does not hold the pinned versions"
    yield NODE_CLIENT / "dispatch.js"


def run_node_lines(script: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run a script of the Node client; returns its exit code and the JSON lines it printed."""
    env = dict(os.environ)
    if HAS_GOOGLE_RPC_PROTOS:
        env["TOOLMESH_PROTO_INCLUDE"] = str(GOOGLEAPIS_PROTOS)
    done = subprocess.run(
        ["node", str(script), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode in (0, 3), f"node exited {done.returncode}:\n{done.stderr}"
    try:
        return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON lines: {done.stdout!r} ({done.stderr})") from exc


def run_node(
    script: Path, address: str, tool: str, input_json: str, conversation: str
) -> tuple[int, dict[str, Any]]:
    """Run a one-answer script of the Node client (dispatch.js, datasets.js); returns its exit
    code and the one JSON line it printed."""
    code, lines = run_node_lines(script, address, tool, input_json, conversation)
    assert len(lines) == 1, f"expected one JSON line, got {lines!r}"
    return code, lines[0]


def test_a_node_client_calls_ping_and_the_call_is_logged_for_its_tenant(
    mesh: Mesh, node_client: Path
) -> None:
    code, response = run_node(
        node_client, mesh.address("dispatcher"), "ping", '{"echo": {"n": 3}}', "node-ping"
    )
    assert code == 0
    envelope = response["result"]["envelope"]
    assert envelope["kind"] == "ok"
    data = json.loads(envelope["ok"]["data_json"])
    assert data == {"pong": True, "echo": {"n": 3}}
    assert isinstance(data["echo"]["n"], int)
    assert response["result"]["content"].startswith("✓ ok.")
    assert response["tool_use_id"].startswith("toolu_")
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="node-ping")
    ).entries
    assert [(e.tool_name, e.tenant_id, e.success) for e in entries] == [
        ("ping", "node-tenant", True)
    ]
    assert entries[0].tool_use_id == response["tool_use_id"]


def test_a_node_client_gets_not_found_for_an_unknown_tool(mesh: Mesh, node_client: Path) -> None:
    code, error = run_node(node_client, mesh.address("dispatcher"), "pnig", "{}", "node-unknown")
    assert code == 3
    assert error["code"] == grpc.StatusCode.NOT_FOUND.value[0] == 5
    assert error["details"]
    assert error["reason"] == ("TOOL_NOT_FOUND" if HAS_GOOGLE_RPC_PROTOS else None)


def test_a_node_client_streams_progress_an_export_the_text_and_the_result_last(
    mesh: Mesh, node_client: Path
) -> None:
    inputs = {"progress_steps": 3, "delay_ms": 150, "echo": {"n": 3}, "export_text": "hello"}
    code, messages = run_node_lines(
        STREAM_JS, mesh.address("dispatcher"), "ping", json.dumps(inputs), "node-stream"
    )
    assert code == 0
    kinds = [m["event"] for m in messages]
    assert all(set(m) == {"event", m["event"]} for m in messages)
    # In the order things happened: the handler's progress, the export, the text, the result.
    assert kinds[:4] == ["progress", "progress", "progress", "export_ready"]
    assert set(kinds[4:-1]) == {"text_delta"}
    assert kinds[-1] == "result"
    progress = [m["progress"] for m in messages[:3]]
    assert [p["message"] for p in progress] == [f"ping step {i} of 3" for i in (1, 2, 3)]
    assert [round(p["fraction"], 3) for p in progress] == [0.0, 0.333, 0.667]
    final = messages[-1]["result"]
    assert {p["tool_use_id"] for p in progress} == {final["tool_use_id"]}
    assert final["tool_use_id"].startswith("toolu_")
    envelope = final["result"]["envelope"]
    assert envelope["kind"] == "ok"
    assert json.loads(envelope["ok"]["data_json"]) == {"pong": True, "echo": {"n": 3}}
    text = "".join(m["text_delta"]["text"] for m in messages if m["event"] == "text_delta")
    assert text == final["result"]["content"] and text.startswith("✓ ok.")
    (export,) = final["result"]["exports"]
    ready = messages[3]["export_ready"]
    assert (ready["filename"], ready["file_id"]) == ("ping.txt", export["file_id"])
    assert int(ready["size_bytes"]) == len("hello")
    # The streamed call is logged for the Node client's tenant, with the progress it streamed.
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id="node-stream")
    ).entries
    assert [(e.tool_name, e.tenant_id, e.success, e.tool_use_id) for e in entries] == [
        ("ping", NODE_TENANT, True, final["tool_use_id"])
    ]
    events = conversation_events(mesh, "node-stream")
    assert [e.event_type for e in events].count("progress") == 3


def test_a_node_stream_of_an_unknown_tool_ends_with_not_found(
    mesh: Mesh, node_client: Path
) -> None:
    code, lines = run_node_lines(
        STREAM_JS, mesh.address("dispatcher"), "pnig", "{}", "node-stream-unknown"
    )
    assert code == 3
    (error,) = lines  # nothing streamed before the status
    assert error["code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert error["reason"] == ("TOOL_NOT_FOUND" if HAS_GOOGLE_RPC_PROTOS else None)


def conversation_events(mesh: Mesh, conversation: str) -> list[dpb.ConversationEvent]:
    return list(
        mesh.dispatcher.ListConversationEvents(
            dpb.ListConversationEventsRequest(conversation_id=conversation, tenant_id=NODE_TENANT),
            timeout=30,
        ).events
    )


def test_a_node_client_that_cancels_the_stream_stops_the_call(
    mesh: Mesh, node_client: Path
) -> None:
    inputs = {"progress_steps": 100, "delay_ms": 120_000}
    code, lines = run_node_lines(
        STREAM_JS,
        "--cancel-after",
        "1",
        mesh.address("dispatcher"),
        "ping",
        json.dumps(inputs),
        "node-stream-cancel",
    )
    assert code == 3
    first, status = lines
    assert first["event"] == "progress"
    assert status["code"] == grpc.StatusCode.CANCELLED.value[0] == 1
    outcome: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not outcome:
        found = [
            e for e in conversation_events(mesh, "node-stream-cancel") if e.event_type == "outcome"
        ]
        outcome = json.loads(found[0].data_json) if found else {}
        time.sleep(0.1)
    assert outcome.get("status") == "cancelled", outcome
    # Stopped long before the handler's two minutes.
    assert float(outcome["duration_ms"]) < 60_000


# A CSV of every kind of value a table carries: integers (one column past 2^53, which a JS
# number cannot hold, and one with a null), floats, strings, nulls and a timestamp.
TYPES_CSV = """id,label,score,count,big,seen_at
1,alpha,1.5,10,9007199254740993,2024-01-02T03:04:05.123456
2,,2.0,,-9007199254740993,2024-02-29T00:00:00
3,Zoë,,7,0,
4,delta,-0.25,1,42,2023-12-31T23:59:59
"""
TYPES_ROWS = [
    {
        "id": 1,
        "label": "alpha",
        "score": 1.5,
        "count": 10,
        "big": 9007199254740993,
        "seen_at": datetime(2024, 1, 2, 3, 4, 5, 123456),
    },
    {
        "id": 2,
        "label": None,
        "score": 2.0,
        "count": None,
        "big": -9007199254740993,
        "seen_at": datetime(2024, 2, 29),
    },
    {"id": 3, "label": "Zoë", "score": None, "count": 7, "big": 0, "seen_at": None},
    {
        "id": 4,
        "label": "delta",
        "score": -0.25,
        "count": 1,
        "big": 42,
        "seen_at": datetime(2023, 12, 31, 23, 59, 59),
    },
]
# The Arrow type names apache-arrow gives the types pyarrow reads.
ARROW_JS_TYPES = {
    "int64": "Int64",
    "double": "Float64",
    "large_string": "LargeUtf8",
    "string": "Utf8",
    "bool": "Bool",
    "date32[day]": "Date32<DAY>",
    "timestamp[us]": "Timestamp<MICROSECOND>",
    "timestamp[us, tz=UTC]": "Timestamp<MICROSECOND, UTC>",
}


def node_table(mesh: Mesh, tool: str, inputs: dict[str, Any], conversation: str) -> dict[str, Any]:
    """A tool's result table as the Node client decodes it (datasets.js)."""
    code, answer = run_node(
        DATASETS_JS, mesh.address("dispatcher"), tool, json.dumps(inputs), conversation
    )
    assert code == 0, answer
    assert answer["kind"] == "ok", answer["content"]
    assert answer["table"] is not None, answer
    assert answer["table"]["row_count"] == len(answer["table"]["rows"])
    table: dict[str, Any] = answer["table"]
    return table


def python_table(mesh: Mesh, tool: str, inputs: dict[str, Any], conversation: str) -> pa.Table:
    """The same call's result table as Python decodes it."""
    result = mesh.call(tool, json.dumps(inputs), conversation=conversation, tenant=NODE_TENANT)
    assert result.result.envelope.WhichOneof("kind") == "ok", result.result.content
    return ipc_to_table(result.result.envelope.ok.table.arrow_ipc)


def as_python(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Node's rows with its ISO 8601 timestamps and dates parsed (JSON has no such types)."""
    types = {f["name"]: f["type"] for f in table["fields"]}
    rows = []
    for row in table["rows"]:
        parsed = dict(row)
        for name, value in row.items():
            if value is not None and types[name].startswith("Timestamp"):
                parsed[name] = datetime.fromisoformat(value)
            elif value is not None and types[name].startswith("Date"):
                parsed[name] = date.fromisoformat(value)
        rows.append(parsed)
    return rows


def assert_same_table(node: dict[str, Any], python: pa.Table) -> list[dict[str, Any]]:
    """Node decoded the same columns, types and values (of the same Python types) as Python."""
    assert [(f["name"], f["type"]) for f in node["fields"]] == [
        (f.name, ARROW_JS_TYPES[str(f.type)]) for f in python.schema
    ]
    rows = as_python(node)
    expected = python.to_pylist()
    assert rows == expected
    assert [[type(v) for v in row.values()] for row in rows] == [
        [type(v) for v in row.values()] for row in expected
    ]
    return rows


def test_a_node_client_decodes_the_arrow_tables_of_load_preview_and_query(
    mesh: Mesh, node_client: Path
) -> None:
    (mesh.files_dir / "node_types.csv").write_text(TYPES_CSV, encoding="utf-8")
    conversation = "node-arrow"
    loaded = node_table(mesh, "load_dataset", {"path": "node_types.csv"}, conversation)
    assert as_python(loaded) == TYPES_ROWS
    assert [f["type"] for f in loaded["fields"]] == [
        "Int64",
        "LargeUtf8",
        "Float64",
        "Int64",
        "Int64",
        "Timestamp<MICROSECOND>",
    ]
    # Integers are JSON integers (exact past 2^53), floats JSON floats even when whole.
    assert [type(v) for v in loaded["rows"][0].values()] == [int, str, float, int, int, str]
    assert loaded["rows"][0]["seen_at"] == "2024-01-02T03:04:05.123456"

    for tool, inputs in [
        ("preview_data", {"name": "node_types", "limit": 2, "offset": 1}),
        ("query", {"sql": "SELECT * FROM node_types ORDER BY id DESC"}),
        ("query", {"sql": "SELECT label, big + 1 AS next, score * 2 AS twice FROM node_types"}),
    ]:
        node = node_table(mesh, tool, inputs, conversation)
        rows = assert_same_table(node, python_table(mesh, tool, inputs, conversation))
        if tool == "preview_data":
            assert rows == TYPES_ROWS[1:3]
        elif "DESC" in inputs["sql"]:
            assert rows == TYPES_ROWS[::-1]
        else:
            assert [r["next"] for r in rows] == [9007199254740994, -9007199254740992, 1, 43]
            assert [r["twice"] for r in rows] == [3.0, 4.0, None, -0.5]


def test_a_node_client_decodes_a_parquet_dataset_with_zoned_timestamps_dates_and_booleans(
    mesh: Mesh, node_client: Path
) -> None:
    table = pa.table(
        {
            "n": pa.array([2**62, -1, 0], pa.int64()),
            "at": pa.array([1_704_164_645_123_456, None, -1], pa.timestamp("us", tz="UTC")),
            "day": pa.array([date(2024, 2, 29), None, date(1969, 12, 31)], pa.date32()),
            "flag": pa.array([True, False, True]),
            "ratio": pa.array([0.5, None, 3.0]),
        }
    )
    pq.write_table(table, mesh.files_dir / "node_zoned.parquet")
    conversation = "node-arrow-parquet"
    inputs = {"path": "node_zoned.parquet"}
    node = node_table(mesh, "load_dataset", inputs, conversation)
    rows = assert_same_table(node, python_table(mesh, "load_dataset", inputs, conversation))
    assert [r["n"] for r in node["rows"]] == [2**62, -1, 0]
    assert [r["at"] for r in node["rows"]] == [
        "2024-01-02T03:04:05.123456Z",
        None,
        "1969-12-31T23:59:59.999999Z",
    ]
    assert [r["day"] for r in node["rows"]] == ["2024-02-29", None, "1969-12-31"]
    assert [r["flag"] for r in rows] == [True, False, True]
    assert [r["ratio"] for r in node["rows"]] == [0.5, None, 3.0]


def test_a_reflection_only_client_discovers_and_calls_the_dispatcher(mesh: Mesh) -> None:
    with grpc.insecure_channel(mesh.address("registry")) as channel:
        assert REGISTRY_SERVICE in ProtoReflectionDescriptorDatabase(channel).get_services()

    with grpc.insecure_channel(mesh.address("dispatcher")) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert DISPATCHER_SERVICE in database.get_services()
        # A pool of its own, fed only by reflection (not the default pool of generated code).
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(DISPATCHER_SERVICE)
        methods = {m.name: m for m in service.methods}
        assert "DispatchToolCall" in methods
        method = methods["DispatchToolCall"]
        assert method.input_type.file.pool is pool
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)

        request = request_class(
            tool_use={"name": "ping", "input_json": '{"echo": "reflected"}'},
            context={"tenant_id": "reflection-tenant", "conversation_id": "reflection"},
        )
        call = channel.unary_unary(
            f"/{DISPATCHER_SERVICE}/DispatchToolCall",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        response = call(request, timeout=60)

    assert response.result.content.startswith("✓ ok.")
    assert response.result.envelope.WhichOneof("kind") == "ok"
    assert json.loads(response.result.envelope.ok.data_json)["echo"] == "reflected"


def reflect_v1(channel: grpc.Channel, *requests: refl.ServerReflectionRequest) -> list[Any]:
    """Requests on grpc.reflection.v1.ServerReflection, as a v1-only client sends them (its
    messages are v1alpha's on the wire)."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=refl.ServerReflectionRequest.SerializeToString,
        response_deserializer=refl.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=30))


def pool_of(responses: list[Any]) -> descriptor_pool.DescriptorPool:
    """A fresh pool of the files reflection sent, each added after its dependencies."""
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for response in responses:
        for raw in response.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[proto.name] = proto
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        for dependency in files[name].dependency:
            add(dependency)
        pool.Add(files[name])
        added.add(name)

    for name in files:
        add(name)
    return pool


def test_a_client_speaking_only_reflection_v1_discovers_and_calls_the_dispatcher(
    mesh: Mesh,
) -> None:
    with grpc.insecure_channel(mesh.address("dispatcher")) as channel:
        (listing,) = reflect_v1(channel, refl.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listing.list_services_response.service}
        assert {DISPATCHER_SERVICE, "grpc.reflection.v1.ServerReflection"} <= names
        assert "grpc.reflection.v1alpha.ServerReflection" in names

        found = reflect_v1(
            channel,
            refl.ServerReflectionRequest(file_containing_symbol=DISPATCHER_SERVICE),
            refl.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            ),
        )
        pool = pool_of(found)
        v1 = pool.FindServiceByName("grpc.reflection.v1.ServerReflection")
        assert v1.methods[0].input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"
        method = pool.FindMethodByName(f"{DISPATCHER_SERVICE}.DispatchToolCall")
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            f"/{DISPATCHER_SERVICE}/DispatchToolCall",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        response = call(
            request_class(
                tool_use={"name": "ping", "input_json": '{"echo": "v1"}'},
                context={"tenant_id": "reflection-v1", "conversation_id": "reflection-v1"},
            ),
            timeout=60,
        )
    assert json.loads(response.result.envelope.ok.data_json)["echo"] == "v1"

    with grpc.insecure_channel(mesh.address("registry")) as channel:
        (unknown,) = reflect_v1(
            channel, refl.ServerReflectionRequest(file_containing_symbol="no.such.Symbol")
        )
        assert unknown.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_a_request_with_a_string_that_is_not_utf8_is_invalid_argument(mesh: Mesh) -> None:
    """Some languages' protobuf libraries let a client put bytes that are not UTF-8 in a string
    field: the dispatcher names the message and the problem instead of gRPC's UNKNOWN."""
    good = dpb.DispatchToolCallRequest(
        tool_use={"name": "ping", "input_json": '{"echo": "AAAA"}'},
        context={"tenant_id": "utf8-tenant", "conversation_id": "utf8"},
    ).SerializeToString()
    with grpc.insecure_channel(mesh.address("dispatcher")) as channel:
        call = channel.unary_unary(f"/{DISPATCHER_SERVICE}/DispatchToolCall")
        with pytest.raises(grpc.RpcError) as caught:
            call(good.replace(b"AAAA", b"\xff\xfe\xfd\xfc"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "toolmesh.dispatcher.v1.DispatchToolCallRequest" in caught.value.details()
        assert "UTF-8" in caught.value.details()
        answer = dpb.DispatchToolCallResponse.FromString(call(good, timeout=30))
    assert json.loads(answer.result.envelope.ok.data_json)["echo"] == "AAAA"


@pytest.mark.parametrize(
    ("process", "service"),
    [
        ("dispatcher", ""),
        ("dispatcher", DISPATCHER_SERVICE),
        ("registry", ""),
        ("registry", REGISTRY_SERVICE),
    ],
)
def test_the_standard_health_service_answers_serving(
    mesh: Mesh, process: str, service: str
) -> None:
    with grpc.insecure_channel(mesh.address(process)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("process", ["dispatcher", "registry"])
def test_the_health_watch_streams_serving(mesh: Mesh, process: str) -> None:
    """Watch is what gRPC clients' own health checking (service config healthCheckConfig) and
    many load balancers use; it failed INTERNAL before (the handler wrapper took the servicer's
    context.write style for a generator)."""
    with grpc.insecure_channel(mesh.address(process)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        first = next(iter(watch))
        watch.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
