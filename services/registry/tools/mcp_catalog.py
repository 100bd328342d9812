"""The MCP catalog tools. The catalog is a local JSON file an admin maintains
(TOOLMESH_MCP_CATALOG, default <data_dir>/mcp_catalog.json): a list of
`{"name", "description", "transport": "stdio" | "streamable_http", "command", "args", "env",
"url", "headers"}`. `search_mcp_marketplace` ranks its entries; `install_mcp_server` connects one
through the mcp_bridge service (only catalog entries: the model never supplies a command)."""

from __future__ import annotations

import asyncio
import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from services.registry.context import ToolContext
from shared.clients import open_channel, traced_call
from shared.contract import (
    Alternative,
    Err,
    HintException,
    Ok,
    ToolResult,
    envelope_to_tool_result,
    migrate_tool,
)
from shared.rpc_errors import from_rpc_error
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc

CONNECT_TIMEOUT_S = 120.0
_WORD = re.compile(r"[a-z0-9]+")
_TRANSPORTS = {"stdio": mpb.TRANSPORT_STDIO, "streamable_http": mpb.TRANSPORT_STREAMABLE_HTTP}


class CatalogError(ValueError):
    """The catalog file is missing or malformed."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    transport: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def load_catalog(path: Path) -> list[CatalogEntry]:
    """The catalog's entries; CatalogError naming the file and the first bad entry."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(
            f"no MCP catalog at {path} (an admin maintains it; set TOOLMESH_MCP_CATALOG)"
        ) from None
    except (OSError, ValueError) as exc:
        raise CatalogError(f"MCP catalog {path} is unreadable: {exc}") from None
    items = raw.get("servers") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise CatalogError(f"MCP catalog {path} must be a JSON list of servers")
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise CatalogError(f"MCP catalog {path}: entry {i} has no name")
        transport = item.get("transport", "stdio")
        if transport not in _TRANSPORTS:
            raise CatalogError(
                f"MCP catalog {path}: {item['name']!r} has transport {transport!r} "
                "(stdio or streamable_http)"
            )
        if transport == "stdio" and not item.get("command"):
            raise CatalogError(f"MCP catalog {path}: {item['name']!r} has no command")
        if transport == "streamable_http" and not item.get("url"):
            raise CatalogError(f"MCP catalog {path}: {item['name']!r} has no url")
        entries.append(
            CatalogEntry(
                name=item["name"],
                description=str(item.get("description", "")),
                transport=transport,
                command=str(item.get("command", "")),
                args=tuple(str(a) for a in item.get("args") or ()),
                env={str(k): str(v) for k, v in (item.get("env") or {}).items()},
                url=str(item.get("url", "")),
                headers={str(k): str(v) for k, v in (item.get("headers") or {}).items()},
            )
        )
    return entries


def _catalog_path(context: ToolContext) -> Path:
    settings = context.settings
    if settings is None or settings.mcp_catalog_path is None:
        raise CatalogError("no MCP catalog configured (set TOOLMESH_MCP_CATALOG)")
    return settings.mcp_catalog_path


def rank(entries: list[CatalogEntry], query: str) -> list[tuple[float, CatalogEntry]]:
    """Entries matching any query word, best first (name matches weigh double)."""
    words = _WORD.findall(query.lower())
    if not words:
        return [(1.0, e) for e in sorted(entries, key=lambda e: e.name)]
    scored = []
    for entry in entries:
        name_words = set(_WORD.findall(entry.name.lower()))
        text_words = set(_WORD.findall(entry.description.lower()))
        score = sum(2.0 if w in name_words else 1.0 if w in text_words else 0.0 for w in words)
        if score > 0:
            scored.append((score / (2 * len(words)), entry))
    scored.sort(key=lambda pair: (-pair[0], pair[1].name))
    return scored


async def search_mcp_marketplace(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    try:
        entries = await asyncio.to_thread(load_catalog, _catalog_path(context))
    except CatalogError as exc:
        return envelope_to_tool_result(Err(str(exc), err_kind="mcp_catalog_unavailable"))
    limit = int(inputs.get("limit") or 10)
    found = rank(entries, str(inputs.get("query") or ""))[:limit]
    data = [
        {
            "name": e.name,
            "description": e.description,
            "transport": e.transport,
            "score": round(score, 2),
        }
        for score, e in found
    ]
    return envelope_to_tool_result(Ok(rows=len(data), data=data))


migrate_tool(search_mcp_marketplace, "search_mcp_marketplace", is_tabular=False)


async def install_mcp_server(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
    try:
        entries = await asyncio.to_thread(load_catalog, _catalog_path(context))
    except CatalogError as exc:
        return envelope_to_tool_result(Err(str(exc), err_kind="mcp_catalog_unavailable"))
    name = str(inputs["name"])
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        names = [e.name for e in entries]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.3)
        raise HintException(
            "fetch",
            f"no MCP server {name!r} in the catalog; search_mcp_marketplace lists them",
            [
                Alternative(c, round(difflib.SequenceMatcher(None, name, c).ratio(), 2))
                for c in close
            ],
        )
    settings = context.settings
    address = settings.address("mcp_bridge") if settings is not None else ""
    if not address:
        return envelope_to_tool_result(
            Err("the mcp_bridge service is not configured", err_kind="service_not_configured")
        )
    connection = str(inputs.get("connection_name") or entry.name)
    request = mpb.ConnectRequest(
        server=mpb.ServerConfig(
            name=connection,
            transport=_TRANSPORTS[entry.transport],
            command=entry.command,
            args=list(entry.args),
            env=entry.env,
            url=entry.url,
            headers=entry.headers,
            tenant_id=context.tenant_id or "*",
        )
    )
    channel = open_channel(address)
    try:
        stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel)
        response = await traced_call(
            stub.Connect,
            request,
            span_name="toolmesh.mcp_bridge.v1.McpBridgeService/Connect",
            peer_service="mcp_bridge",
            timeout=CONNECT_TIMEOUT_S,
            tracing=settings.tracing if settings is not None else False,
        )
    except grpc.aio.AioRpcError as exc:  # not wrapped by traced_call on some paths
        err = from_rpc_error(exc)
        return envelope_to_tool_result(Err(err.message, err_kind=err.reason.lower()))
    except Exception as exc:  # noqa: BLE001 - ToolmeshError from traced_call: a tool failure
        reason = str(getattr(exc, "reason", type(exc).__name__))
        return envelope_to_tool_result(Err(str(exc), err_kind=reason.lower()))
    finally:
        await channel.close()
    return envelope_to_tool_result(
        Ok(
            rows=response.tools_discovered,
            data={
                "connection": connection,
                "tools_discovered": response.tools_discovered,
                "tool_names": list(response.tool_names),
                "renamed": list(response.renamed),
            },
        )
    )


migrate_tool(install_mcp_server, "install_mcp_server", is_tabular=False)
