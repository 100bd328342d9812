"""The registry's route for tool_type="custom": a custom tool's code never runs in the registry;
it goes to sandbox.Execute over gRPC with the caller's context, the conversation's default
dataset (bound to `df`) and the tool's timeout. Cancellation propagates: a cancelled call
cancels the RPC, and the sandbox kills the worker."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from services.registry.context import ToolContext
from services.registry.model import ToolDef
from services.registry.servicer import context_to_pb
from shared import convert
from shared.arrow_ipc import dataframe_to_ipc
from shared.clients import open_channel, traced_call
from shared.contract import ToolResult
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)


def default_dataset(context: ToolContext) -> pd.DataFrame | None:
    """The conversation's default dataset: the one named by the context's dataset_id, else the
    conversation's only dataset, else the first by name; None when it has none. Blocking."""
    if context.datasets is None or not context.conversation_id:
        return None
    try:
        if context.dataset_id:
            return context.load_dataset(context.dataset_id)
        infos = context.list_datasets()
        return context.load_dataset(infos[0].name) if infos else None
    except KeyError:
        return None


class SandboxRoute:
    """ToolExecutor for custom tools: sandbox.Execute."""

    def __init__(self, address: str, *, tracing: bool = True) -> None:
        self._address = address
        self._tracing = tracing
        self._stub: sandbox_pb2_grpc.SandboxServiceStub | None = None

    async def execute(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        if self._stub is None:  # opened on the event loop of the first call
            self._stub = sandbox_pb2_grpc.SandboxServiceStub(open_channel(self._address))
        stub = self._stub
        df = await context.db("the conversation's dataset read", default_dataset, context)
        request = spb.ExecuteRequest(
            tool_name=tool.name,
            code=tool.implementation,
            input_json=convert.dumps(inputs),
            context=context_to_pb(context),
            limits=spb.ExecutionLimits(wall_seconds=tool.timeout_seconds or 0.0),
        )
        if df is not None:
            request.df.CopyFrom(pb.Dataset(name="df", arrow_ipc=dataframe_to_ipc(df), rows=len(df)))
        response = await traced_call(
            stub.Execute,
            request,
            span_name="toolmesh.sandbox.v1.SandboxService/Execute",
            peer_service="sandbox",
            tracing=self._tracing,
        )
        return convert.tool_result_from_pb(response.result)
