"""An MCP server over streamable HTTP (the SDK's MCPServer) whose `probe` tool answers with the
HTTP headers and the `_meta` its request arrived with, so tests can check the W3C trace headers
and that baggage never leaves the mesh, and whose `sized` tool answers with `kb` KiB of text.
Run: python -m tests.mcp_servers.http_probe_server PORT"""

from __future__ import annotations

import json
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("http-probe", version="1.0")


@server.tool()
def probe(ctx: Context) -> str:
    """The request's HTTP headers and _meta, as JSON."""
    meta = ctx.request_context.meta
    meta_dict = dict(meta) if meta else {}
    headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
    return json.dumps({"headers": headers, "meta": meta_dict}, default=str)


@server.tool()
def sized(kb: int) -> str:
    """`kb` KiB of text."""
    return "z" * (kb * 1024)


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
