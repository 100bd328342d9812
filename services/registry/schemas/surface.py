"""Schema of the "surface" system tool search_tools. Its handler lives in
services/registry/tools/surface.py and asks the surface service."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "name": "search_tools",
        "description": (
            "Find a tool you do not have yet. Describe what you want to do in plain words (e.g. "
            "'send an invoice to a customer', 'open a ticket in the issue tracker'); the best "
            "matching tools are added to your tool list from your next step on and stay there "
            "for the rest of the conversation. Returns the matches, best first, and which of "
            "them were added. Use it whenever none of your current tools fits the task."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 2000,
                    "description": "What you want to do, in your own words.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 20,
                    "default": 5,
                    "description": "How many matching tools to return and add (default 5).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "category": "surface",
        "handler_path": "services.registry.tools.surface.search_tools",
        "status_message": "Searching tools",
        "large_output": False,
    },
]
