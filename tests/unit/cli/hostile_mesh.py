"""A hostile mesh for the CLI's output tests: one loopback gRPC server standing in for every
service, whose answers carry text that would drive a terminal — what a hostile tool or MCP
server gets the real services to relay (tool results, descriptions, error messages, log rows).
It also records the tool calls and policy rules it receives, so the input tests see what the
CLI sent."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from shared.cli.main import main as toolmesh
from shared.errors import InvalidArgument
from shared.rpc_errors import status_message, trailing_metadata
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.surface.v1 import surface_pb2 as sfpb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

# A CSI colour, an OSC 8 hyperlink and an OSC 52 clipboard write (ended by BEL), backspaces and
# a carriage return that overwrite what came before, an 8-bit CSI (U+009B) clearing the
# screen, bidi overrides and isolates that reorder what is shown, and a DEL.
HOSTILE = (
    "start\x1b[31mred\x1b]8;;https://evil.example\x07link\x1b]8;;\x07"
    "\x1b]52;c;ZXZpbA==\x07\x08\x08\rover\x9b2J\u202egnp.exe\u2066iso\u2069\x7fend"
)
# HOSTILE as the CLI shows it: each character a terminal would act on written as an escape.
HOSTILE_SHOWN = (
    "start\\x1b[31mred\\x1b]8;;https://evil.example\\x07link\\x1b]8;;\\x07"
    "\\x1b]52;c;ZXZpbA==\\x07\\x08\\x08\\x0dover\\x9b2J\\u202egnp.exe\\u2066iso\\u2069\\x7fend"
)
# The tool a DispatchToolCall names to be refused with HOSTILE as the error's message.
REFUSED_TOOL = "refused"


@dataclass
class HostileMesh:
    """Where the server listens, and the tool calls and policy rules it was sent."""

    address: str
    calls: list[dpb.DispatchToolCallRequest] = field(default_factory=list)
    rules: list[dpb.PolicyRule] = field(default_factory=list)


def _refuse(context: grpc.ServicerContext) -> None:
    error = InvalidArgument(HOSTILE, reason="HOSTILE_REASON", field_violations=[(HOSTILE, HOSTILE)])
    context.set_trailing_metadata(trailing_metadata(error))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_message(error))


class _Dispatcher(dispatcher_pb2_grpc.DispatcherServiceServicer):
    def __init__(self, mesh: HostileMesh) -> None:
        self._mesh = mesh

    def DispatchToolCall(self, request: Any, context: Any) -> dpb.DispatchToolCallResponse:
        self._mesh.calls.append(request)
        if request.tool_use.name == REFUSED_TOOL:
            _refuse(context)
        return dpb.DispatchToolCallResponse(
            result=pb.ToolResult(content=f"{HOSTILE}\nsecond\tline"), warnings=[HOSTILE]
        )

    def ListExecutionLog(self, request: Any, context: Any) -> dpb.ListExecutionLogResponse:
        entry = dpb.ExecutionLogEntry(
            tool_name=HOSTILE, tenant_id=HOSTILE, conversation_id=HOSTILE, error=HOSTILE
        )
        return dpb.ListExecutionLogResponse(entries=[entry])

    def ListExports(self, request: Any, context: Any) -> dpb.ListExportsResponse:
        export = dpb.ExportFile(
            file_id="f1", filename=HOSTILE, mime_type=HOSTILE, conversation_id=HOSTILE
        )
        return dpb.ListExportsResponse(exports=[export])

    def AddPolicyRule(self, request: Any, context: Any) -> dpb.AddPolicyRuleResponse:
        self._mesh.rules.append(request.rule)
        return dpb.AddPolicyRuleResponse(rule=request.rule)

    def ListPolicyRules(self, request: Any, context: Any) -> dpb.ListPolicyRulesResponse:
        rule = dpb.PolicyRule(id=1, tenant_id=HOSTILE, name=HOSTILE, params_json=HOSTILE)
        return dpb.ListPolicyRulesResponse(rules=[rule])

    def Cancel(self, request: Any, context: Any) -> dpb.CancelResponse:
        return dpb.CancelResponse(message=HOSTILE, cancelled_tool_use_ids=[HOSTILE])


class _Registry(registry_pb2_grpc.RegistryServiceServicer):
    def GetToolsForLLM(self, request: Any, context: Any) -> rpb.GetToolsForLLMResponse:
        tool = rpb.LlmTool(
            name="evil", description=HOSTILE, input_schema_json=json.dumps({"title": HOSTILE})
        )
        return rpb.GetToolsForLLMResponse(tools=[tool])

    def ListTools(self, request: Any, context: Any) -> rpb.ListToolsResponse:
        tool = pb.ToolDefinition(
            name="evil",
            description=HOSTILE,
            category=HOSTILE,
            annotations=pb.ToolAnnotations(title=HOSTILE),
            required_capabilities=[HOSTILE],
        )
        return rpb.ListToolsResponse(tools=[tool])

    def SeedSystemTools(self, request: Any, context: Any) -> rpb.SeedSystemToolsResponse:
        return rpb.SeedSystemToolsResponse(created=[HOSTILE])

    def GetUsageStats(self, request: Any, context: Any) -> rpb.GetUsageStatsResponse:
        return rpb.GetUsageStatsResponse(stats=[rpb.UsageStats(key=HOSTILE, calls=1)])

    def GetContractStats(self, request: Any, context: Any) -> rpb.GetContractStatsResponse:
        stats = rpb.ContractStats(tool_name=HOSTILE, hint_kinds={HOSTILE: 1})
        return rpb.GetContractStatsResponse(stats=[stats], instance=HOSTILE)


class _Bridge(mcp_bridge_pb2_grpc.McpBridgeServiceServicer):
    def ListConnections(self, request: Any, context: Any) -> mpb.ListConnectionsResponse:
        connection = mpb.Connection(
            server=mpb.ServerConfig(name="evil"),
            server_name=HOSTILE,
            protocol_version=HOSTILE,
            last_error=HOSTILE,
        )
        return mpb.ListConnectionsResponse(connections=[connection])


class _Sandbox(sandbox_pb2_grpc.SandboxServiceServicer):
    def ListJobs(self, request: Any, context: Any) -> spb.ListJobsResponse:
        job = spb.Job(id=HOSTILE, tool_name=HOSTILE, spec_json=json.dumps({"request": HOSTILE}))
        return spb.ListJobsResponse(jobs=[job])


class _Surface(surface_pb2_grpc.SurfaceServiceServicer):
    def DeriveTier0(self, request: Any, context: Any) -> sfpb.DeriveTier0Response:
        return sfpb.DeriveTier0Response(names=[HOSTILE], warning=HOSTILE)

    def ListModelConfigs(self, request: Any, context: Any) -> sfpb.ListModelConfigsResponse:
        config = sfpb.ModelConfig(model=HOSTILE, provider=HOSTILE, roles=[HOSTILE])
        return sfpb.ListModelConfigsResponse(configs=[config])


@contextmanager
def hostile_mesh() -> Iterator[HostileMesh]:
    """Every service of the mesh on one loopback port, answering HOSTILE text."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port("127.0.0.1:0")
    mesh = HostileMesh(f"127.0.0.1:{port}")
    dispatcher_pb2_grpc.add_DispatcherServiceServicer_to_server(_Dispatcher(mesh), server)
    registry_pb2_grpc.add_RegistryServiceServicer_to_server(_Registry(), server)
    mcp_bridge_pb2_grpc.add_McpBridgeServiceServicer_to_server(_Bridge(), server)
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(_Sandbox(), server)
    surface_pb2_grpc.add_SurfaceServiceServicer_to_server(_Surface(), server)
    server.start()
    try:
        yield mesh
    finally:
        server.stop(None)


SERVICES = ("REGISTRY", "DISPATCHER", "SANDBOX", "MCP_BRIDGE", "SURFACE")


def point_cli_at(address: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CLI's environment: no inherited TOOLMESH_/OTEL_ setting, every service at
    `address`, a data directory of the test's own."""
    for key in list(os.environ):
        if key.startswith(("TOOLMESH_", "OTEL_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TOOLMESH_DATA_DIR", str(tmp_path / "data"))
    for service in SERVICES:
        monkeypatch.setenv(f"TOOLMESH_{service}_ADDR", address)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`toolmesh argv` in process: exit code, stdout, stderr (argparse's exits included)."""
    try:
        code = toolmesh(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]
