"""ToolSink over the registry's gRPC API: the bridge registers and soft-deletes its tools with
UpsertTools / DeleteTools and reads them back with ListTools, so tool rows have one owner. Its
UpsertTools is an MCP listing (`mcp_listing`): the registry merges it into the stored rows in
one transaction, keeping what an administrator set there (see ToolSink.upsert)."""

from __future__ import annotations

from collections.abc import Sequence

from services.mcp_bridge.model import StoredTool, ToolRegistration
from shared import convert
from shared.clients import traced_call
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

_SERVICE = "toolmesh.registry.v1.RegistryService"
_TIMEOUT_S = 30.0


def _stored(t: pb.ToolDefinition) -> StoredTool:
    return StoredTool(
        name=t.name,
        created_by=t.created_by,
        status=convert.STATUSES.get(t.status, "draft"),
        implementation=t.implementation,
        definition_hash=t.definition_hash or None,
        deleted=t.HasField("deleted_at"),
        enabled=t.enabled,
    )


class GrpcToolSink:
    def __init__(self, stub: registry_pb2_grpc.RegistryServiceStub, *, tracing: bool) -> None:
        self._stub = stub
        self._tracing = tracing

    async def _list(self, request: rpb.ListToolsRequest) -> list[StoredTool]:
        response = await traced_call(
            self._stub.ListTools,
            request,
            span_name=f"{_SERVICE}/ListTools",
            peer_service="registry",
            timeout=_TIMEOUT_S,
            tracing=self._tracing,
        )
        return [_stored(t) for t in response.tools]

    async def connection_tools(self, created_by: str) -> list[StoredTool]:
        return await self._list(
            rpb.ListToolsRequest(
                created_by=created_by, tool_type=pb.TOOL_TYPE_MCP, include_deleted=True
            )
        )

    async def live_tools(self) -> list[StoredTool]:
        return await self._list(rpb.ListToolsRequest())

    async def upsert(self, tools: Sequence[ToolRegistration]) -> None:
        await traced_call(
            self._stub.UpsertTools,
            rpb.UpsertToolsRequest(
                tools=[
                    pb.ToolDefinition(
                        name=t.name,
                        description=t.description,
                        input_schema_json=convert.dumps(t.input_schema),
                        implementation=t.implementation,
                        tool_type=pb.TOOL_TYPE_MCP,
                        status=convert.STATUS_VALUES[t.status],
                        enabled=t.enabled,
                        category="mcp",
                        tenant_id=t.tenant_id,
                        created_by=t.created_by,
                        definition_hash=t.definition_hash,
                        required_capabilities=list(t.required_capabilities),
                        annotations=convert.annotations_to_pb(
                            t.annotations.to_json() if t.annotations is not None else None
                        ),
                    )
                    for t in tools
                ],
                mcp_listing=True,
            ),
            span_name=f"{_SERVICE}/UpsertTools",
            peer_service="registry",
            timeout=_TIMEOUT_S,
            tracing=self._tracing,
        )

    async def delete(self, names: Sequence[str], created_by: str) -> list[str]:
        response = await traced_call(
            self._stub.DeleteTools,
            rpb.DeleteToolsRequest(names=list(names), created_by=created_by),
            span_name=f"{_SERVICE}/DeleteTools",
            peer_service="registry",
            timeout=_TIMEOUT_S,
            tracing=self._tracing,
        )
        return list(response.deleted)
