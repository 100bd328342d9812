"""The real mesh for integration tests: registry and dispatcher as separate processes on
127.0.0.1 (free ports), an OTLP span receiver in the test process, and sync gRPC stubs."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from shared.launcher import ServiceProcess, service_env, start_services
from shared.telemetry.collector import CollectorThread, MemorySpanSink
from tests.conftest import BACKENDS, fresh_database_url
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

FIXTURES = Path(__file__).parent.parent / "fixtures"


@dataclass
class Mesh:
    """A running mesh and clients to it."""

    backend: str
    database_url: str
    data_dir: Path
    files_dir: Path
    env: dict[str, str]
    spans: MemorySpanSink
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    channels: list[grpc.Channel] = field(default_factory=list)

    def address(self, service: str) -> str:
        return self.processes[service].address

    def _channel(self, service: str) -> grpc.Channel:
        ch = grpc.insecure_channel(self.address(service))
        self.channels.append(ch)
        return ch

    @property
    def dispatcher(self) -> dispatcher_pb2_grpc.DispatcherServiceStub:
        return dispatcher_pb2_grpc.DispatcherServiceStub(self._channel("dispatcher"))

    @property
    def registry(self) -> registry_pb2_grpc.RegistryServiceStub:
        return registry_pb2_grpc.RegistryServiceStub(self._channel("registry"))

    def call(
        self,
        name: str,
        input_json: str = "{}",
        *,
        conversation: str = "conv",
        tenant: str = "tenant-a",
        tool_use_id: str = "",
        capabilities: tuple[str, ...] = (),
        timeout: float = 60,
    ) -> dpb.DispatchToolCallResponse:
        return self.dispatcher.DispatchToolCall(
            dpb.DispatchToolCallRequest(
                tool_use=pb.ToolUse(id=tool_use_id, name=name, input_json=input_json),
                context=pb.CallContext(
                    tenant_id=tenant,
                    user_id="tester",
                    conversation_id=conversation,
                    capabilities=list(capabilities),
                ),
            ),
            timeout=timeout,
        )

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        for proc in reversed(list(self.processes.values())):
            proc.stop()


def start_mesh(
    backend: str,
    database_url: str,
    tmp: Path,
    spans: MemorySpanSink,
    collector_port: int,
    extra_env: dict[str, str] | None = None,
    also: Sequence[tuple[str, int]] = (),
) -> Mesh:
    """Registry and dispatcher, plus the services in `also` ((name, port): their addresses
    are in `extra_env`), all started at once so their start-ups overlap. `database_url` is
    migrated (tests.conftest.fresh_database_url)."""
    data_dir = tmp / "data"
    files = data_dir / "files"
    files.mkdir(parents=True)
    for fixture in FIXTURES.glob("*"):
        shutil.copy(fixture, files / fixture.name)
    env = service_env(
        TOOLMESH_DATA_DIR=str(data_dir),
        TOOLMESH_DATABASE_URL=database_url,
        TOOLMESH_DATA_ROOTS=str(files),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector_port}",
        TOOLMESH_TRACING="1",
        TOOLMESH_LOG_LEVEL="INFO",
        TOOLMESH_SHUTDOWN_GRACE_S="2",
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    env.update(extra_env or {})
    # Custom / MCP tools answer SERVICE_NOT_CONFIGURED unless a fixture starts their service
    # (never the default ports, where a developer's own mesh may be running).
    env.setdefault("TOOLMESH_SANDBOX_ADDR", "")
    env.setdefault("TOOLMESH_MCP_BRIDGE_ADDR", "")
    env.setdefault("TOOLMESH_SURFACE_ADDR", "")
    for key in ("TOOLMESH_REGISTRY_ADDR", "TOOLMESH_DISPATCHER_ADDR"):
        env.pop(key, None)
    mesh = Mesh(backend, database_url, data_dir, files, env, spans)
    # Both start at once (their start-ups overlap), so the registry's port is picked first.
    (registry_port,) = free_ports(1)
    env["TOOLMESH_REGISTRY_ADDR"] = f"127.0.0.1:{registry_port}"
    wanted = [("registry", registry_port), ("dispatcher", 0), *also]
    for proc in start_services(wanted, env=env):
        mesh.processes[proc.name] = proc
    return mesh


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (held open together while picked, so never the same
    one twice) for services a test starts on known ports."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[MemorySpanSink, int]]:
    sink = MemorySpanSink()
    thread = CollectorThread(sink)
    port = thread.start()
    yield sink, port
    thread.stop()


@contextmanager
def backend_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
    label: str,
    extra_env: Mapping[str, str] | None = None,
    services: Sequence[str] = (),
) -> Iterator[Mesh]:
    """The mesh of a fixture parametrized by BACKENDS (request.param), on a fresh database in
    a temporary directory named after `label`, with each of `services` (mcp_bridge, sandbox,
    surface...) started too on a free port, its address in TOOLMESH_<SERVICE>_ADDR; stopped
    when the block ends."""
    tmp = tmp_path_factory.mktemp(f"{label}-{request.param}")
    url = fresh_database_url(request, request.param, str(tmp))
    sink, collector_port = collector
    env = dict(extra_env or {})
    also = list(zip(services, free_ports(len(services)), strict=True))
    for name, port in also:
        env[f"TOOLMESH_{name.upper()}_ADDR"] = f"127.0.0.1:{port}"
    mesh = start_mesh(request.param, url, tmp, sink, collector_port, env, also=also)
    try:
        yield mesh
    finally:
        mesh.close()


@pytest.fixture(scope="module", params=BACKENDS)
def mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    with backend_mesh(request, tmp_path_factory, collector, "mesh") as m:
        yield m
