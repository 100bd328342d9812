"""An MCP server (the SDK's MCPServer, so it speaks the current protocol, where change events
travel only on a `subscriptions/listen` stream) whose inventory grows at runtime: `grow` adds a
tool and announces the change. Run: python -m tests.mcp_servers.changing_server [--http PORT]"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("changing", version="1.0")


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called `name` (it answers "<name> here") and announce the change."""

    def added() -> str:
        return f"{name} here"

    server.add_tool(added, name=name, description=f"The tool {name}, added at runtime.")
    await ctx.notify_tools_changed()
    return f"added {name}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
