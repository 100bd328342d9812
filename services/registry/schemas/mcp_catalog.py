"""Schemas of the MCP catalog tools: search the local catalog of MCP servers an admin maintains
(TOOLMESH_MCP_CATALOG) and install one of them through the mcp_bridge service."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "name": "search_mcp_marketplace",
        "description": (
            "Search the catalog of MCP servers this deployment allows installing (maintained by "
            "an admin; no network marketplace). Returns each match's name, description and "
            "transport. Install one with install_mcp_server."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Words to match in names and descriptions; empty lists all.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "description": "At most this many servers (default 10).",
                },
            },
            "additionalProperties": False,
        },
        "category": "mcp",
        "handler_path": "services.registry.tools.mcp_catalog.search_mcp_marketplace",
        "status_message": "Searching MCP servers",
        "large_output": False,
    },
    {
        "name": "install_mcp_server",
        "description": (
            "Connect an MCP server from the catalog (see search_mcp_marketplace) and register its "
            "tools as mcp_<connection>_<tool>. Only catalog entries can be installed."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The catalog entry's name.",
                },
                "connection_name": {
                    "type": "string",
                    "pattern": "^[a-zA-Z0-9_-]{1,40}$",
                    "description": "Connection name (default: the entry's name).",
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "category": "mcp",
        "handler_path": "services.registry.tools.mcp_catalog.install_mcp_server",
        "status_message": "Installing MCP server",
        "large_output": False,
    },
]
