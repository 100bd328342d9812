"""Schemas of internal system tools: callable through execute_tool, hidden from the model."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "name": "ping",
        "description": (
            "Health and latency probe: answers 'pong' with the input echoed back. Internal; "
            "used by health checks and benchmarks."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "echo": {"description": "Any JSON value to echo back."},
                "delay_ms": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 600000,
                    "description": "Sleep this many milliseconds before answering.",
                },
                "fail": {
                    "type": "string",
                    "enum": ["", "error", "hint", "raise"],
                    "description": "Answer with an Err result, a Hint, or raise (for tests).",
                },
                "export_text": {
                    "type": "string",
                    "maxLength": 1048576,
                    "description": (
                        "Write this text to ping.txt under the data dir and return it as an "
                        "export (for export tests)."
                    ),
                },
                "progress_steps": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                    "description": (
                        "Report progress this many times, spreading delay_ms between the "
                        "reports (for streaming tests)."
                    ),
                },
            },
            "additionalProperties": False,
        },
        "category": "internal",
        "handler_path": "services.registry.tools.internal.ping",
        "status_message": "Pinging",
        "large_output": False,
    },
    {
        "name": "compose_ping",
        "description": (
            "Calls ping through the registry with the same context and wraps its answer; "
            "exercises tool composition end to end. Internal."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"echo": {"description": "Value passed on to ping."}},
            "additionalProperties": False,
        },
        "category": "internal",
        "handler_path": "services.registry.tools.internal.compose_ping",
        "status_message": "Composing",
        "large_output": False,
    },
    {
        "name": "compose_llm",
        "description": (
            "Composes ping and call_llm through the registry and makes an LLM call of its own; "
            "exercises one trace with nested costs end to end. Internal."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 1, "description": "Asked twice."}
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        "category": "internal",
        "handler_path": "services.registry.tools.internal.compose_llm",
        "status_message": "Composing",
        "large_output": False,
    },
]
