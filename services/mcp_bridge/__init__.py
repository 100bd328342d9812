"""The mcp_bridge service: connections to external MCP servers (stdio and streamable HTTP), whose
tools it registers in the registry as `tool_type="mcp"` and whose calls it proxies."""
