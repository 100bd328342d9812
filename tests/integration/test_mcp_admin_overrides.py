"""What an administrator sets on a registered MCP tool survives the bridge listing the server's
tools again, through the real mesh (dispatcher, registry and mcp_bridge as processes, on each
database): a capability added with UpsertTools, a timeout, a disable with SetToolStatus stay
through an announced tool change and a Reconnect, beside the bridge's destructive gate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.telemetry.collector import MemorySpanSink
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh
from tests.integration.test_mcp_bridge import RAW, ROOT, bridge, connected, stdio, wait_for
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

GATE = "mcp.destructive"
ADMIN = "billing.admin"


@pytest.fixture(scope="module", params=BACKENDS)
def gated_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    """The mesh with an MCP bridge gating tools declared destructive behind GATE."""
    env = {"TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY": GATE, "PYTHONPATH": ROOT}
    with backend_mesh(
        request, tmp_path_factory, collector, "mcp-admin", env, services=["mcp_bridge"]
    ) as mesh:
        yield mesh


def called(
    mesh: Mesh, name: str, conversation: str, *capabilities: str
) -> dpb.DispatchToolCallResponse:
    return mesh.call(name, conversation=conversation, capabilities=capabilities)


def test_an_administrators_capability_timeout_and_disable_survive_relistings(
    gated_mesh: Mesh, tmp_path: Path
) -> None:
    mesh = gated_mesh
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            [
                {
                    "name": "purge",
                    "description": "Purge widgets.",
                    "inputSchema": {"type": "object"},
                    "annotations": {"destructiveHint": True},
                },
                {"name": "widget", "description": "A widget.", "inputSchema": {"type": "object"}},
            ]
        )
    )
    stub = bridge(mesh)
    stub.Connect(stdio("inv", RAW, "--inventory", str(inventory), "--announce-changes"), timeout=60)
    registry = mesh.registry
    purge = registry.GetTool(rpb.GetToolRequest(name="mcp_inv_purge"), timeout=30).tool
    assert list(purge.required_capabilities) == [GATE]

    # The administrator's changes: GetTool, edit, UpsertTools; and SetToolStatus.
    purge.required_capabilities.append(ADMIN)
    purge.timeout_seconds = 45.0
    registry.UpsertTools(rpb.UpsertToolsRequest(tools=[purge]), timeout=30)
    registry.SetToolStatus(
        rpb.SetToolStatusRequest(name="mcp_inv_widget", enabled=False), timeout=30
    )

    def as_the_administrator_left_them(conversation: str) -> None:
        purge = registry.GetTool(rpb.GetToolRequest(name="mcp_inv_purge"), timeout=30).tool
        assert list(purge.required_capabilities) == [GATE, ADMIN]
        assert purge.timeout_seconds == 45.0
        widget = registry.GetTool(rpb.GetToolRequest(name="mcp_inv_widget"), timeout=30).tool
        assert not widget.enabled
        for caller in ([GATE], [ADMIN]):
            refused = called(mesh, "mcp_inv_purge", f"{conversation}-{caller[0]}", *caller)
            assert refused.result.envelope.err.err_kind == "permission_denied"
        ran = called(mesh, "mcp_inv_purge", f"{conversation}-both", GATE, ADMIN)
        assert json.loads(ran.result.envelope.ok.data_json) == "purge v1"
        disabled = called(mesh, "mcp_inv_widget", f"{conversation}-widget")
        assert disabled.result.envelope.err.err_kind == "tool_disabled"

    # The server announces a change (notifications/tools/list_changed): the bridge lists again.
    reloaded = called(mesh, "mcp_inv_reload", "admin-reload")
    assert json.loads(reloaded.result.envelope.ok.data_json) == "reloaded 2 tools"
    wait_for(lambda: (c := connected(mesh, "inv")) is not None and c.tool_list_changes >= 1)
    as_the_administrator_left_them("admin-1")

    report = stub.Reconnect(mpb.ReconnectRequest(name="inv"), timeout=60)
    assert list(report.changed) == []
    as_the_administrator_left_them("admin-2")

    # The administrator can still take a capability off; the bridge's gate stays the bridge's.
    purge = registry.GetTool(rpb.GetToolRequest(name="mcp_inv_purge"), timeout=30).tool
    del purge.required_capabilities[:]
    registry.UpsertTools(rpb.UpsertToolsRequest(tools=[purge]), timeout=30)
    stub.Reconnect(mpb.ReconnectRequest(name="inv"), timeout=60)
    purge = registry.GetTool(rpb.GetToolRequest(name="mcp_inv_purge"), timeout=30).tool
    assert list(purge.required_capabilities) == [GATE]
    assert purge.status == pb.TOOL_STATUS_APPROVED
    stub.Disconnect(mpb.DisconnectRequest(name="inv"), timeout=60)
