"""A tool that floods progress, streamed to a client that reads slowly, through real processes:
dispatcher -> registry -> mcp_bridge -> the raw MCP test server's `flood` tool (thousands of
progress notifications as fast as it can write them).

While the slow client holds its stream, each hop keeps only the latest progress not yet sent
(progress is a state), so no process's memory grows with the flood; the client still gets the
last progress and then the result. Each hop is tested on its own (its caller reads slowly) as
well as the whole path."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from shared.telemetry.collector import MemorySpanSink
from tests.conftest import fresh_database_url
from tests.integration.conftest import Mesh, free_ports, start_mesh
from tests.support.waiting import wait_for
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

ROOT = str(Path(__file__).resolve().parents[2])
RAW = [sys.executable, "-m", "tests.mcp_servers.raw_server"]
# 20,000 notifications of about 2 KB: some 40 MB of progress if a hop kept every one.
COUNT = 20_000
PAD = 2_000
# What a hop may grow by while its caller holds the stream (the flood is ~40 MB).
MAX_GROWTH_KB = 16 * 1024


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def settle(pids: list[int], timeout: float = 90.0) -> None:
    """Until none of `pids` used CPU for half a second: the flood went as far as it could."""
    deadline = time.monotonic() + timeout
    before = [cpu_ticks(p) for p in pids]
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = [cpu_ticks(p) for p in pids]
        if now == before:
            return
        before = now
    raise AssertionError("the processes never went idle")


@pytest.fixture(scope="module")
def flood_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("flood")
    url = fresh_database_url(request, "sqlite", str(tmp))
    sink, collector_port = collector
    (port,) = free_ports(1)
    extra_env = {"TOOLMESH_MCP_BRIDGE_ADDR": f"127.0.0.1:{port}", "PYTHONPATH": ROOT}
    mesh = start_mesh(
        "sqlite", url, tmp, sink, collector_port, extra_env, also=[("mcp_bridge", port)]
    )
    yield mesh
    mesh.close()


@pytest.fixture
def markers(flood_mesh: Mesh, tmp_path: Path) -> Iterator[Path]:
    """The raw server connected as `flood` (a fresh one per test), writing its markers here."""
    channel = grpc.insecure_channel(flood_mesh.address("mcp_bridge"))
    stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel)
    config = mpb.ServerConfig(
        name="flood",
        transport=mpb.TRANSPORT_STDIO,
        command=RAW[0],
        args=[*RAW[1:], "--marker-dir", str(tmp_path)],
    )
    stub.Connect(mpb.ConnectRequest(server=config), timeout=60)
    try:
        yield tmp_path
    finally:
        stub.Disconnect(mpb.DisconnectRequest(name="flood"), timeout=60)
        channel.close()


def pid_of(mesh: Mesh, service: str) -> int:
    return mesh.processes[service].process.pid


def flood_input() -> str:
    return json.dumps({"count": COUNT, "pad": PAD})


def test_a_slow_stream_client_gets_the_last_progress_and_the_result_with_every_hop_bounded(
    flood_mesh: Mesh, markers: Path
) -> None:
    pids = {s: pid_of(flood_mesh, s) for s in ("dispatcher", "registry", "mcp_bridge")}
    before = {s: rss_kb(p) for s, p in pids.items()}
    call = flood_mesh.dispatcher.DispatchToolCallStream(
        dpb.DispatchToolCallStreamRequest(
            tool_use=pb.ToolUse(id="flood-1", name="mcp_flood_flood", input_json=flood_input()),
            context=pb.CallContext(tenant_id="tenant-a", conversation_id="flood-1"),
        ),
        timeout=300,
    )
    stream = iter(call)
    first = next(stream)
    assert first.WhichOneof("event") == "progress"
    # The client reads nothing more until the dispatcher has finished (and logged) the call.
    wait_for(
        lambda: (
            flood_mesh.dispatcher.ListExecutionLog(
                dpb.ListExecutionLogRequest(conversation_id="flood-1", limit=1), timeout=30
            ).entries
        ),
        timeout=240,
    )
    settle(list(pids.values()))
    growth = {s: rss_kb(p) - before[s] for s, p in pids.items()}
    rest = list(stream)
    messages = [first, *rest]
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds[-1] == "result" and kinds.count("result") == 1
    final = messages[-1].result.result
    assert final.envelope.WhichOneof("kind") == "ok", final.error
    assert f"flooded {COUNT}" in final.content
    progress = [m.progress for m in messages if m.WhichOneof("event") == "progress"]
    # The latest state always arrives, before the result; the superseded ones need not.
    assert json.loads(progress[-1].data_json)["progress"] == COUNT
    assert progress[-1].fraction == pytest.approx(1.0)
    assert progress[-1].message.startswith(f"flood {COUNT} ")
    assert len(progress) < COUNT // 2, len(progress)
    seen = [json.loads(p.data_json)["progress"] for p in progress]
    assert seen == sorted(seen)
    assert all(growth[s] < MAX_GROWTH_KB for s in growth), growth
    # The conversation's record keeps a bounded number of progress events, the last included.
    events = flood_mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(
            conversation_id="flood-1", tenant_id="tenant-a", limit=5000
        ),
        timeout=30,
    ).events
    recorded = [json.loads(e.data_json) for e in events if e.event_type == "progress"]
    assert 1 <= len(recorded) < 1000
    assert recorded[-1]["data"]["progress"] == COUNT
    types = [e.event_type for e in events]
    assert types[-2:] == ["tool_result", "outcome"]


def test_the_registry_keeps_only_the_latest_progress_for_a_slow_caller(
    flood_mesh: Mesh, markers: Path
) -> None:
    registry, bridge = pid_of(flood_mesh, "registry"), pid_of(flood_mesh, "mcp_bridge")
    before = rss_kb(registry)
    call = flood_mesh.registry.ExecuteToolStream(
        rpb.ExecuteToolStreamRequest(
            name="mcp_flood_flood",
            input_json=flood_input(),
            context=pb.CallContext(tenant_id="tenant-a", tool_use_id="flood-2"),
        ),
        timeout=300,
    )
    stream = iter(call)
    first = next(stream)
    assert first.WhichOneof("event") == "progress"
    wait_for(lambda: list(markers.glob("flood-*")), timeout=240)
    settle([registry, bridge])
    growth = rss_kb(registry) - before
    messages = [first, *stream]
    assert messages[-1].WhichOneof("event") == "result"
    assert f"flooded {COUNT}" in messages[-1].result.result.content
    progress = [m.progress for m in messages if m.WhichOneof("event") == "progress"]
    assert json.loads(progress[-1].data_json)["progress"] == COUNT
    assert len(progress) < COUNT // 2, len(progress)
    assert growth < MAX_GROWTH_KB, growth


def test_the_bridge_keeps_only_the_latest_progress_for_a_slow_caller(
    flood_mesh: Mesh, markers: Path
) -> None:
    bridge = pid_of(flood_mesh, "mcp_bridge")
    before = rss_kb(bridge)
    channel = grpc.insecure_channel(flood_mesh.address("mcp_bridge"))
    try:
        call = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel).CallTool(
            mpb.CallToolRequest(connection="flood", tool="flood", arguments_json=flood_input()),
            timeout=300,
        )
        stream = iter(call)
        first = next(stream)
        assert first.WhichOneof("event") == "progress"
        wait_for(lambda: list(markers.glob("flood-*")), timeout=240)
        settle([bridge])
        growth = rss_kb(bridge) - before
        messages = [first, *stream]
    finally:
        channel.close()
    assert messages[-1].WhichOneof("event") == "result"
    assert f"flooded {COUNT}" in messages[-1].result.content
    progress = [m.progress for m in messages if m.WhichOneof("event") == "progress"]
    assert progress[-1].progress == COUNT and progress[-1].total == COUNT
    assert progress[-1].message.startswith(f"flood {COUNT} ")
    assert len(progress) < COUNT // 2, len(progress)
    assert growth < MAX_GROWTH_KB, growth
