"""search_tools for the conversation's model through the real mesh (dispatcher, registry and
surface as processes, real gRPC): the model named in CallContext.model travels dispatcher ->
registry -> surface, so a search runs against the model's capability-filtered surface -- a
resident tool the model's native capability replaces is paged in when asked for, never called
already available -- and a model that cannot name a config is refused where the other context
identifiers are; `toolmesh call --model` sends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from shared.rpc_errors import from_rpc_error
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

# openai_responses delivers web search natively: a config claiming it filters web_search.
NATIVE_MODEL = "gpt-native-search"
QUERY = "web search"


@pytest.fixture(scope="module", params=BACKENDS)
def smesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    # Lexical search is enough here, and spares loading the embedding model.
    env = {"TOOLMESH_SURFACE_EMBEDDINGS": "0"}
    with backend_mesh(
        request, tmp_path_factory, collector, "search-model", env, services=["surface"]
    ) as mesh:
        mesh.registry.UpsertTools(
            rpb.UpsertToolsRequest(
                tools=[
                    pb.ToolDefinition(
                        name="web_search",
                        description="Search the web and return result snippets with links.",
                        input_schema_json=json.dumps(
                            {"type": "object", "properties": {"q": {"type": "string"}}}
                        ),
                        tool_type=pb.TOOL_TYPE_CUSTOM,
                        status=pb.TOOL_STATUS_APPROVED,
                        enabled=True,
                        implementation="def run(inputs):\n    return {}\n",
                        tenant_id="*",
                        created_by="search-model-test",
                        replaced_by_model_capability="web_search",
                    )
                ]
            ),
            timeout=60,
        )
        surface(mesh).UpsertModelConfig(
            spb.UpsertModelConfigRequest(
                config=spb.ModelConfig(
                    model=NATIVE_MODEL,
                    provider="openai_responses",
                    capabilities=["web_search"],
                    max_output_tokens=1024,
                )
            ),
            timeout=30,
        )
        # The surface re-reads a changed catalog off the request path: wait until it has.
        deadline = time.monotonic() + 30
        while "web_search" not in tool_names(mesh, "warm-up", ""):
            assert time.monotonic() < deadline, "the surface never saw web_search"
            time.sleep(0.05)
        yield mesh


def surface(mesh: Mesh) -> surface_pb2_grpc.SurfaceServiceStub:
    return surface_pb2_grpc.SurfaceServiceStub(mesh._channel("surface"))


def search_tools(mesh: Mesh, conversation: str, model: str) -> dpb.DispatchToolCallResponse:
    return mesh.dispatcher.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(
                name="search_tools", input_json=json.dumps({"query": QUERY, "limit": 1})
            ),
            context=pb.CallContext(
                tenant_id="tenant-a",
                user_id="tester",
                conversation_id=conversation,
                model=model,
            ),
        ),
        timeout=60,
    )


def ok_data(response: dpb.DispatchToolCallResponse) -> dict[str, Any]:
    envelope = response.result.envelope
    assert envelope.WhichOneof("kind") == "ok", response.result.content
    return json.loads(envelope.ok.data_json)


def tool_names(mesh: Mesh, conversation: str, model: str) -> list[str]:
    response = surface(mesh).AssembleTools(
        spb.AssembleToolsRequest(tenant_id="tenant-a", conversation_id=conversation, model=model),
        timeout=30,
    )
    return [t.name for t in response.tools]


def test_search_tools_searches_the_surface_of_the_conversations_model(smesh: Mesh) -> None:
    # Without a model nothing is filtered: the floor's web_search is already available.
    unfiltered = ok_data(search_tools(smesh, "no-model", ""))
    assert unfiltered["already_available"] == ["web_search"] and unfiltered["paged_in"] == []
    # The model's floor has no web_search: its native web search replaces it.
    assert "web_search" not in tool_names(smesh, "native", NATIVE_MODEL)
    data = ok_data(search_tools(smesh, "native", NATIVE_MODEL))
    # Before: "Already available: web_search" -- a tool the model's array did not hold.
    assert "web_search" not in data["already_available"]
    assert data["paged_in"] == ["web_search"]
    # The model asked for it: a paged-in tool is never capability-filtered.
    assert "web_search" in tool_names(smesh, "native", NATIVE_MODEL)


def test_search_tools_for_a_model_without_a_config_is_an_err(smesh: Mesh) -> None:
    envelope = search_tools(smesh, "unknown-model", "no-such-model").result.envelope
    assert envelope.WhichOneof("kind") == "err"
    assert envelope.err.err_kind == "model_not_configured"


@pytest.mark.parametrize(("model", "reason"), [("m" * 129, "ID_TOO_LONG"), ("gpt\n", "ID_INVALID")])
def test_a_model_no_config_could_have_is_invalid_argument(
    smesh: Mesh, model: str, reason: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        search_tools(smesh, "bad-model", model)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(caught.value)
    assert error.reason == reason
    assert [f for f, _ in error.field_violations] == ["context.model"]


def test_toolmesh_call_sends_the_model_it_is_given(smesh: Mesh) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLMESH_", "OTEL_"))}
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "toolmesh"),
            "call",
            "search_tools",
            "--input",
            json.dumps({"query": QUERY, "limit": 1}),
            "--tenant",
            "tenant-a",
            "--conversation",
            "cli-model",
            "--model",
            NATIVE_MODEL,
            "--json",
            "--dispatcher",
            smesh.address("dispatcher"),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(json.loads(done.stdout)["result"]["envelope"]["ok"]["dataJson"])
    assert data["paged_in"] == ["web_search"]
