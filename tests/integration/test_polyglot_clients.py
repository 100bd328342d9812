"""Clients that know the mesh only by its contract: a Node client built from the .proto files
alone (tests/clients/node), a Python client that learns the API through server reflection, and
the standard health service."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as refl
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb

pytestmark = pytest.mark.integration

NODE_CLIENT = Path(__file__).parent.parent / "clients" / "node"
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
            # No dependency needs an install script (grpc-js is pure JavaScript).
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


def run_node(
    script: Path, address: str, tool: str, input_json: str, conversation: str
) -> tuple[int, dict[str, Any]]:
    """Run the Node client; returns its exit code and the one JSON line it printed."""
    env = dict(os.environ)
    if HAS_GOOGLE_RPC_PROTOS:
        env["TOOLMESH_PROTO_INCLUDE"] = str(GOOGLEAPIS_PROTOS)
    done = subprocess.run(
        ["node", str(script), address, tool, input_json, conversation],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert done.returncode in (0, 3), f"node exited {done.returncode}:\n{done.stderr}"
    assert len(lines) == 1, f"expected one JSON line, got {done.stdout!r} ({done.stderr})"
    return done.returncode, json.loads(lines[0])


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
