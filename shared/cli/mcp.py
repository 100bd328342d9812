"""The `toolmesh mcp connect|disconnect|reconnect|list` commands: MCP server connections of the
mcp_bridge service. `add_subcommands(sub)` adds them to the `toolmesh` parser; each command's func
is `(args, settings) -> exit code` (0 ok, 2 an RPC failure or bad arguments)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc
from google.protobuf import json_format

from shared.cli import EXIT_RPC_ERROR, service_channel
from shared.cli.render import echo, echo_json, rpc_failure
from shared.config import Settings
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc

EXIT_OK = 0
# Connecting starts a server process or opens an HTTP session and lists its tools.
CONNECT_TIMEOUT_S = 120.0
STATE_NAMES = {
    mpb.CONNECTION_STATE_CONNECTED: "connected",
    mpb.CONNECTION_STATE_CONNECTING: "connecting",
    mpb.CONNECTION_STATE_FAILED: "failed",
    mpb.CONNECTION_STATE_DISCONNECTED: "disconnected",
}


def _address(args: argparse.Namespace, settings: Settings) -> str:
    return str(args.bridge or settings.address("mcp_bridge"))


def _rpc(args: argparse.Namespace, settings: Settings, method: str, request: Any) -> Any:
    with service_channel("mcp_bridge", _address(args, settings)) as channel:
        stub = mcp_bridge_pb2_grpc.McpBridgeServiceStub(channel)
        return getattr(stub, method)(request, timeout=CONNECT_TIMEOUT_S)


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} {item!r} must be KEY=VALUE")
        out[key] = value
    return out


def _config(args: argparse.Namespace) -> mpb.ServerConfig:
    if bool(args.command) == bool(args.url):
        raise ValueError("give exactly one of --command (stdio) or --url (streamable HTTP)")
    return mpb.ServerConfig(
        name=args.name,
        transport=mpb.TRANSPORT_STDIO if args.command else mpb.TRANSPORT_STREAMABLE_HTTP,
        command=args.command or "",
        args=list(args.arg or []),
        env=_pairs(args.env, "--env"),
        url=args.url or "",
        headers=_pairs(args.header, "--header"),
        tenant_id=args.tenant,
    )


def _print(message: Any, as_json: bool, lines: list[str]) -> None:
    if as_json:
        echo_json(json_format.MessageToJson(message))
    else:
        echo("\n".join(lines))


def cmd_connect(args: argparse.Namespace, settings: Settings) -> int:
    try:
        request = mpb.ConnectRequest(server=_config(args))
    except ValueError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    try:
        response = _rpc(args, settings, "Connect", request)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "mcp_bridge", _address(args, settings))
    lines = [f"connected {args.name}: {response.tools_discovered} tools"]
    lines += [f"  {name}" for name in response.tool_names]
    lines += [f"  renamed {r}" for r in response.renamed]
    lines += [f"  held (definition changed; approve it): {h}" for h in response.held]
    _print(response, args.json, lines)
    return EXIT_OK


def cmd_disconnect(args: argparse.Namespace, settings: Settings) -> int:
    try:
        response = _rpc(args, settings, "Disconnect", mpb.DisconnectRequest(name=args.name))
    except grpc.RpcError as exc:
        return rpc_failure(exc, "mcp_bridge", _address(args, settings))
    lines = [f"disconnected {args.name}; removed {len(response.removed_tools)} tools"]
    _print(response, args.json, lines)
    return EXIT_OK


def cmd_reconnect(args: argparse.Namespace, settings: Settings) -> int:
    request = mpb.ReconnectRequest(name=args.name)
    try:
        if args.command or args.url:
            request.server.CopyFrom(_config(args))
    except ValueError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    try:
        response = _rpc(args, settings, "Reconnect", request)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "mcp_bridge", _address(args, settings))
    lines = [f"reconnected {args.name}: {len(response.tool_names)} tools"]
    lines += [f"  added   {n}" for n in response.added]
    lines += [f"  removed {n}" for n in response.removed]
    lines += [f"  changed {n} (held in testing until approved)" for n in response.changed]
    _print(response, args.json, lines)
    return EXIT_OK


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    try:
        response = _rpc(args, settings, "ListConnections", mpb.ListConnectionsRequest())
    except grpc.RpcError as exc:
        return rpc_failure(exc, "mcp_bridge", _address(args, settings))
    if args.json:
        echo_json(json.dumps(json.loads(json_format.MessageToJson(response)), indent=2))
        return EXIT_OK
    echo(f"{'name':<20} {'state':<12} {'server':<32} {'protocol':<12} tools")
    for c in response.connections:
        server = f"{c.server_name} {c.server_version}".strip()
        echo(
            f"{c.server.name:<20} {STATE_NAMES.get(c.state, '?'):<12} {server:<32} "
            f"{c.protocol_version:<12} {len(c.tool_names)}"
        )
        if c.last_error:
            echo(f"  last error: {c.last_error}")
        if c.tool_list_changes:
            change = c.last_tool_change
            echo(
                f"  tool list changes announced by the server: {c.tool_list_changes} (the last: "
                f"{len(change.added)} added, {len(change.removed)} removed, "
                f"{len(change.changed)} changed and held in testing until approved)"
            )
    return EXIT_OK


def _server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--command", help="stdio: the server command to run")
    p.add_argument(
        "--arg", action="append", help="stdio: an argument (repeatable; --arg=-x for a dash)"
    )
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="stdio: env (repeatable)")
    p.add_argument("--url", help="streamable HTTP: the endpoint URL")
    p.add_argument(
        "--header", action="append", metavar="KEY=VALUE", help="HTTP: header (repeatable)"
    )
    p.add_argument("--tenant", default="*", help="tenant the tools belong to ('*': all)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bridge", help="mcp_bridge address (default TOOLMESH_MCP_BRIDGE_ADDR)")
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")


def add_subcommands(sub: Any) -> None:
    """Add `mcp` (connect | disconnect | reconnect | list) to the `toolmesh` subparsers."""
    mcp = sub.add_parser("mcp", help="MCP server connections: connect, disconnect, reconnect, list")
    actions = mcp.add_subparsers(dest="mcp_command", required=True)

    p = actions.add_parser("connect", help="connect an MCP server and register its tools")
    p.add_argument("name", help="connection name; tools are registered as mcp_<name>_<tool>")
    _server_options(p)
    _common(p)
    p.set_defaults(func=cmd_connect)

    p = actions.add_parser("disconnect", help="close a connection and remove its tools")
    p.add_argument("name")
    _common(p)
    p.set_defaults(func=cmd_disconnect)

    p = actions.add_parser("reconnect", help="re-list a server's tools and report changes")
    p.add_argument("name")
    _server_options(p)
    _common(p)
    p.set_defaults(func=cmd_reconnect)

    p = actions.add_parser("list", help="connections with state, server info and protocol")
    _common(p)
    p.set_defaults(func=cmd_list)
