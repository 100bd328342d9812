"""Handler of the "surface" system tool search_tools: asks the surface service
(SurfaceService.SearchTools) with the caller's context and the conversation's model, which ranks
the tools the caller may use and pages the best that are not on the model's surface yet into the
conversation's working set. Spec-only under the Uniform Tool Contract (`migrate_tool`, not
tabular)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from services.registry.context import ToolContext
from services.registry.servicer import context_to_pb
from shared.clients import open_channel, traced_call
from shared.contract import (
    Err,
    HintException,
    Ok,
    ToolResult,
    Warning,
    envelope_to_tool_result,
    migrate_tool,
)
from shared.errors import InvalidArgument, ToolmeshError
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc

SEARCH_TIMEOUT_S = 30.0

# One channel per (event loop, address): grpc.aio channels belong to the loop that made them.
_CHANNELS: dict[tuple[int, str], grpc.aio.Channel] = {}


def _stub(address: str) -> surface_pb2_grpc.SurfaceServiceStub:
    key = (id(asyncio.get_running_loop()), address)
    channel = _CHANNELS.get(key)
    if channel is None:
        channel = _CHANNELS[key] = open_channel(address)
    return surface_pb2_grpc.SurfaceServiceStub(channel)


async def search_tools(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    settings = context.settings
    address = settings.address("surface") if settings is not None else ""
    if not address:
        return envelope_to_tool_result(
            Err(
                "search_tools cannot run: the surface service is not configured "
                "(set TOOLMESH_SURFACE_ADDR)",
                err_kind="service_not_configured",
            )
        )
    request = spb.SearchToolsRequest(
        query=str(inputs.get("query") or ""),
        limit=int(inputs.get("limit") or 0),
        context=context_to_pb(context),
        # The surface composes the model's surface (capability filtering) to know what is on
        # it already and what the budget has room for.
        model=context.model,
    )
    try:
        response: spb.SearchToolsResponse = await traced_call(
            _stub(address).SearchTools,
            request,
            span_name="toolmesh.surface.v1.SurfaceService/SearchTools",
            peer_service="surface",
            timeout=SEARCH_TIMEOUT_S,
            tracing=settings.tracing if settings is not None else True,
        )
    except InvalidArgument as exc:
        fields = {f for f, _ in exc.field_violations}
        if fields & {"query", "limit"}:
            # The model's own input (a blank query, say): a correction it can make.
            raise HintException("schema", exc.message) from None
        return envelope_to_tool_result(
            Err(f"search_tools cannot run: {exc.message}", err_kind=exc.reason.lower())
        )
    except ToolmeshError as exc:
        return envelope_to_tool_result(
            Err(f"search_tools failed: {exc.message}", err_kind=exc.reason.lower())
        )
    matches = [
        {"name": m.name, "score": round(m.score, 3), "description": m.description}
        for m in response.matches
    ]
    paged = list(response.paged_in)
    already = list(response.already_available)
    if not matches:
        summary = "No tool matches that description; rephrase it with other words."
    else:
        parts = []
        if paged:
            parts.append(f"Added to your tools from the next step on: {', '.join(paged)}.")
        if already:
            parts.append(f"Already available: {', '.join(already)}.")
        summary = " ".join(parts) or "No new tool was added."
    warnings = [Warning("surface_budget", response.refusal)] if response.refusal else []
    return envelope_to_tool_result(
        Ok(
            data={
                "summary": summary,
                "paged_in": paged,
                "already_available": already,
                "matches": matches,
            },
            warnings=warnings,
        )
    )


migrate_tool(search_tools, "search_tools", is_tabular=False)
